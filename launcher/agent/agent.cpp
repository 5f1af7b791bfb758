#include "launcher/agent/agent.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <spdlog/spdlog.h>

#include "launcher/observe/agent_socket.h"
#include "launcher/agent/elastic_rounds.h"
#include "launcher/agent/live_recovery.h"
#include "launcher/observe/metrics_server.h"
#include "launcher/observe/progress_board.h"
#include "launcher/process/spawn.h"
#include "launcher/rendezvous/rendezvous.h"

// Note [One node agent]
// ~~~~~~~~~~~~~~~~~~~~~
// Every kind of job runs the same loop, in the shape of torchrun's SimpleElasticAgent._invoke_run:
// rendezvous (RecoveryPolicy::next_round), start the group and monitor it (supervise: the attempt's
// state machine, one process primitive), and at the round's end ask the policy what follows
// (next_round_follows). What differs between the kinds is only that answer:
//   - GroupRestart (a fixed node count: one node, static, c10d): one rendezvous round; a failure
//     restarts the whole group, on every host together (the supervisor's attempts over the job
//     channel: See Note [Coordinated restarts] in launcher/channel/job_channel.cpp);
//   - ElasticRounds (--nnodes MIN:MAX, --recovery restart): a failure, a lost host or a newcomer
//     ends the round, and the survivors join the next one (See Note [Elastic rounds] in
//     launcher/rendezvous/rounds.cpp);
//   - LiveRecovery (--recovery live): one round; a dead worker is restarted alone, a lost host or a
//     newcomer stops nothing (See Note [Live recovery with ddp_launch] in launcher/agent/live_recovery.cpp).
// What the agent itself owns is the same in every kind, so every feature works in every mode:
// heartbeats and the hang watchdog, /metrics, the start line, the end of the run. A policy owns its
// rendezvous and its channels (they live as long as it does).

namespace ddp::launcher::agent {
namespace {

// A fixed-size job: one rendezvous, the whole group restarted (coordinated across hosts).
class GroupRestart : public PolicyWithContext {
 public:
  explicit GroupRestart(const AgentContext& context)
      : PolicyWithContext(context), rendezvous_(rendezvous::make_rendezvous_handler(config_, local_.nproc)) {}

  AgentRound next_round() override {
    if (!config_.rdzv_host.empty()) {
      spdlog::info("rendezvous '{}' at {}:{}: waiting for {} nodes (timeout {} s)", config_.rdzv_id, config_.rdzv_host,
                   config_.rdzv_port, config_.nnodes, config_.rdzv_timeout_s);
    }
    AgentRound round;
    round.node = rendezvous_->next_rendezvous(-1, 0).node;
    // A static job's workers' store port comes with the coordinator's welcome (See Note [One port per job]).
    round.channel = channel::open_job_channel(config_, round.node, local_.nproc, host_name_, rendezvous_->directory(),
                                     "job_channel");
    if (round.channel) round.node.master_port = round.channel->workers_store_port(config_.rdzv_timeout_s);
    return round;
  }

  GroupFactory supervise_round(const AgentRound& round, SupervisorOptions&) override {
    return [this, node = round.node](int attempt) { return prepare_attempt(config_, node, local_, run_, attempt); };
  }

  bool next_round_follows(AgentRound& round, SupervisorResult& result) override {
    if (round.channel) round.channel->set_job_succeeded(result.exit_code == 0);
    return false;
  }

  rendezvous::RendezvousHandler& rendezvous() override { return *rendezvous_; }

