#pragma once
// A node of an elastic job (--nnodes MIN:MAX): rounds of membership, each one supervised like a
// fixed job, a new round at every membership change. See Note [Elastic rounds] in
// launcher/rdzv_rounds.cpp.
#include "launcher/config.h"
#include "launcher/plan.h"
#include "launcher/supervisor.h"

namespace ddp::launcher {

// Runs rounds until this node's workers succeed, --max_restarts is used up, the launcher is
// signalled, or a round cannot form (ddp::TimeoutError with one line). `base` holds everything
// but the round's link, membership check and restarts.
SupervisorResult run_elastic(const LaunchConfig& config, const LocalWorkers& local, const RunContext& run,
                             const SupervisorOptions& base);

}  // namespace ddp::launcher
