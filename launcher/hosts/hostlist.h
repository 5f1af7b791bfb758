#pragma once
// The launcher's name for the Slurm host-list parser, whose one home is ddp/base/detail/hostlist.h (the
// library reads SLURM_JOB_NODELIST too, for a direct srun launch).
#include "ddp/base/detail/hostlist.h"

namespace ddp::launcher {
using ddp::detail::expand_hostlist;
}  // namespace ddp::launcher
