#pragma once
// How workers ended, which failure is the root cause, and the torchrun-like summary printed when the
// group failed. See Note [Root cause].
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "ddp/base/detail/error_file.h"

namespace ddp::launcher::agent {

// How a worker ended.
struct WorkerExit {
  int rank = 0;
  int local_rank = 0;
  int pid = 0;
  int exit_code = 0;              // when !signal
  std::optional<int> signal;      // killed by this signal
  std::chrono::system_clock::time_point time;
  std::string error_file;
  std::optional<detail::WorkerError> error;  // what the worker wrote to its error file
  bool after_stop = false;        // ended after the launcher began stopping the group
  std::optional<std::string> hang;  // set when the hang watchdog stopped it: describe_stuck()
  // Set when it was still not reaped --reap timeout after SIGKILL: its state from /proc/PID/stat,
  // e.g. "D (uninterruptible sleep)". See Note [Unreapable workers] in launcher/agent/attempt.cpp.
  std::optional<std::string> unreaped;
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
  // Multi-node jobs (See Note [Coordinated restarts]): what stopped this node's group from
  // elsewhere ("host2 (node 2, rank 2): rank 2 exited with 3"), and what this launcher heard of the
  // rest of the job (lost hosts with their ranks, nodes that did not report).
  std::optional<std::string> stopped_by;
  std::vector<std::string> elsewhere;
  // --straggler_action replace: why this node left the job (it stopped its group for it).
  std::optional<std::string> replaced;
};

// One failure as the root-cause rule sees it: a worker's (root_cause_index) or a host's (the hosts'
// launcher, See Note [Root cause across hosts] in launcher/hosts/remote_launch.cpp).
struct FailureOrder {
  bool after_stop = false;  // seen after the launcher began stopping the group
  int pass = 0;             // when it was seen, coarsely: the monitor loop's pass
  // When it failed, precisely enough to order failures of one pass; compared only when every
  // failure of that pass has one.
  std::optional<std::chrono::system_clock::time_point> time;
  int tie = 0;              // the last resort, lower first: a worker's rank, a host's order
};

// The root cause among failures (an index; failures must not be empty): See Note [Root cause] in
// failure_report.cpp. The one rule for workers and for hosts.
std::size_t earliest_failure(const std::vector<FailureOrder>& failures);

// Which of an attempt's failures is the root cause: earliest_failure over the workers' exits.
std::size_t root_cause_index(const std::vector<WorkerExit>& failures);

// The summary's "time" line ("2026-12-02T03:04:05.678Z", UTC, milliseconds) and back; nothing
// when the text is not such a time.
std::string format_failure_time(std::chrono::system_clock::time_point t);
std::optional<std::chrono::system_clock::time_point> parse_failure_time(const std::string& text);

// torchrun-like failure summary text (several lines), between two kSummaryRule lines, by which a
// --hostfile job's launcher finds each host's summary in its output.
std::string format_failure_summary(const SupervisorResult& result, const std::string& host_name);
inline const std::string kSummaryRule(64, '=');
// The summary's line naming the failure elsewhere that stopped this host (its job channel's word);
// the --hostfile launcher ranks such a host after the one that failed (Note [Root cause across hosts]).
inline const std::string kStoppedFromAnotherHost = "Stopped from another host: ";

// "3", or "SIGKILL (signal 9, exit code 137)".
std::string describe_exit(const WorkerExit& exit);

}  // namespace ddp::launcher::agent
