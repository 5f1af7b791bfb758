#pragma once
// The process supervisor: starts the local worker group, pipes its output, forwards signals,
// stops the group on the first failure, restarts it, reaps every child. See Note [Supervision] in
// launcher/agent/attempt.cpp; the pieces: worker_process.h (spawning and I/O), attempt.h (one attempt's
// state machine), failure_report.h (root cause and summary).
#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/failure_report.h"
#include "launcher/agent/plan.h"

namespace ddp::launcher::observe {
class AgentSocket;
class ProgressBoard;
class StragglerPeers;
}  // namespace ddp::launcher::observe
namespace ddp::launcher::channel {
class JobLink;
}  // namespace ddp::launcher::channel

namespace ddp::launcher::agent {

// One attempt's workers, built by the caller for attempt k (restart count k); the caller also makes
// their folders (see plan_workers and see Note [Log folders]).
using GroupFactory = std::function<std::vector<process::WorkerLaunch>(int attempt)>;

struct SupervisorOptions {
  std::string program_path;               // resolved executable
  std::vector<std::string> program_args;  // argv, verbatim (argv[0] as the user gave it)
  double monitor_interval_s = 0.1;
  double shutdown_grace_s = 10;
  int max_restarts = 0;
  std::string host_name;
  // Heartbeats (docs/observability.md): read from `agent` into `progress`; with hang_timeout_s > 0,
  // a rank silent for longer is stopped as a failure (See Note [Hang watchdog]).
  observe::AgentSocket* agent = nullptr;
  observe::ProgressBoard* progress = nullptr;
  double hang_timeout_s = 0;
  // --straggler_action replace: this node leaves the job when one of its ranks is named a straggler
  // (See Note [Replacing a straggler] in launcher/agent/attempt.cpp).
  bool replace_stragglers = false;
  // --straggler_action in a live job: the other launchers' timings (See Note [Stragglers in a live
  // job] in launcher/channel/live_watch.cpp); null: the job channel's (`link`), or none.
  observe::StragglerPeers* straggler_peers = nullptr;
  // Signals forwarded to the workers, each then stopping the job (--signals_to_handle); empty:
  // kForwardedSignals (SIGINT, SIGTERM, SIGHUP, SIGQUIT).
  std::vector<int> forwarded_signals;
  // --duplicate_stdout_filters / --duplicate_stderr_filters (see WorkerLaunch::filtered_stdout_log).
  std::vector<std::string> duplicate_stdout_filters;
  double collapse_window_s = 0;  // --collapse_lines (See Note [Collapsed lines]); 0: off
  std::vector<std::string> duplicate_stderr_filters;
  // See Note [Unreapable workers] in launcher/agent/attempt.cpp: how long after SIGKILL a worker may stay
  // unreaped before the launcher reports it and gives up on it.
  double reap_timeout_s = 10;
  // Reaps a worker if it has ended: waitpid(pid, status, WNOHANG) when empty. Tests inject one that
  // never reaps some workers.
  std::function<pid_t(pid_t pid, int* status)> try_reap;
  // A multi-node job's channel to the other launchers (nullptr with one node): a failure anywhere
  // stops every host's group and restarts are rounds of the whole job. See Note [Coordinated
  // restarts] in launcher/channel/job_channel.cpp.
  channel::JobLink* link = nullptr;
  double round_timeout_s = 600;  // --rdzv_timeout: how long a round's end waits for the other nodes
  // Elastic membership (See Note [Elastic rounds] in launcher/rendezvous/rounds.cpp): polled while the
  // group runs (at least every 250 ms); a line (why the membership changes) stops the group as
  // another node's failure would.
  std::function<std::optional<std::string>()> membership_change;
  // --recovery live (See Note [Restarting one live worker] in launcher/agent/live_respawn.h): when set, a
  // worker that fails while the group runs is restarted alone, its node-mates keep running. Called
  // with its local rank; returns its new launch (its folder made), or nothing when --max_restarts
  // is used up: the group then stops as without it. The group itself is never restarted whole.
  std::function<std::optional<process::WorkerLaunch>(int local_rank)> respawn_worker;
};

// Runs attempts until one succeeds, restarts are used up, or the launcher is signalled (`signals`:
// the forwarded signals and SIGCHLD, caught by the caller for longer: See Note [SIGTERM after the
// workers] in launcher/agent/agent.cpp). An attempt that left a worker unreaped (see Note
// [Unreapable workers]) is not restarted.
SupervisorResult supervise(const SupervisorOptions& options, process::SignalPipe& signals, const GroupFactory& make_group);

}  // namespace ddp::launcher::agent
