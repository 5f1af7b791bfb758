#include "launcher/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <spdlog/spdlog.h>

#include "ddp/base/error.h"
#include "launcher/agent_socket.h"
#include "launcher/line_splitter.h"
#include "launcher/progress_board.h"

// Note [Supervision]
// One thread, one poll() loop per attempt: the worker pipes plus a self-pipe that the signal handler
// writes the signal number to (so SIGCHLD and forwarded signals wake the loop at once; poll's timeout
// is --monitor_interval, which bounds how late deadlines are noticed).
// Each worker is fork()ed and execve()d directly (no shell), in a session and process group of its
// own (setsid): signals reach the worker and everything it started, a terminal's Ctrl-C reaches only
// the launcher, which forwards it, and the kernel's autogroup scheduler treats each worker like any
// other session. In one shared session, as with a plain setpgid, all the workers of a busy machine
// together get the CPU share of one session: measured here as 0.64-0.70x the samples/s of the same
// binary under torchrun (which also starts each worker in a new session). The parent does not call
// setpgid: had it won the race, the child's setsid would fail (it would lead a process group
// already); signal_group() covers the instant before the child's setsid instead.
// In the child, prctl(PR_SET_PDEATHSIG, SIGKILL) ties the worker's life to the
// launcher; since the launcher may die between fork() and prctl(), the child then checks that its
// parent is still the launcher and exits if not. The child closes every descriptor above stderr
// (as torchrun's Popen(close_fds=True)): libraries in the launcher (the metrics plugin's HTTP
// server) open sockets without O_CLOEXEC, and a worker must not keep the launcher's port bound.
// Only async-signal-safe calls run in the child: every string execve needs is built before fork().
// Stopping a group: SIGTERM to every worker's process group, then SIGKILL after --shutdown_grace.
// At the end of an attempt, every worker's process group gets SIGKILL, so grandchildren a worker
// started do not outlive it.

namespace ddp::launcher {
namespace {

constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Signals a worker's process group; before the child's setsid() has run, the group does not exist
// yet and the signal goes to the worker itself (it is blocked there until after setsid, so it waits).
void signal_group(pid_t pid, int sig) {
  if (::kill(-pid, sig) != 0 && errno == ESRCH) ::kill(pid, sig);
}
int g_signal_pipe_write = -1;  // the only global: a signal handler cannot take arguments

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (g_signal_pipe_write >= 0) {
    [[maybe_unused]] ssize_t n = ::write(g_signal_pipe_write, &byte, 1);
  }
  errno = saved;
}

// Installs the handlers for the supervisor's lifetime and restores the old ones afterwards.
class SignalPipe {
 public:
  SignalPipe() {
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw ddp::Error(ddp::str("pipe2 failed: ", std::strerror(errno)));
    }
    g_signal_pipe_write = fds_[1];
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : kForwardedSignals) ::sigaction(sig, &sa, &old_[sig]);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    ::sigaction(SIGCHLD, &sa, &old_[SIGCHLD]);
  }
  ~SignalPipe() {
    for (int sig : kForwardedSignals) ::sigaction(sig, &old_[sig], nullptr);
    ::sigaction(SIGCHLD, &old_[SIGCHLD], nullptr);
    g_signal_pipe_write = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  int read_fd() const { return fds_[0]; }
  // Signals received since the last call (SIGCHLD included).
  std::vector<int> drain() {
    std::vector<int> sigs;
    unsigned char buf[64];
    ssize_t n;
    while ((n = ::read(fds_[0], buf, sizeof buf)) > 0) {
      for (ssize_t i = 0; i < n; ++i) sigs.push_back(buf[i]);
    }
    return sigs;
  }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction old_[NSIG] {};
};

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 100);
        continue;
      }
      return;  // console or log gone (EPIPE, disk full): drop the output, keep supervising
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// One output stream of one worker: the read end of its pipe and where lines go.
struct Stream {
  int fd = -1;
  int console_fd = -1;  // 1 or 2, or -1 when this stream is not shown
  int file_fd = -1;
  LineSplitter splitter;
  std::string prefix;

