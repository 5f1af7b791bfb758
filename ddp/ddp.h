#pragma once
// The whole public API in one include: `#include <ddp/ddp.h>` (or "ddp/ddp.h").
//   process groups      ddp::init_process_group, ddp::ProcessGroup          ddp/process_group.h
//   data parallelism    ddp::DistributedDataParallel, ddp::DdpOptions       ddp/distributed_data_parallel.h
//                       ddp::DataParallel, ddp::SyncBatchNorm, comm hooks
//   data                ddp::DistributedSampler (= ddp::samplers::...)      samplers/distributed_sampler.h
//                       re-sharding at a new world size                    samplers/reshard.h
//   checkpoints         ddp::save_checkpoint, ddp::load_checkpoint, ...     ddp/checkpoint.h
//   a worker's main     ddp::run_main (optional: see Note [Uncaught exceptions in a worker])
//   progress, logging   ddp::ProgressReporter, ddp::Logger, ddp::version()
// The per-concept headers stay includable on their own.
#include "ddp/agent_channel.h"
#include "ddp/base/error.h"
#include "ddp/checkpoint.h"
#include "ddp/comm_hooks.h"
#include "ddp/data_parallel.h"
#include "ddp/ddp_stats.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/fault_tolerant.h"
#include "ddp/log.h"
#include "ddp/process_group.h"
#include "ddp/run_main.h"
#include "ddp/sync_batch_norm.h"
#include "ddp/version.h"
#include "samplers/distributed_sampler.h"
#include "samplers/reshard.h"

namespace ddp {

// The sampler under the names Python users know (torch.utils.data.distributed.DistributedSampler).
using samplers::DistributedSampler;
using samplers::DistributedSamplerOptions;
using samplers::SamplerState;

}  // namespace ddp
