#include "launcher/process/worker_process.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>

#include "ddp/base/error.h"
#include "ddp/base/detail/files.h"
#include "launcher/process/spawn.h"

namespace ddp::launcher::process {
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

// A new log file (See Note [Log folders]); -1 when the stream goes to no file.
int create_log(const std::string& path) {
  if (path.empty()) return -1;
  return ddp::detail::create_new_file(path, 0600, /*append=*/true).release();
}

void setup_stream(OutputStream& s, int console_fd, int rank, const std::string& prefix) {
  ::fcntl(s.fd, F_SETFL, ::fcntl(s.fd, F_GETFL) | O_NONBLOCK);
  s.console_fd = console_fd;
  s.console_is_terminal = console_fd >= 0 && ::isatty(console_fd) == 1;
  s.prefix = prefix.empty() ? rank_prefix(rank) : prefix;  // a WorkerLaunch not from plan_workers: the default
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
  static const std::map<char, const char*> kMeanings = {
      {'R', "running"}, {'S', "sleeping"},     {'D', "uninterruptible sleep"}, {'Z', "zombie"},
      {'T', "stopped"}, {'t', "tracing stop"}, {'X', "dead"},                  {'I', "idle"}};
  const auto meaning = kMeanings.find(state);
  return ddp::str(state, " (", meaning != kMeanings.end() ? meaning->second : "?", ")");
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

void SignalPipe::ignore(int sig) {
  struct sigaction ignored {};
  ignored.sa_handler = SIG_IGN;
  sigemptyset(&ignored.sa_mask);
  ::sigaction(sig, &ignored, nullptr);
  old_[sig] = ignored;  // what the destructor restores
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
  if (collapser != nullptr && console_fd >= 0 && !is_progress_piece(line)) {  // See Note [Collapsed lines]
    collapser->add(rank, line, prefix, LineCollapser::Clock::now());
  } else if (live != nullptr && console_is_terminal) {  // See Note [Progress on a terminal]
    if (is_progress_piece(line)) {
      write_or_drop(STDOUT_FILENO, live->update(rank, std::string_view(out).substr(0, out.size() - 1)));
    } else {
      const TerminalProgress::Around around = live->line(rank);
      write_or_drop(STDOUT_FILENO, around.before);
      write_or_drop(console_fd, out);
      write_or_drop(STDOUT_FILENO, around.after);
    }
  } else if (console_fd >= 0) {
    // See Note [Progress lines] in launcher/process/line_splitter.h: on a terminal, an update also erases
    // what a longer previous update left at the end of the line.
    if (console_is_terminal && is_progress_piece(line)) out.insert(out.size() - 1, "\x1b[K");
    write_or_drop(console_fd, out);
  }
  const auto in_line = [&](const std::string& needle) { return line.find(needle) != std::string_view::npos; };
  if (filtered_fd >= 0 && filters != nullptr && std::any_of(filters->begin(), filters->end(), in_line)) {
    write_or_drop(filtered_fd, out);
  }
}

pid_t start_worker(const std::string& program_path, const std::vector<std::string>& args, const WorkerLaunch& launch,
                   OutputStream& out, OutputStream& err) {
  // Log files are created before fork, so a failure here leaves no worker behind.
  out.file_fd = create_log(launch.stdout_log);
  err.file_fd = create_log(launch.stderr_log);
  SpawnOptions options;
  options.path = program_path;
  options.argv = args;
  options.env = launch.env;
  if (!launch.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : launch.cpus) CPU_SET(cpu, &set);
    options.cpus = set;
  }
  const SpawnedProcess child = spawn_process(options);
  out.fd = child.stdout_fd;
  err.fd = child.stderr_fd;
  setup_stream(out, launch.stdout_to_console ? STDOUT_FILENO : -1, launch.rank, launch.console_prefix);
  setup_stream(err, launch.stderr_to_console ? STDERR_FILENO : -1, launch.rank, launch.console_prefix);
  return child.pid;
}

}  // namespace ddp::launcher::process
