#include "launcher/agent/failure_report.h"

#include "launcher/process/spawn.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>

#include "ddp/base/error.h"

namespace ddp::launcher::agent {

std::string describe_exit(const WorkerExit& e) {
  if (e.unreaped) return ddp::str("<not reaped after SIGKILL: pid ", e.pid, " state ", *e.unreaped, ">");
  if (e.signal) return ddp::str(process::signal_name(*e.signal), " (signal ", *e.signal, ", exit code ", 128 + *e.signal, ")");
  return ddp::str(e.exit_code);
}


// Note [Root cause]
// ~~~~~~~~~~~~~~~~~
// The root cause is the earliest failure. Failures the launcher saw before it began stopping the
// group come before those that followed its SIGTERM; then the earlier pass of the monitor loop
// (SIGCHLD wakes it at once, so a pass is a few milliseconds wide). Several workers reaped in the
// same pass died too close together for waitpid to order them: when every one of them wrote an
// error file, the one written first (its mtime, in nanoseconds) wins; otherwise (a worker killed by
// a signal writes none, and a mtime cannot be compared with a death nobody timed) the lowest rank.
// The same rule picks the root host of a --hostfile job (Note [Root cause across hosts] in
// launcher/hosts/remote_launch.cpp): the hosts' summary times in place of the error files' mtimes.
std::size_t earliest_failure(const std::vector<FailureOrder>& failures) {
  DDP_CHECK(!failures.empty(), "earliest_failure needs at least one failure");
  const auto key = [](const FailureOrder& f) { return std::make_pair(f.after_stop, f.pass); };
  std::size_t best = 0;
  for (std::size_t i = 1; i < failures.size(); ++i) {
    if (key(failures[i]) < key(failures[best])) best = i;
  }
  std::vector<std::size_t> tied;
  for (std::size_t i = 0; i < failures.size(); ++i) {
    if (key(failures[i]) == key(failures[best])) tied.push_back(i);
  }
  const bool all_timed = std::all_of(tied.begin(), tied.end(), [&](std::size_t i) {
    return failures[i].time.has_value();
  });
  const auto earlier = [&](std::size_t a, std::size_t b) {
    const FailureOrder& x = failures[a];
    const FailureOrder& y = failures[b];
    if (all_timed && *x.time != *y.time) return *x.time < *y.time;
    return x.tie < y.tie;
  };
  return *std::min_element(tied.begin(), tied.end(), earlier);
}

std::size_t root_cause_index(const std::vector<WorkerExit>& failures) {
  std::vector<FailureOrder> order;
  order.reserve(failures.size());
  for (const WorkerExit& e : failures) order.push_back({e.after_stop, e.observed_pass, e.error_written, e.rank});
  return earliest_failure(order);
}

std::string format_failure_time(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  char out[80];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>(ms));
  return out;
}

std::optional<std::chrono::system_clock::time_point> parse_failure_time(const std::string& text) {
  std::tm tm{};
  const char* rest = ::strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  int ms = 0;
  int used = 0;
  if (rest == nullptr || std::sscanf(rest, ".%3d%n", &ms, &used) != 1 || used != 4 || std::string(rest + used) != "Z") {
    return std::nullopt;
  }
  const std::time_t secs = ::timegm(&tm);
  return std::chrono::system_clock::from_time_t(secs) + std::chrono::milliseconds(ms);
}

std::string format_failure_summary(const SupervisorResult& result, const std::string& host_name) {
  std::string out = kSummaryRule + "\n";
  // See Note [Coordinated restarts] in launcher/channel/job_channel.cpp: what came from the other hosts.
  std::string job;
  if (result.stopped_by) job += ddp::str(kStoppedFromAnotherHost, *result.stopped_by, "\n");
  if (!result.elsewhere.empty()) {
    job += "Elsewhere in the job:\n";
    for (const auto& line : result.elsewhere) job += ddp::str("  ", line, "\n");
  }
  if (!result.root_cause && !job.empty() && !result.launcher_signal) {
    out += ddp::str("ddp_launch: worker group FAILED on host ", host_name, ": stopped because of another host\n", job);
    return out + kSummaryRule + "\n";
  }
  if (!result.root_cause) {
    out += ddp::str("ddp_launch: stopped by ", process::signal_name(result.launcher_signal.value_or(0)),
                    "; every worker exited cleanly\n");
    return out + kSummaryRule + "\n";
  }
  const WorkerExit& e = *result.root_cause;
  out += ddp::str("ddp_launch: worker group FAILED", result.attempts > 1 ? ddp::str(" after ", result.attempts, " attempts") : "",
                  result.launcher_signal ? " (launcher received " + process::signal_name(*result.launcher_signal) + ")" : "", "\n");
  out += job;
  out += "Root cause (first observed failure):\n";
  out += ddp::str("  time      : ", format_failure_time(e.time), "\n");
  out += ddp::str("  host      : ", host_name, "\n");
  out += ddp::str("  rank      : ", e.rank, " (local_rank: ", e.local_rank, ")\n");
  out += ddp::str("  pid       : ", e.pid, "\n");
  out += ddp::str("  exitcode  : ", describe_exit(e), e.hang ? " (stopped by the hang watchdog)" : "", "\n");
  if (e.hang) out += ddp::str("  hang      : ", *e.hang, "\n");
  out += ddp::str("  error_file: ", e.error ? e.error_file : "<N/A>", "\n");
  if (e.error) {
    out += ddp::str("  message   : ", e.error->message, "\n");
    if (!e.error->callstack.empty()) out += ddp::str("  traceback :\n", e.error->callstack, "\n");
  } else {
    out += "  message   : <the worker wrote no error file; see its output above>\n";
  }
  if (!result.other_failures.empty()) {
    out += "Other failures:\n";
    for (const auto& o : result.other_failures) {
      out += ddp::str("  rank ", o.rank, " (local_rank: ", o.local_rank, "): exitcode ", describe_exit(o),
                      o.hang ? " (hang: " + *o.hang + ")" : "",
                      o.after_stop ? " (after the launcher stopped the group)" : "",
                      o.error ? " message: " + o.error->message : "", "\n");
    }
  }
  return out + kSummaryRule + "\n";
}

}  // namespace ddp::launcher::agent
