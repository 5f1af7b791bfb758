#pragma once
// The process supervisor: starts the local worker group, pipes its output, forwards signals,
// stops the group on the first failure, restarts it, reaps every child. See Note [Supervision].
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddp/base/error_file.h"

namespace ddp::launcher {

class AgentSocket;
class ProgressBoard;

// Everything needed to start one worker of one attempt.
struct WorkerLaunch {
  int local_rank = 0;
  int rank = 0;
  std::vector<std::string> env;   // complete environment, "KEY=VALUE"
  std::string error_file;         // TORCHELASTIC_ERROR_FILE, read back on failure
  bool stdout_to_console = true;
  bool stderr_to_console = true;
  std::string stdout_log;         // empty: not written to a file
  std::string stderr_log;
  std::vector<int> cpus;          // pinned to these CPUs (Note [CPU binding]); empty: inherited
};

// One attempt's workers, built by the caller for attempt k (restart count k).
using GroupFactory = std::function<std::vector<WorkerLaunch>(int attempt)>;

struct SupervisorOptions {
  std::string program_path;             // resolved executable
  std::vector<std::string> program_args;  // argv, verbatim (argv[0] as the user gave it)
  double monitor_interval_s = 0.1;
  double shutdown_grace_s = 10;
  int max_restarts = 0;
  std::string host_name;
  // Heartbeats (docs/observability.md): read from `agent` into `progress`; with hang_timeout_s > 0,
  // a rank silent for longer is stopped as a failure (Note [Hang watchdog]).
  AgentSocket* agent = nullptr;
  ProgressBoard* progress = nullptr;
  double hang_timeout_s = 0;

  SupervisorOptions& set_program(std::string path, std::vector<std::string> args) {
    program_path = std::move(path);
    program_args = std::move(args);
    return *this;
  }
  SupervisorOptions& set_monitor_interval(double s) { monitor_interval_s = s; return *this; }
  SupervisorOptions& set_shutdown_grace(double s) { shutdown_grace_s = s; return *this; }
  SupervisorOptions& set_max_restarts(int n) { max_restarts = n; return *this; }
  SupervisorOptions& set_host_name(std::string h) { host_name = std::move(h); return *this; }
  SupervisorOptions& set_progress(AgentSocket* a, ProgressBoard* p) { agent = a; progress = p; return *this; }
  SupervisorOptions& set_hang_timeout(double s) { hang_timeout_s = s; return *this; }
};

// How a worker ended.
struct WorkerExit {
  int rank = 0;
  int local_rank = 0;
  int pid = 0;
  int exit_code = 0;              // when !signal
  std::optional<int> signal;      // killed by this signal
  std::chrono::system_clock::time_point time;
  std::string error_file;
  std::optional<WorkerError> error;  // what the worker wrote to its error file
  bool after_stop = false;        // ended after the launcher began stopping the group
  std::optional<std::string> hang;  // set when the hang watchdog stopped it: describe_stuck()
  int observed_pass = 0;          // the monitor loop's pass that reaped it (1, 2, ...)
  // When the worker wrote its error file (the file's mtime), if it wrote one in this attempt.
  std::optional<std::chrono::system_clock::time_point> error_written;
  int launcher_exit_code() const { return signal ? 128 + *signal : exit_code; }
};

struct SupervisorResult {
  int exit_code = 0;
  int attempts = 0;                       // attempts run (1 + restarts used)
  std::optional<int> launcher_signal;     // a signal the launcher received and forwarded
  std::optional<WorkerExit> root_cause;   // the first failure of the last attempt
  std::vector<WorkerExit> other_failures;
};

// Which of an attempt's failures is the root cause (an index into failures, which must not be
// empty): see Note [Root cause] in supervisor.cpp.
std::size_t root_cause_index(const std::vector<WorkerExit>& failures);

// Runs attempts until one succeeds, restarts are used up, or the launcher is signalled.
// Installs handlers for SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD for its duration.
SupervisorResult supervise(const SupervisorOptions& options, const GroupFactory& make_group);

// torchrun-like failure summary text (several lines).
std::string format_failure_summary(const SupervisorResult& result, const std::string& host_name);

// "SIGTERM" for 15, "signal 99" for unknown numbers.
std::string signal_name(int signal);

}  // namespace ddp::launcher
