#include "launcher/worker_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>

#include "ddp/base/error.h"
#include "ddp/base/files.h"

namespace ddp::launcher {
namespace {

int g_signal_pipe_write = -1;  // the only global: a signal handler cannot take arguments

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (g_signal_pipe_write >= 0) {
    [[maybe_unused]] ssize_t n = ::write(g_signal_pipe_write, &byte, 1);
  }
  errno = saved;
}

// Writes everything, waiting (bounded per try) when a non-blocking console is full; drops the data
// when the console or log is gone (EPIPE, disk full): supervising goes on.
void write_or_drop(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 100);
        continue;
      }
      return;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// A new log file (See Note [Log folders]); -1 when the stream goes to no file.
int create_log(const std::string& path) {
  if (path.empty()) return -1;
  return ddp::create_new_file(path, 0600, /*append=*/true).release();
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

// The affinity mask of a worker, built before fork; nullopt: the worker inherits the launcher's.
std::optional<cpu_set_t> cpu_mask(const std::vector<int>& cpus) {
  if (cpus.empty()) return std::nullopt;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  return set;
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

[[noreturn]] void child_after_fork(pid_t launcher, const char* path, const ExecArgs& args, int out_w,
                                   int err_w, const cpu_set_t* cpus) {
  // Signals are blocked here (see start_worker); handlers go back to the defaults before unblocking.
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
  for (int sig = 1; sig < NSIG; ++sig) {  // whichever signals the launcher catches (--signals_to_handle)
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) == 0 && current.sa_handler == on_signal) ::sigaction(sig, &dfl, nullptr);
  }
  ::sigaction(SIGCHLD, &dfl, nullptr);
  ::sigaction(SIGPIPE, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // See Note [CPU binding] in launcher/resources.h: before exec, so every thread the worker starts
  // inherits the mask.
  if (cpus != nullptr && ::sched_setaffinity(0, sizeof *cpus, cpus) != 0) {
    child_exit_with_errno("ddp_launch: --cpu_bind: sched_setaffinity failed (errno ");
  }
  ::execve(path, args.argv.data(), args.envp.data());
  child_exit_with_errno("ddp_launch: execve failed (errno ");
}

void setup_stream(OutputStream& s, int console_fd, int rank) {
  ::fcntl(s.fd, F_SETFL, ::fcntl(s.fd, F_GETFL) | O_NONBLOCK);
  s.console_fd = console_fd;
  s.console_is_terminal = console_fd >= 0 && ::isatty(console_fd) == 1;
  s.prefix = rank_prefix(rank);
  s.rank = rank;
}

}  // namespace

std::string process_state(pid_t pid) {
  const std::string path = ddp::str("/proc/", pid, "/stat");
  std::string stat;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[512];
    const size_t n = std::fread(buf, 1, sizeof buf, f);
    std::fclose(f);
    stat.assign(buf, n);
  }
  // "PID (COMM) S ...": COMM may hold spaces and ')', the state follows the last ')'.
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return ddp::str("unknown (", path, " unreadable)");
  const char state = stat[close + 2];
  const char* meaning = "";
  switch (state) {
    case 'R': meaning = "running"; break;
    case 'S': meaning = "sleeping"; break;
    case 'D': meaning = "uninterruptible sleep"; break;
    case 'Z': meaning = "zombie"; break;
    case 'T': meaning = "stopped"; break;
    case 't': meaning = "tracing stop"; break;
    case 'X': meaning = "dead"; break;
    case 'I': meaning = "idle"; break;
    default: meaning = "?"; break;
  }
  return ddp::str(state, " (", meaning, ")");
}

void signal_group(pid_t pid, int sig) {
  if (::kill(-pid, sig) != 0 && errno == ESRCH) ::kill(pid, sig);
}

SignalPipe::SignalPipe(std::vector<int> forwarded) : forwarded_(std::move(forwarded)) {
  if (forwarded_.empty()) forwarded_.assign(std::begin(kForwardedSignals), std::end(kForwardedSignals));
  if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw ddp::Error(ddp::str("pipe2 failed: ", std::strerror(errno)));
  }
  g_signal_pipe_write = fds_[1];
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : forwarded_) ::sigaction(sig, &sa, &old_[sig]);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sa, &old_[SIGCHLD]);
}

