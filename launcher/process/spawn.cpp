#include "launcher/process/spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "ddp/base/error.h"
#include "ddp/base/str.h"

extern char** environ;

// Note [One process primitive]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// As torchrun's subprocess_handler, one function starts every child (the agent decides what to
// start, this executes). Between fork and exec the child may only make async-signal-safe calls, so
// every string is built before the fork. Signals stay blocked across the fork: the child must not
// run the launcher's handlers (they write to the launcher's self-pipe); it puts every caught signal
// back to its default, then unblocks them. It is tied to the launcher (PR_SET_PDEATHSIG), and
// checks getppid() afterwards, so a launcher that died between fork and prctl leaves nothing
// running. It keeps only descriptors 0-2 (close_range), takes its CPUs before exec (every thread
// it starts inherits them), and an exec that fails says why in one line and exits 127.

namespace ddp::launcher::process {
namespace {

// Writes `what`, errno and ")\n" to stderr and exits 127. Async-signal-safe: the digits
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

std::vector<char*> pointers(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

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

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

SpawnedProcess spawn_process(const SpawnOptions& options) {
  int fds[6] = {-1, -1, -1, -1, -1, -1};  // stdin, stdout, stderr pipes: read end, write end
  int* const in = fds;
  int* const out = fds + 2;
  int* const err = fds + 4;
  const auto fail = [&](const char* what, int error) {
    for (int& fd : fds) close_fd(fd);
    throw ddp::Error(ddp::str(what, " failed: ", std::strerror(error)));
  };
  const bool pipe_in = options.stdin_from == SpawnOptions::Stdin::kPipe;
  if ((pipe_in && ::pipe2(in, O_CLOEXEC) != 0) || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    fail("pipe2", errno);
  }
  const std::vector<char*> argv = pointers(options.argv);
  const std::vector<char*> envp = options.env ? pointers(*options.env) : std::vector<char*>{};
  char* const* const env = options.env ? envp.data() : environ;
  const char* const path = options.path.c_str();
  const pid_t launcher = ::getpid();
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (options.new_session) {
      ::setsid();
    } else {
      ::setpgid(0, 0);
    }
    ::prctl(PR_SET_PDEATHSIG, options.death_signal);
    if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl: do not run orphaned
    if (pipe_in) {
      ::dup2(in[0], STDIN_FILENO);
    } else if (options.stdin_from == SpawnOptions::Stdin::kNull) {
      const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      ::dup2(null_fd, STDIN_FILENO);
    }
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    if (::close_range(3, ~0U, 0) != 0) {
      for (int fd = 3; fd < 4096; ++fd) ::close(fd);  // kernels before 5.9
    }
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig = 1; sig < NSIG; ++sig) {  // whichever signals the launcher catches (--signals_to_handle)
      struct sigaction current {};
      if (::sigaction(sig, nullptr, &current) == 0 && current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN) {
        ::sigaction(sig, &dfl, nullptr);
      }
    }
    ::sigaction(SIGCHLD, &dfl, nullptr);
    ::sigaction(SIGPIPE, &dfl, nullptr);  // the launcher ignores it; a child expects the default
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (options.cpus && ::sched_setaffinity(0, sizeof *options.cpus, &*options.cpus) != 0) {
      child_exit_with_errno("ddp_launch: --cpu_bind: sched_setaffinity failed (errno ");
    }
    ::execve(path, argv.data(), env);
    child_exit_with_errno("ddp_launch: execve failed (errno ");
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) fail("fork", fork_errno);
  if (!options.new_session) ::setpgid(pid, pid);  // also here: no race with a kill(-pid) before the child ran
  close_fd(in[0]);
  close_fd(out[1]);
  close_fd(err[1]);
  return {pid, in[1], out[0], err[0]};
}

std::string signal_name(int sig) {
  static const std::map<int, const char*> kNames = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},   {SIGTRAP, "SIGTRAP"},
      {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},
      {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"}, {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
      {SIGXCPU, "SIGXCPU"}};
  const auto name = kNames.find(sig);
  return name != kNames.end() ? std::string(name->second) : ddp::str("signal ", sig);
}

}  // namespace ddp::launcher::process
