#pragma once
// Runs the real build/bin/ddp_launch from tests: bounded waits, captured output, no leftovers.
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher::testing {

// A scratch folder, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct LaunchOutcome {
  int exit_code = -1;            // 128+N when the launcher died of signal N
  std::string out;
  std::string err;
  double seconds = 0;
};

// A running ddp_launch (or any program) with its stdout/stderr captured.
class Child {
 public:
  // argv[0] is run as is; env: the test's environment minus SLURM_* and OMP_NUM_THREADS, plus extra.
  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& extra_env = {});
  ~Child();  // SIGKILLs the child if it still runs
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to timeout; returns nullopt on timeout (the child keeps running).
  std::optional<LaunchOutcome> wait(std::chrono::milliseconds timeout);
  // Reads its output until its stderr holds `text`; false when it did not within timeout.
  bool wait_for_err(const std::string& text, std::chrono::milliseconds timeout);
  // What its stderr has held so far (for a failure's message), reading what is there.
  const std::string& err_so_far();
  void signal(int sig) const { ::kill(pid_, sig); }

 private:
  void pump();  // reads what its pipes have, waiting up to 20 ms
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool done_ = false;
  LaunchOutcome outcome_;
  std::chrono::steady_clock::time_point start_;
};

// Runs to completion; FAILs the test (and kills the child) when it takes longer than timeout.
LaunchOutcome run_launcher(const std::vector<std::string>& launcher_args,
                           const std::map<std::string, std::string>& extra_env = {},
                           std::chrono::milliseconds timeout = std::chrono::seconds(30));

// Waits until `count` files whose names start with prefix exist in dir (bounded).
bool wait_for_files(const std::string& dir, const std::string& prefix, size_t count,
                    std::chrono::milliseconds timeout);

std::vector<std::string> list_dir(const std::string& dir);
// The folders of runs `run_id` below a --log_dir (<run_id>_<random>, see Note [Log folders]), sorted.
std::vector<std::string> run_folders(const std::string& log_dir, const std::string& run_id);
// The one run folder of `run_id` below log_dir (the test fails unless there is exactly one).
std::string run_folder(const std::string& log_dir, const std::string& run_id);
std::string read_text(const std::string& path);

// A worker's record (see launch_test_worker.cpp): its env, argv and pid.
struct WorkerRecord {
  int pid = 0;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
};
WorkerRecord read_record(const std::string& path);

// Whether the process exists (and is not a zombie).
bool process_alive(int pid);
// Waits until none of pids is alive; returns those still alive after timeout.
std::vector<int> wait_gone(const std::vector<int>& pids, std::chrono::milliseconds timeout);

std::string launcher_path();
std::string worker_path();

// How many lines `text` has ('\n's), and how often `what` occurs in it.
size_t count_lines(const std::string& text);
size_t count_of(const std::string& text, const std::string& what);

}  // namespace ddp::launcher::testing