  void close_all() {
    if (fd >= 0) ::close(fd);
    if (file_fd >= 0) ::close(file_fd);
    fd = file_fd = -1;
  }
  // Reads what is there; returns false at EOF (or error).
  bool pump() {
    char buf[65536];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
      finish();
      return false;
    }
    const std::string_view bytes(buf, static_cast<size_t>(n));
    if (file_fd >= 0) write_all(file_fd, bytes);
    if (console_fd >= 0) splitter.feed(bytes, [this](std::string_view line) { emit(line); });
    return true;
  }
  void finish() {
    if (console_fd >= 0) splitter.flush([this](std::string_view line) { emit(line); });
    close_all();
  }
  void emit(std::string_view line) {
    std::string out;
    out.reserve(prefix.size() + line.size());
    out += prefix;
    out += line;
    write_all(console_fd, out);
  }
};

struct Worker {
  WorkerLaunch launch;
  pid_t pid = -1;
  bool running = false;
  std::optional<size_t> hang_failure;  // index in Attempt::failures when the watchdog stopped it
  Stream out;
  Stream err;
};

int open_log(const std::string& path) {
  if (path.empty()) return -1;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0644);
  if (fd < 0) throw ddp::IoError(ddp::str("cannot open log file ", path, ": ", std::strerror(errno)));
  return fd;
}

// Strings execve needs, built before fork (the child may only call async-signal-safe functions).
struct ExecArgs {
  std::vector<char*> argv;
  std::vector<char*> envp;
  ExecArgs(const std::vector<std::string>& args, const std::vector<std::string>& env) {
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
  }
};

[[noreturn]] void child_exit_with_errno(const char* what);

// The affinity mask of a worker, built before fork; nullopt: the worker inherits the launcher's.
std::optional<cpu_set_t> cpu_mask(const std::vector<int>& cpus) {
  if (cpus.empty()) return std::nullopt;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  return set;
}

[[noreturn]] void child_after_fork(pid_t launcher, const char* path, const ExecArgs& args, int out_w,
                                   int err_w, const cpu_set_t* cpus) {
  // Signals are blocked here (see start_all); handlers go back to the defaults before unblocking.
  ::setsid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl: do not run orphaned
  ::dup2(out_w, STDOUT_FILENO);
  ::dup2(err_w, STDERR_FILENO);
  if (::close_range(3, ~0U, 0) != 0) {
    for (int fd = 3; fd < 4096; ++fd) ::close(fd);  // kernels before 5.9
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig : kForwardedSignals) ::sigaction(sig, &dfl, nullptr);
  ::sigaction(SIGCHLD, &dfl, nullptr);
  ::sigaction(SIGPIPE, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Note [CPU binding] (launcher/resources.h): before exec, so every thread the worker starts
  // inherits the mask.
  if (cpus != nullptr && ::sched_setaffinity(0, sizeof *cpus, cpus) != 0) {
    child_exit_with_errno("ddp_launch: --cpu_bind: sched_setaffinity failed (errno ");
  }
  ::execve(path, args.argv.data(), args.envp.data());
  child_exit_with_errno("ddp_launch: execve failed (errno ");
}

// Writes `what`, errno and ")\n" to stderr and exits 127. Only async-signal-safe calls: the digits
// are formatted by hand.
[[noreturn]] void child_exit_with_errno(const char* what) {
  char msg[512];
  size_t len = 0;
  while (what[len] != '\0' && len < 400) {
    msg[len] = what[len];
    ++len;
  }
  char digits[16];
  int nd = 0;
  for (int e = errno; nd == 0 || e > 0; e /= 10) digits[nd++] = static_cast<char>('0' + e % 10);
  while (nd > 0 && len < sizeof msg - 4) msg[len++] = digits[--nd];
  msg[len++] = ')';
  msg[len++] = '\n';
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, msg, len);
  ::_exit(127);
}

using Clock = std::chrono::steady_clock;

std::optional<std::chrono::system_clock::time_point> file_mtime(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return std::nullopt;
  const auto since_epoch = std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec);
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(since_epoch));
}

class Attempt {
 public:
  Attempt(const SupervisorOptions& options, SignalPipe& signals, int attempt, std::vector<WorkerLaunch> launches)
      : options_(options), signals_(signals), attempt_(attempt) {
    for (auto& l : launches) {
      workers_.emplace_back();
      workers_.back().launch = std::move(l);
    }
  }

