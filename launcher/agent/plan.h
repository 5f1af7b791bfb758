#pragma once
// The launcher's plan: what each local worker of one attempt gets (rank, environment, files, console
// and log routing, CPUs), a pure function of the configuration, this node's assignment and the
// attempt. --dry_run prints it; the supervisor starts it. See Note [One plan].
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/config/config.h"
#include "launcher/agent/worker_variables.h"
#include "launcher/process/worker_process.h"

namespace ddp::launcher::agent {

// This node's workers as resolved against the machine, once, at start-up.
struct LocalWorkers {
  int nproc = 1;
  int spares = 0;  // --spares: local ranks nproc .. nproc + spares - 1 (See Note [Hot spares in ddp_launch] in plan.cpp)
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
// `respawn`: a --recovery live restart of one worker, which comes back as a spare when the job has
// spares (See Note [Hot spares in ddp_launch] in plan.cpp).
std::vector<process::WorkerLaunch> plan_workers(const config::LaunchConfig& config, const rendezvous::NodeAssignment& node,
                                       const LocalWorkers& local, const RunContext& run, int attempt, bool respawn = false);

// plan_workers, with the attempt's folder and each worker's made (See Note [Log folders]): what a
// GroupFactory returns for `attempt`.
std::vector<process::WorkerLaunch> prepare_attempt(const config::LaunchConfig& config, const rendezvous::NodeAssignment& node,
                                          const LocalWorkers& local, const RunContext& run, int attempt);

// Whether any stream of any local worker goes to a log file.
bool writes_log_files(const config::LaunchConfig& config, int nproc);

}  // namespace ddp::launcher::agent
