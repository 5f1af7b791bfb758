#pragma once
// A node of an elastic job with --recovery live: one rendezvous round, then the workers recover from
// a lost host in place (ddp::FaultTolerant). See Note [Live recovery with ddp_launch] in
// launcher/live_launch.cpp.
#include <string>

#include "launcher/config.h"
#include "launcher/plan.h"
#include "launcher/supervisor.h"

namespace ddp::launcher {

// The job's keys in the rendezvous store (DDP_LIVE_PREFIX): "ddp/live/<rdzv_id>" (keys under
// "ddp/live/<rdzv_id>/").
std::string live_store_prefix(const LaunchConfig& config);

// Joins the job's first round, then supervises this node's workers until they succeed, restarts
// (of a worker that died here: it comes back as a joiner) are used up, or the launcher is signalled.
// A lost host elsewhere stops nothing here.
SupervisorResult run_live(const LaunchConfig& config, const LocalWorkers& local, const RunContext& run,
                          const SupervisorOptions& base);

}  // namespace ddp::launcher