SignalPipe::~SignalPipe() {
  for (int sig : forwarded_) ::sigaction(sig, &old_[sig], nullptr);
  ::sigaction(SIGCHLD, &old_[SIGCHLD], nullptr);
  g_signal_pipe_write = -1;
  ::close(fds_[0]);
  ::close(fds_[1]);
}

std::vector<int> SignalPipe::drain() {
  std::vector<int> sigs;
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(fds_[0], buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < n; ++i) sigs.push_back(buf[i]);
  }
  return sigs;
}

void OutputStream::close_all() {
  if (fd >= 0) ::close(fd);
  if (file_fd >= 0) ::close(file_fd);
  fd = file_fd = -1;
}

bool OutputStream::pump() {
  char buf[65536];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    finish();
    return false;
  }
  const std::string_view bytes(buf, static_cast<size_t>(n));
  if (file_fd >= 0) write_or_drop(file_fd, bytes);
  if (console_fd >= 0 || filtered_fd >= 0) splitter.feed(bytes, [this](std::string_view line) { emit(line); });
  return true;
}

void OutputStream::finish() {
  if (console_fd >= 0 || filtered_fd >= 0) splitter.flush([this](std::string_view line) { emit(line); });
  close_all();
}

void OutputStream::emit(std::string_view line) {
  std::string out;
  out.reserve(prefix.size() + line.size());
  out += prefix;
  out += line;
  if (live != nullptr && console_is_terminal) {  // See Note [Live progress on a terminal]
    if (is_progress_piece(line)) {
      write_or_drop(STDOUT_FILENO, live->update(rank, std::string_view(out).substr(0, out.size() - 1)));
    } else {
      const LiveProgress::Around around = live->line(rank);
      write_or_drop(STDOUT_FILENO, around.before);
      write_or_drop(console_fd, out);
      write_or_drop(STDOUT_FILENO, around.after);
    }
  } else if (console_fd >= 0) {
    // See Note [Progress lines] in launcher/line_splitter.h: on a terminal, an update also erases
    // what a longer previous update left at the end of the line.
    if (console_is_terminal && is_progress_piece(line)) out.insert(out.size() - 1, "\x1b[K");
    write_or_drop(console_fd, out);
  }
  if (filtered_fd >= 0 && filters != nullptr) {
    for (const auto& needle : *filters) {
      if (line.find(needle) == std::string_view::npos) continue;
      write_or_drop(filtered_fd, out);
      break;
    }
  }
}

pid_t start_worker(const std::string& program_path, const std::vector<std::string>& args, const WorkerLaunch& launch,
                   OutputStream& out, OutputStream& err) {
  const pid_t self = ::getpid();
  // Log files are created before fork, so a failure here leaves no worker behind.
  out.file_fd = create_log(launch.stdout_log);
  err.file_fd = create_log(launch.stderr_log);
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw ddp::Error(ddp::str("pipe2 failed: ", std::strerror(errno)));
  out.fd = out_pipe[0];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[1]);
    throw ddp::Error(ddp::str("pipe2 failed: ", std::strerror(errno)));
  }
  err.fd = err_pipe[0];
  ExecArgs exec_args(args, launch.env);
  const std::optional<cpu_set_t> mask = cpu_mask(launch.cpus);
  // Signals stay blocked across fork(): the child must not run our handlers (they would write
  // to the shared self-pipe); it unblocks them after restoring the default dispositions.
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::fork();
  if (pid == 0) {
    child_after_fork(self, program_path.c_str(), exec_args, out_pipe[1], err_pipe[1], mask ? &*mask : nullptr);
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) throw ddp::Error(ddp::str("fork failed: ", std::strerror(fork_errno)));
  setup_stream(out, launch.stdout_to_console ? STDOUT_FILENO : -1, launch.rank);
  setup_stream(err, launch.stderr_to_console ? STDERR_FILENO : -1, launch.rank);
  return pid;
}

}  // namespace ddp::launcher
