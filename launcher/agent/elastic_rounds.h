#pragma once
// A node of an elastic job (--nnodes MIN:MAX, --recovery restart): rounds of membership, each one
// supervised like a fixed job, a new round at every membership change. See Note [Elastic rounds]
// in launcher/rendezvous/rounds.cpp; the agent's loop: Note [One node agent] in launcher/agent/agent.cpp.
#include <memory>
#include <string>

#include "launcher/agent/agent.h"

namespace ddp::launcher::agent {

// Rounds until this node's workers succeed, --max_restarts is used up, the launcher is signalled,
// or a round cannot form (ddp::TimeoutError with one line).
std::unique_ptr<RecoveryPolicy> make_elastic_rounds(const AgentContext& context);

}  // namespace ddp::launcher::agent
