#include "launcher/supervisor.h"

#include <spdlog/spdlog.h>

#include "launcher/attempt.h"

namespace ddp::launcher {

SupervisorResult supervise(const SupervisorOptions& options, const GroupFactory& make_group) {
  SignalPipe signals(options.forwarded_signals);
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
    if (run.launcher_signal) {
      result.exit_code = 128 + *run.launcher_signal;
      return result;
    }
    if (!result.root_cause) {
      result.exit_code = 0;
      return result;
    }
    result.exit_code = result.root_cause->launcher_exit_code();
    if (attempt >= options.max_restarts) return result;
    if (run.unreaped) {  // See Note [Unreapable workers]
      spdlog::error("not restarting: a worker of this attempt was not reaped after SIGKILL");
      return result;
    }
    spdlog::warn("worker group failed (rank {} exited with {}): restart {} of {}", result.root_cause->rank,
                 describe_exit(*result.root_cause), attempt + 1, options.max_restarts);
  }
}

}  // namespace ddp::launcher
