#pragma once
// The one process primitive (See Note [One process primitive] in spawn.cpp): every child the
// launcher starts, a worker or an --ssh_cmd, is started by spawn_process.
#include <sched.h>
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher::process {

struct SpawnOptions {
  std::string path;               // run as is (execve): absolute or relative to the working folder
  std::vector<std::string> argv;  // argv[0] included
  std::optional<std::vector<std::string>> env;  // "KEY=VALUE" each; nullopt: the launcher's own
  // A worker: a session of its own (setsid), so that it and its children are signalled together;
  // an --ssh_cmd: a process group of its own, so that a Ctrl-C on the terminal reaches only the
  // launcher, which stops the hosts in order.
  bool new_session = true;
  int death_signal = SIGKILL;  // what the child gets when the launcher dies (PR_SET_PDEATHSIG)
  enum class Stdin { kInherit, kNull, kPipe } stdin_from = Stdin::kInherit;
  std::optional<cpu_set_t> cpus;  // its CPUs (See Note [CPU binding]); nullopt: the launcher's
};

struct SpawnedProcess {
  pid_t pid = -1;
  int stdin_fd = -1;  // the write end, with Stdin::kPipe
  int stdout_fd = -1;  // the read ends of its output pipes (close-on-exec, blocking)
  int stderr_fd = -1;
};

// Forks and execs. Throws ddp::Error (no child left, no descriptor leaked) when a pipe or the fork
// fails; a failed exec is the child's exit code 127 with one line on its stderr.
SpawnedProcess spawn_process(const SpawnOptions& options);

// Closes `fd` unless it is -1 already, and sets it to -1.
void close_fd(int& fd);

// Writes everything, waiting (bounded per try) when a non-blocking console is full; drops the data
// when the console or log is gone (EPIPE, disk full): supervising goes on.
void write_or_drop(int fd, std::string_view data);

// "SIGTERM" for 15, "signal 99" for unknown numbers.
std::string signal_name(int signal);

// The steady clock's time `s` seconds from now: the supervision loops' deadlines.
inline std::chrono::steady_clock::time_point after_seconds(double s) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace ddp::launcher::process