  // Only reached with workers still running when start-up failed half-way (an exception).
  ~Attempt() {
    for (auto& w : workers_) {
      if (w.running && w.pid > 0) {
        signal_group(w.pid, SIGKILL);
        ::waitpid(w.pid, nullptr, 0);
      }
      w.out.close_all();
      w.err.close_all();
    }
  }
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  // Runs the attempt to its end; `failures` holds what failed (empty: every worker exited 0).
  void run() {
    start_all();
    while (true) {
      handle_signals();
      reap();
      check_hangs();
      if (stop_deadline_ && Clock::now() >= *stop_deadline_ && !killed_) kill_all(SIGKILL);
      if (running_count() == 0) break;
      wait_for_events(next_timeout_ms());
    }
    drain_output();
    // Grandchildren left in a worker's process group go too (see Note [Supervision]).
    for (auto& w : workers_) {
      if (w.pid > 0) ::kill(-w.pid, SIGKILL);  // reaped: never the pid itself, it may be reused
    }
  }

  std::vector<WorkerExit> failures;
  std::optional<int> launcher_signal;

 private:
  void start_all() {
    const pid_t self = ::getpid();
    std::vector<std::string> args = options_.program_args;
    for (auto& w : workers_) {
      // Log files are opened before fork, so a failure here leaves no worker behind.
      w.out.file_fd = open_log(w.launch.stdout_log);
      w.err.file_fd = open_log(w.launch.stderr_log);
      int out_pipe[2], err_pipe[2];
      if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw ddp::Error(ddp::str("pipe2 failed: ", std::strerror(errno)));
      w.out.fd = out_pipe[0];
      if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
        ::close(out_pipe[1]);
        throw ddp::Error(ddp::str("pipe2 failed: ", std::strerror(errno)));
      }
      w.err.fd = err_pipe[0];
      ExecArgs exec_args(args, w.launch.env);
      const std::optional<cpu_set_t> mask = cpu_mask(w.launch.cpus);
      // Signals stay blocked across fork(): the child must not run our handlers (they would write
      // to the shared self-pipe); it unblocks them after restoring the default dispositions.
      sigset_t all, old;
      sigfillset(&all);
      ::sigprocmask(SIG_SETMASK, &all, &old);
      const pid_t pid = ::fork();
      if (pid == 0) child_after_fork(self, options_.program_path.c_str(), exec_args, out_pipe[1], err_pipe[1],
                                    mask ? &*mask : nullptr);
      const int fork_errno = errno;
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      if (pid < 0) throw ddp::Error(ddp::str("fork failed: ", std::strerror(fork_errno)));
      w.pid = pid;
      w.running = true;
      setup_stream(w.out, w.launch.stdout_to_console ? STDOUT_FILENO : -1, w.launch.rank);
      setup_stream(w.err, w.launch.stderr_to_console ? STDERR_FILENO : -1, w.launch.rank);
    }
    if (options_.progress != nullptr) {
      std::vector<WorkerIdentity> ids;
      for (const auto& w : workers_) ids.push_back({w.launch.rank, w.launch.local_rank, static_cast<int>(w.pid)});
      options_.progress->begin_attempt(attempt_, ids);
    }
  }

  // Note [Hang watchdog] (launcher/progress_board.h): a stuck rank fails the attempt like a crash;
  // its failure is recorded now (the root cause) and completed when the worker is reaped.
  void check_hangs() {
    if (options_.hang_timeout_s <= 0 || options_.progress == nullptr || stopping_) return;
    const auto stuck = options_.progress->stuck(Clock::now(), options_.hang_timeout_s);
    if (stuck.empty()) return;
    for (const auto& s : stuck) {
      const std::string line = describe_stuck(s);
      spdlog::error("{} (--hang_timeout {} s): stopping the job", line, options_.hang_timeout_s);
      for (auto& w : workers_) {
        if (w.launch.rank != s.worker.rank || !w.running) continue;
        WorkerExit exit = exit_record(w);
        exit.exit_code = 1;  // until the worker is reaped
        exit.hang = line;
        w.hang_failure = failures.size();
        failures.push_back(std::move(exit));
        options_.progress->count_failure();
      }
    }
    begin_stop(true, "the hang watchdog stopped the job");
  }

  static void setup_stream(Stream& s, int console_fd, int rank) {
    ::fcntl(s.fd, F_SETFL, ::fcntl(s.fd, F_GETFL) | O_NONBLOCK);
    s.console_fd = console_fd;
    s.prefix = rank_prefix(rank);
  }

  int running_count() const {
    return static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
  }

  int next_timeout_ms() const {
    int ms = std::max(1, static_cast<int>(options_.monitor_interval_s * 1000));
    if (stop_deadline_ && !killed_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*stop_deadline_ - Clock::now()).count();
      ms = std::min<long long>(ms, std::max<long long>(0, left + 1));
    }
    return ms;
  }

  // poll() on the signal pipe and every open output pipe; reads what is ready.
  void wait_for_events(int timeout_ms) {
    std::vector<pollfd> fds{{signals_.read_fd(), POLLIN, 0}};
    std::vector<Stream*> streams;
    for (auto& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
    }
    const int agent_fd = options_.agent != nullptr ? options_.agent->fd() : -1;
    if (agent_fd >= 0) fds.push_back({agent_fd, POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n <= 0) return;
    for (size_t i = 1; i < streams.size() + 1; ++i) {
      if (fds[i].revents != 0) streams[i - 1]->pump();
    }
    if (agent_fd >= 0 && fds.back().revents != 0) {
      const auto now = Clock::now();
      options_.agent->drain([&](const AgentDatagram& d) { options_.progress->record(d, now); });
    }
  }

  void handle_signals() {
    for (int sig : signals_.drain()) {
      if (sig == SIGCHLD) continue;
      if (!launcher_signal) launcher_signal = sig;
      spdlog::warn("received {}: forwarding it to {} workers", signal_name(sig), running_count());
      for (auto& w : workers_) {
        if (w.running) signal_group(w.pid, sig);
      }
      begin_stop(false);
    }
  }

  static WorkerExit exit_record(const Worker& w) {
    WorkerExit exit;
    exit.rank = w.launch.rank;
    exit.local_rank = w.launch.local_rank;
    exit.pid = w.pid;
    exit.time = std::chrono::system_clock::now();
    exit.error_file = w.launch.error_file;
    return exit;
  }

  void reap() {
    ++pass_;
    const bool stopping_before = stopping_;  // failures of this pass all count as before the stop
    bool failed = false;
    for (auto& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      const pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r != w.pid) continue;
      w.running = false;
      if (options_.progress != nullptr) options_.progress->mark_exited(w.launch.rank);
      if (w.hang_failure) {  // stopped by the watchdog: complete its record, it stays the root cause
        WorkerExit& hung = failures[*w.hang_failure];
        if (WIFSIGNALED(status)) hung.signal = WTERMSIG(status);
        else hung.exit_code = WEXITSTATUS(status) != 0 ? WEXITSTATUS(status) : 1;
        hung.error = read_error_file(hung.error_file);
        continue;
      }
      WorkerExit exit = exit_record(w);
      if (WIFSIGNALED(status)) {
        exit.signal = WTERMSIG(status);
      } else {
        exit.exit_code = WEXITSTATUS(status);
      }
      if (!exit.signal && exit.exit_code == 0) continue;
      exit.error = read_error_file(exit.error_file);
      if (exit.error) exit.error_written = file_mtime(exit.error_file);
      exit.after_stop = stopping_before;
      exit.observed_pass = pass_;
      if (!stopping_before && options_.progress != nullptr) options_.progress->count_failure();
      failures.push_back(std::move(exit));
      failed = true;
    }
    if (failed) begin_stop(true);
  }

  // The group stops: SIGTERM to every running worker (unless a forwarded signal already went out),
  // SIGKILL when the grace period is over.
  void begin_stop(bool send_sigterm, const char* why = "a worker failed") {
    if (!stopping_ && send_sigterm && running_count() > 0) {
      spdlog::warn("{}: sending SIGTERM to the {} running workers (SIGKILL after {} s)", why, running_count(),
                   options_.shutdown_grace_s);
      for (auto& w : workers_) {
        if (w.running) signal_group(w.pid, SIGTERM);
      }
    }
    if (!stopping_) {
      stopping_ = true;
      stop_deadline_ = Clock::now() + std::chrono::microseconds(static_cast<long long>(options_.shutdown_grace_s * 1e6));
    }
  }

  void kill_all(int sig) {
    killed_ = true;
    for (auto& w : workers_) {
      if (w.running) {
        spdlog::warn("rank {} (pid {}) still running after the {} s grace period: sending {}", w.launch.rank,
                     w.pid, options_.shutdown_grace_s, signal_name(sig));
        signal_group(w.pid, sig);
      }
    }
  }

  // Workers are gone; read what is left in their pipes (bounded: a grandchild may hold a pipe open).
  void drain_output() {
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (Clock::now() < deadline) {
      bool open = false;
      for (auto& w : workers_) open = open || w.out.fd >= 0 || w.err.fd >= 0;
      if (!open) break;
      wait_for_events(50);
      signals_.drain();
    }
    for (auto& w : workers_) {
      w.out.finish();
      w.err.finish();
    }
  }

  const SupervisorOptions& options_;
  SignalPipe& signals_;
  int attempt_;
  std::vector<Worker> workers_;
  bool stopping_ = false;
  bool killed_ = false;
  int pass_ = 0;
  std::optional<Clock::time_point> stop_deadline_;
};

