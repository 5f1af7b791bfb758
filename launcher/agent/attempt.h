#pragma once
// One attempt of the local worker group, start to end: a state machine (running, stopping, killed)
// driven by one poll() loop. See Note [Supervision] in attempt.cpp.
#include <optional>
#include <vector>

#include "launcher/agent/failure_report.h"
#include "launcher/agent/plan.h"
#include "launcher/agent/supervisor.h"
#include "launcher/process/worker_process.h"

namespace ddp::launcher::agent {

struct AttemptOutcome {
  std::vector<WorkerExit> failures;    // empty: every worker exited 0
  std::optional<int> launcher_signal;  // a signal the launcher received and forwarded
  bool unreaped = false;               // a worker was given up on: see Note [Unreapable workers]
  // Another node's failure or loss that stopped this group (See Note [Coordinated restarts]).
  std::optional<std::string> stopped_by;
  // --straggler_action replace: this node stopped its group to leave the job (why).
  std::optional<std::string> replaced;
};

// Starts `launches`, supervises them until every one has ended (and every process group is gone),
// and says what failed.
AttemptOutcome run_attempt(const SupervisorOptions& options, process::SignalPipe& signals, int attempt,
                           std::vector<process::WorkerLaunch> launches);

}  // namespace ddp::launcher::agent
