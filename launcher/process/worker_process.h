#pragma once
// Process spawning and output I/O of the supervisor: fork/exec of one worker in its own session,
// the pipes of its stdout and stderr (prefixed lines to the console, bytes to its log files), and
// the self-pipe that turns signals into poll() events. See Note [Supervision] in attempt.cpp.
#include <signal.h>
#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "launcher/process/line_collapser.h"
#include "launcher/process/line_splitter.h"
#include "launcher/process/terminal_progress.h"

namespace ddp::launcher::process {

// Signals the launcher forwards to its workers by default (torchrun's --signals_to_handle).
inline constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Signals a worker's process group; before the child's setsid() has run, the group does not exist
// yet and the signal goes to the worker itself (it is blocked there until after setsid, so it waits).
void signal_group(pid_t pid, int sig);

// Everything needed to start one worker of one attempt.
struct WorkerLaunch {
  int local_rank = 0;
  int rank = 0;
  std::vector<std::string> env;   // complete environment, "KEY=VALUE"
  // The variables the launcher sets (what --dry_run prints), in a stable order.
  std::vector<std::pair<std::string, std::string>> launcher_set;
  std::string dir;                // the worker's folder of this attempt (made before it starts)
  std::string error_file;         // TORCHELASTIC_ERROR_FILE, read back on failure
  bool stdout_to_console = true;
  bool stderr_to_console = true;
  std::string stdout_log;         // empty: not written to a file
  std::string stderr_log;
  // --duplicate_*_filters: where this worker's matching lines are also written (the attempt's
  // filtered_std{out,err}.log, shared by the workers); empty: nowhere.
  std::string filtered_stdout_log;
  std::string filtered_stderr_log;
  std::vector<int> cpus;          // pinned to these CPUs (See Note [CPU binding]); empty: inherited
  std::string console_prefix;     // what its console lines start with (See Note [Log line prefix])
};

// Installs handlers for the forwarded signals and SIGCHLD for its lifetime (restoring the old ones
// afterwards); each signal becomes a byte on a pipe that poll() watches.
class SignalPipe {
 public:
  // `forwarded`: the signals to catch (--signals_to_handle); empty: kForwardedSignals.
  explicit SignalPipe(std::vector<int> forwarded = {});
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;
  int read_fd() const { return fds_[0]; }
  // Signals received since the last call (SIGCHLD included).
  std::vector<int> drain();
  // Ignores `sig` from now on, and after this pipe too: it never meets its default action in
  // between (See Note [SIGTERM after the workers] in launcher/agent/agent.cpp).
  void ignore(int sig);

 private:
  std::vector<int> forwarded_;
  int fds_[2] = {-1, -1};
  struct sigaction old_[NSIG] {};
};

// One output stream of one worker: the read end of its pipe and where its bytes go.
struct OutputStream {
  int fd = -1;
  int console_fd = -1;  // 1 or 2, or -1 when this stream is not shown
  bool console_is_terminal = false;  // See Note [Progress lines] in launcher/process/line_splitter.h
  int rank = 0;
  // Shared by the attempt's workers when the launcher's stdout is a terminal (nullptr: plain lines).
  TerminalProgress* live = nullptr;
  int file_fd = -1;
  LineSplitter splitter;
  std::string prefix;
  // --duplicate_*_filters: lines containing any of `filters` also go to filtered_fd (owned by the
  // attempt, shared by the workers); -1: none.
  int filtered_fd = -1;
  const std::vector<std::string>* filters = nullptr;
  // --collapse_lines: console lines go through the attempt's collapser (See Note [Collapsed lines]).
  LineCollapser* collapser = nullptr;

  void close_all();
  // Reads what is there; returns false at EOF (or error).
  bool pump();
  // Flushes a last partial line to the console and closes everything.
  void finish();

 private:
  void emit(std::string_view line);
};

// The state of process `pid` from /proc/PID/stat, e.g. "D (uninterruptible sleep)", "Z (zombie)";
// "unknown (/proc/PID/stat unreadable)" when it cannot be read.
std::string process_state(pid_t pid);

// Creates the worker's log files (new files only: see Note [Log folders]), then starts
// `program_path` with `args` and the worker's environment and CPUs (spawn_process: See Note [One
// process primitive] in launcher/process/spawn.cpp). `out` and `err` get the read ends of its
// pipes. Returns the pid. Throws (leaving no child behind) when a file, pipe or fork fails.
pid_t start_worker(const std::string& program_path, const std::vector<std::string>& args, const WorkerLaunch& launch,
                   OutputStream& out, OutputStream& err);

}  // namespace ddp::launcher::process