 private:
  std::unique_ptr<rendezvous::RendezvousHandler> rendezvous_;
};

// What the flags say about supervision, for every round.
SupervisorOptions supervisor_options(const config::LaunchConfig& c, const std::string& host_name) {
  SupervisorOptions options;
  options.program_path = c.program_path;
  options.program_args = c.program_args;
  options.monitor_interval_s = c.monitor_interval_s;
  options.shutdown_grace_s = c.shutdown_grace_s;
  options.max_restarts = c.max_restarts;
  options.host_name = host_name;
  options.forwarded_signals = c.forwarded_signals;
  options.duplicate_stdout_filters = c.duplicate_stdout_filters;
  options.collapse_window_s = c.collapse_window_s;
  options.duplicate_stderr_filters = c.duplicate_stderr_filters;
  options.round_timeout_s = c.rdzv_timeout_s;
  options.hang_timeout_s = c.hang_timeout_s;
  options.replace_stragglers = c.replace_stragglers;
  return options;
}

// Note [SIGTERM after the workers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// SIGTERM asks a launcher to stop its workers. Once they are stopped, the launcher only finishes
// (its summary, the job channel's goodbye, node 0's bounded linger for the others) and must report
// its exit code rather than die of the signal:
// - --watch_stdin: another host's failure may have stopped the workers first; ssh would turn a
//   death by signal into exit code 255 and the summary would be lost.
// - Slurm (`srun --kill-on-bad-exit`, scripts/ddp_sbatch_example.sh): on SIGUSR1 every launcher
//   exits 138, and srun takes the first one's 138 for a bad exit and terminates the step (SIGTERM),
//   reaching the others while they finish; one killed by it made srun exit 143 instead of 138, so
//   the job failed instead of requeueing itself (hosts.slurm_cluster, under load).
// Every wait after this point is bounded, and SIGKILL (Slurm's, after KillWait) still ends it.
// The agent holds the round's SignalPipe until SIGTERM is ignored (SignalPipe::ignore): when the
// supervisor's pipe restored the default action first, a SIGTERM in between killed the launcher.
// --watch_stdin's SIGTERM came just then (hosts.ssh_stop, in CI): host0, stopped by the job
// channel, got the EOF of its stdin as its workers ended; it died, ssh exited 255 and its run
// folder was left. A signal that comes while an elastic round's end is settled ends the job, as
// one during the round does.
int finish_run(const SupervisorResult& result, const std::string& host_name, process::SignalPipe& signals) {
  signals.ignore(SIGTERM);
  if (result.exit_code != 0) std::fputs(format_failure_summary(result, host_name).c_str(), stderr);
  return result.exit_code;
}

// Whether a stop signal came after the round's group ended (See Note [SIGTERM after the workers]).
bool signalled_between_rounds(process::SignalPipe& signals, SupervisorResult& result) {
  for (int sig : signals.drain()) {
    if (sig == SIGCHLD) continue;
    spdlog::warn("received {}: not joining the next round", process::signal_name(sig));
    result.launcher_signal = sig;
    result.exit_code = 128 + sig;
    return true;
  }
  return false;
}

}  // namespace

std::unique_ptr<RecoveryPolicy> make_recovery_policy(const AgentContext& context) {
  if (!context.config.elastic) return std::make_unique<GroupRestart>(context);
  if (context.config.recovery == config::Recovery::kLive) return make_live_recovery(context);
  return make_elastic_rounds(context);
}

int run_agent(const config::LaunchConfig& c, const EnvironmentSnapshot& env, const LocalWorkers& local, RunContext& run) {
  const std::string& host_name = run.host_name;
  // Heartbeats and metrics (docs/observability.md): only when asked for, so that by default no
  // socket is opened and workers send nothing. Bound before the rendezvous: a port in use fails
  // before other nodes wait.
  std::unique_ptr<observe::AgentSocket> agent;
  const auto stragglers = c.stragglers ? std::optional<observe::StragglerOptions>({c.straggler_factor, c.straggler_window})
                                      : std::nullopt;
  observe::ProgressBoard board(c.node_rank.value_or(0), c.nnodes * local.nproc, stragglers);
  std::unique_ptr<observe::MetricsServer> metrics;
  if (c.hang_timeout_s > 0 || c.metrics_port > 0 || c.stragglers) agent = observe::AgentSocket::open(env.get("TMPDIR").value_or("/tmp"));
  // /healthz: a supervision loop that has not turned for 10 passes (at least 10 s) is stuck.
  if (c.metrics_port > 0) {
    metrics = std::make_unique<observe::MetricsServer>(c.metrics_addr, c.metrics_port, board,
                                              std::max(10.0, 10 * c.monitor_interval_s));
  }
  if (agent) run.agent_socket = agent->path();

  const std::unique_ptr<RecoveryPolicy> policy = make_recovery_policy({c, local, run});
  SupervisorOptions base = supervisor_options(c, host_name);
  base.agent = agent.get();
  base.progress = agent ? &board : nullptr;
  while (true) {
    AgentRound round = policy->next_round();
    const rendezvous::NodeAssignment& node = round.node;
    board.set_membership(node.node_rank, node.nnodes * local.nproc);
    spdlog::info("{}starting {} workers (ranks {}..{} of {}){} on node {} of {}, master {}:{}, run id {}{}",
                 round.elastic ? ddp::str("round ", round.number, ": ") : std::string(), local.nproc,
                 global_rank(node, 0), global_rank(node, local.nproc - 1), node.nnodes * local.nproc,
                 local.spares > 0 ? ddp::str(" and ", local.spares, " spare(s)") : std::string(), node.node_rank,
                 node.nnodes, node.master_addr, node.master_port, node.run_id, round.start_note);
    SupervisorOptions options = base;
    options.link = round.channel ? round.channel->link() : nullptr;
    const GroupFactory make_group = policy->supervise_round(round, options);
    process::SignalPipe signals(options.forwarded_signals);  // See Note [SIGTERM after the workers]
    SupervisorResult result = supervise(options, signals, make_group);
    if (!policy->next_round_follows(round, result) || signalled_between_rounds(signals, result)) {
      const int exit_code = finish_run(result, host_name, signals);
      round.channel.reset();  // the other launchers told, and waited for (bounded)
      policy->rendezvous().shutdown();
      return exit_code;
    }
  }
}

}  // namespace ddp::launcher::agent