std::string format_time(std::chrono::system_clock::time_point t) {
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

std::string describe_exit(const WorkerExit& e) {
  if (e.signal) return ddp::str(signal_name(*e.signal), " (signal ", *e.signal, ", exit code ", 128 + *e.signal, ")");
  return ddp::str(e.exit_code);
}

}  // namespace

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    default: return ddp::str("signal ", sig);
  }
}

// Note [Root cause]
// The root cause is the earliest failure. Failures the launcher saw before it began stopping the
// group come before those that followed its SIGTERM; then the earlier pass of the monitor loop
// (SIGCHLD wakes it at once, so a pass is a few milliseconds wide). Several workers reaped in the
// same pass died too close together for waitpid to order them: when every one of them wrote an
// error file, the one written first (its mtime, in nanoseconds) wins; otherwise (a worker killed by
// a signal writes none, and a mtime cannot be compared with a death nobody timed) the lowest rank.
std::size_t root_cause_index(const std::vector<WorkerExit>& failures) {
  DDP_CHECK(!failures.empty(), "root_cause_index needs at least one failure");
  const auto key = [](const WorkerExit& e) { return std::make_pair(e.after_stop, e.observed_pass); };
  std::size_t best = 0;
  for (std::size_t i = 1; i < failures.size(); ++i) {
    if (key(failures[i]) < key(failures[best])) best = i;
  }
  std::vector<std::size_t> tied;
  for (std::size_t i = 0; i < failures.size(); ++i) {
    if (key(failures[i]) == key(failures[best])) tied.push_back(i);
  }
  const bool all_timed = std::all_of(tied.begin(), tied.end(), [&](std::size_t i) {
    return failures[i].error_written.has_value();
  });
  const auto earlier = [&](std::size_t a, std::size_t b) {
    const WorkerExit& x = failures[a];
    const WorkerExit& y = failures[b];
    if (all_timed && *x.error_written != *y.error_written) return *x.error_written < *y.error_written;
    return x.rank < y.rank;
  };
  return *std::min_element(tied.begin(), tied.end(), earlier);
}

