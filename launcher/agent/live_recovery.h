#pragma once
// A node of an elastic job with --recovery live: one rendezvous round, then the workers recover from
// a lost host in place (ddp::FaultTolerant). See Note [Live recovery with ddp_launch] in
// launcher/agent/live_recovery.cpp; the agent's loop: Note [One node agent] in launcher/agent/agent.cpp.
#include <memory>
#include <string>

#include "launcher/agent/agent.h"

namespace ddp::launcher::agent {

// The job's keys in the rendezvous store (DDP_LIVE_PREFIX): "ddp/live/<rdzv_id>" (keys under
// "ddp/live/<rdzv_id>/").
std::string live_store_prefix(const config::LaunchConfig& config);

// Joins the job's first round, then this node's workers run until they succeed, restarts (of a
// worker that died here: it comes back alone, as a joiner) are used up, or the launcher is
// signalled. A lost host elsewhere stops nothing here.
std::unique_ptr<RecoveryPolicy> make_live_recovery(const AgentContext& context);

}  // namespace ddp::launcher::agent
