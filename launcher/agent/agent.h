#pragma once
// The node agent: one loop for every kind of job (See Note [One node agent] in launcher/agent/agent.cpp).
// The agent decides (rendezvous, start, monitor, recover); the supervisor executes one round's
// worker group (launcher/agent/supervisor.h); a RecoveryPolicy says what a round's end leads to.
#include <memory>

#include "ddp/base/worker_variables.h"
#include "launcher/config/config.h"
#include "launcher/channel/job_channel.h"
#include "launcher/rendezvous/rendezvous.h"
#include "launcher/agent/plan.h"
#include "launcher/agent/supervisor.h"

namespace ddp::launcher::agent {

// One rendezvous round, as this node sees it.
struct AgentRound {
  // The rendezvous round: TORCHELASTIC_RESTART_COUNT of its workers in an elastic job; 0 in a
  // fixed-size job, whose restarts are the supervisor's attempts of its one round.
  int number = 0;
  bool elastic = false;  // the start line names the round
  rendezvous::NodeAssignment node;
  std::unique_ptr<channel::JobChannel> channel;  // nullptr with one node
  std::string start_note;               // what the start line adds (live: a lost host stops nothing)
};

// What every policy plans its workers from (all of it outlives the policy).
struct AgentContext {
  const config::LaunchConfig& config;
  const LocalWorkers& local;
  const RunContext& run;
};

// What the agent does at a round's start and end: how it is supervised, and whether a new round
// follows. One implementation per --recovery and membership kind (make_recovery_policy).
class RecoveryPolicy {
 public:
  virtual ~RecoveryPolicy() = default;
  // The rendezvous: this node's next round, its channel open. Throws ddp::TimeoutError (a round
  // that cannot form) or UsageError (a port in use) with one line.
  virtual AgentRound next_round() = 0;
  // Sets what this round's supervision needs besides the agent's own options (restarts, the
  // membership poll, the live worker restart) and returns the factory of its workers.
  virtual GroupFactory supervise_round(const AgentRound& round, SupervisorOptions& options) = 0;
  // After the round's group ended: true when a new round follows (result then says nothing).
  virtual bool next_round_follows(AgentRound& round, SupervisorResult& result) = 0;
  // The policy's rendezvous: the agent shuts it down at the end, once the round's channel closed.
  virtual rendezvous::RendezvousHandler& rendezvous() = 0;
};

// What the policies share: their context, its parts by name.
class PolicyWithContext : public RecoveryPolicy {
 protected:
  explicit PolicyWithContext(const AgentContext& context) : context_(context) {}
  AgentContext context_;
  const config::LaunchConfig& config_ = context_.config;
  const LocalWorkers& local_ = context_.local;
  const RunContext& run_ = context_.run;
  const std::string& host_name_ = context_.run.host_name;
};

// The policy the flags ask for: the whole group restarted (fixed size, coordinated across hosts:
// See Note [Coordinated restarts]), a new membership round (--nnodes MIN:MAX: See Note [Elastic
// rounds]), or live recovery (--recovery live: See Note [Live recovery with ddp_launch]).
std::unique_ptr<RecoveryPolicy> make_recovery_policy(const AgentContext& context);

// The agent's loop: rounds until one ends the job; the launcher's exit code. `run` is complete but
// for the agent socket, which the agent opens when heartbeats are asked for.
int run_agent(const config::LaunchConfig& config, const EnvironmentSnapshot& env, const LocalWorkers& local, RunContext& run);

}  // namespace ddp::launcher::agent