SupervisorResult supervise(const SupervisorOptions& options, const GroupFactory& make_group) {
  SignalPipe signals;
  SupervisorResult result;
  for (int attempt = 0;; ++attempt) {
    Attempt run(options, signals, attempt, make_group(attempt));
    run.run();
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
    spdlog::warn("worker group failed (rank {} exited with {}): restart {} of {}", result.root_cause->rank,
                 describe_exit(*result.root_cause), attempt + 1, options.max_restarts);
  }
}

std::string format_failure_summary(const SupervisorResult& result, const std::string& host_name) {
  const std::string rule(64, '=');
  std::string out = rule + "\n";
  if (!result.root_cause) {
    out += ddp::str("ddp_launch: stopped by ", signal_name(result.launcher_signal.value_or(0)),
                    "; every worker exited cleanly\n");
    return out + rule + "\n";
  }
  const WorkerExit& e = *result.root_cause;
  out += ddp::str("ddp_launch: worker group FAILED", result.attempts > 1 ? ddp::str(" after ", result.attempts, " attempts") : "",
                  result.launcher_signal ? " (launcher received " + signal_name(*result.launcher_signal) + ")" : "", "\n");
  out += "Root cause (first observed failure):\n";
  out += ddp::str("  time      : ", format_time(e.time), "\n");
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
  return out + rule + "\n";
}

}  // namespace ddp::launcher
