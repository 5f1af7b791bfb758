#pragma once
// The launcher's plan: what each local worker of one attempt gets (rank, environment, files, console
// and log routing, CPUs), a pure function of the configuration, this node's assignment and the
// attempt. --dry_run prints it; the supervisor starts it. See Note [One plan].
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/config/config.h"
#include "launcher/agent/worker_variables.h"

namespace ddp::launcher {

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

// This node's workers as resolved against the machine, once, at start-up.
struct LocalWorkers {
  int nproc = 1;
  std::vector<std::string> gpus;             // CUDA_VISIBLE_DEVICES of each local rank; empty: unset
  std::vector<std::vector<int>> cpu_slices;  // each local rank's CPUs (--cpu_bind); empty: not pinned
};

// Where the run's files are and what the launcher serves its workers.
struct RunContext {
  std::map<std::string, std::string> inherited;  // the launcher's environment
  std::string run_folder;                        // see Note [Log folders]; a placeholder in a dry run
  std::optional<std::string> agent_socket;       // DDP_AGENT_SOCKET, when the job is watched
  std::string host_name;                         // this machine's, for ${hostname} in the line prefix
};

// The workers of `attempt` (0 for the first, then the restart count). Pure: creates nothing.
std::vector<WorkerLaunch> plan_workers(const LaunchConfig& config, const NodeAssignment& node,
                                       const LocalWorkers& local, const RunContext& run, int attempt);

// plan_workers, with the attempt's folder and each worker's made (See Note [Log folders]): what a
// GroupFactory returns for `attempt`.
std::vector<WorkerLaunch> prepare_attempt(const LaunchConfig& config, const NodeAssignment& node,
                                          const LocalWorkers& local, const RunContext& run, int attempt);

// Whether any stream of any local worker goes to a log file.
bool writes_log_files(const LaunchConfig& config, int nproc);

}  // namespace ddp::launcher
