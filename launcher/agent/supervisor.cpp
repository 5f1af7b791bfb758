#include "launcher/agent/supervisor.h"

#include <spdlog/spdlog.h>

#include "launcher/agent/attempt.h"
#include "launcher/channel/job_link.h"

namespace ddp::launcher::agent {
namespace {

// What the rest of a multi-node job says after this node's round `attempt` ended: whether every
// node restarts together (See Note [Coordinated restarts] in launcher/channel/job_channel.cpp).
bool coordinated_restart(const SupervisorOptions& options, process::SignalPipe& signals, int attempt, const AttemptOutcome& run,
                         SupervisorResult& result) {
  channel::JobLink& link = *options.link;
  const bool failed = result.root_cause.has_value() || run.stopped_by.has_value() || run.replaced.has_value();
  const bool final = run.launcher_signal.has_value() || run.unreaped;
  const bool restarts_left = attempt < options.max_restarts;
  const std::string kind = final ? "final" : failed ? "failed" : "ok";
  // A round that cannot restart waits only briefly, for what the coordinator heard before (a lost
  // host); one that may restart waits for every node (the re-rendezvous), bounded by --rdzv_timeout.
  double wait_s = restarts_left && !final ? options.round_timeout_s : (link.connected_once() ? 2 : 0);
  if (!failed && !restarts_left) wait_s = 0;
  std::string why;
  const channel::RoundVerdict verdict = link.finish_round(attempt, kind, wait_s, signals, why);
  result.replaced = run.replaced;
  result.elsewhere = link.news();
  // Stopped from elsewhere while its own workers exited cleanly: the job failed all the same.
  if (failed && result.exit_code == 0) result.exit_code = 1;
  if (verdict == channel::RoundVerdict::kRestart && !final) {
    if (failed) {
      spdlog::warn("the job's round {} failed ({}): every host restarts its group, restart {} of {}", attempt,
                   run.stopped_by ? *run.stopped_by
                                  : ddp::str("rank ", result.root_cause->rank, " exited with ",
                                             describe_exit(*result.root_cause)),
                   attempt + 1, options.max_restarts);
    } else {
      spdlog::warn("this host's group finished, but the job's round {} failed elsewhere: every host restarts its "
                   "group, restart {} of {}",
                   attempt, attempt + 1, options.max_restarts);
    }
    return true;
  }
  if (verdict == channel::RoundVerdict::kNoAnswer && wait_s > 2 && failed) {
    spdlog::error("{}: ending", why);
    result.elsewhere.push_back(why);
  } else if (verdict == channel::RoundVerdict::kNoAnswer && wait_s > 2) {
    spdlog::warn("{}: this host's group succeeded, ending", why);  // as torchrun's exit barrier timing out
  }
  if (verdict == channel::RoundVerdict::kSignalled && result.exit_code == 0) result.exit_code = 1;
  return false;
}

}  // namespace

SupervisorResult supervise(const SupervisorOptions& options, process::SignalPipe& signals, const GroupFactory& make_group) {
  SupervisorResult result;
  for (int attempt = 0;; ++attempt) {
    AttemptOutcome run = run_attempt(options, signals, attempt, make_group(attempt));
    result.attempts = attempt + 1;
    result.launcher_signal = run.launcher_signal;
    result.root_cause.reset();
    result.other_failures.clear();
    if (!run.failures.empty()) {
      const std::size_t first = root_cause_index(run.failures);
      result.root_cause = run.failures[first];
      for (std::size_t i = 0; i < run.failures.size(); ++i) {
        if (i != first) result.other_failures.push_back(run.failures[i]);
      }
    }
    // See Note [A signal during a failed stop] in attempt.cpp.
    const bool failed_before_signal = result.root_cause && !result.root_cause->after_stop;
    result.exit_code = run.launcher_signal && !failed_before_signal ? 128 + *run.launcher_signal
                       : result.root_cause                         ? result.root_cause->launcher_exit_code()
                                                                   : 0;
    // Stopped for a reason outside this node's workers (live: the store's host lost, See Note [The
    // store's host lost]): the summary names it, and the job failed even if they exited cleanly.
    result.stopped_by = run.stopped_by;
    result.replaced = run.replaced;  // See Note [Replacing a straggler] in attempt.cpp
    if (run.stopped_by && !run.launcher_signal && result.exit_code == 0) result.exit_code = 1;
    if (options.link != nullptr) {
      if (coordinated_restart(options, signals, attempt, run, result)) continue;
      if (run.unreaped) spdlog::error("not restarting: a worker of this attempt was not reaped after SIGKILL");
      return result;
    }
    if (run.launcher_signal || !result.root_cause) return result;
    if (options.respawn_worker) return result;  // its workers were restarted one by one: used up
    if (attempt >= options.max_restarts) return result;
    if (run.unreaped) {  // See Note [Unreapable workers]
      spdlog::error("not restarting: a worker of this attempt was not reaped after SIGKILL");
      return result;
    }
    spdlog::warn("worker group failed (rank {} exited with {}): restart {} of {}", result.root_cause->rank,
                 describe_exit(*result.root_cause), attempt + 1, options.max_restarts);
  }
}

}  // namespace ddp::launcher::agent
