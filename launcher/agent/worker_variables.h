#pragma once
// The environment of each worker: pure functions of the configuration and the rendezvous result.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/rendezvous/rendezvous.h"

namespace ddp::launcher::agent {

// What differs per worker and per attempt.
struct WorkerSlot {
  int local_rank = 0;
  int restart_count = 0;
  std::string error_file;                 // TORCHELASTIC_ERROR_FILE
  std::optional<std::string> visible_gpu;  // CUDA_VISIBLE_DEVICES
  bool virtual_local_rank = false;         // LOCAL_RANK=0 (--virtual_local_rank)
  std::optional<std::string> agent_socket;  // DDP_AGENT_SOCKET (heartbeats), when the job is watched
  std::optional<int> agent_rank;            // DDP_AGENT_RANK, with agent_socket: a spare's launcher rank
  std::optional<std::string> log_dir;      // DDP_LOG_DIR: the attempt's log folder (--log_dir only)
  std::vector<int> cpus;                   // --cpu_bind: the CPUs it is pinned to (empty: not pinned)
  std::string signals_to_handle;           // TORCHELASTIC_SIGNALS_TO_HANDLE (--signals_to_handle)
  std::optional<double> join_timeout_s;    // DDP_JOIN_TIMEOUT: --rdzv_timeout (--rdzv_conf join_timeout)
  // --recovery live: DDP_LIVE_STORE, DDP_LIVE_PREFIX, DDP_LIVE_MEMBER (See Note [Live recovery with
  // ddp_launch] in launcher/agent/live_recovery.cpp).
  struct LivePlace {
    std::string store;   // "HOST:PORT" of the rendezvous store
    std::string prefix;  // the job's keys in it
    std::string member;  // this worker process's member id
    bool spare = false;  // DDP_LIVE_SPARE=1 (--spares): RANK and LOCAL_RANK are its node's first worker's
  };
  std::optional<LivePlace> live;
};

// rank = node_rank * nproc_per_node + local_rank (every node runs the same number of workers).
int global_rank(const rendezvous::NodeAssignment& node, int local_rank);

// The variables ddp_launch sets for one worker (not the inherited ones), in a stable order.
std::vector<std::pair<std::string, std::string>> launcher_variables(const rendezvous::NodeAssignment& node,
                                                                    const WorkerSlot& slot);

// Whether OMP_NUM_THREADS=1 is added (torchrun: unset and more than one worker on the node).
bool needs_omp_default(const std::map<std::string, std::string>& inherited, int nproc_per_node);

// OMP_NUM_THREADS the launcher adds for a worker, if any: unset by the user and pinned (--cpu_bind):
// its CPU count (see Note [CPU binding] in launcher/resources/resources.h); else 1 when needs_omp_default().
std::optional<std::string> omp_threads_default(const std::map<std::string, std::string>& inherited,
                                               int nproc_per_node, const WorkerSlot& slot);

// The complete environment of a worker: inherited variables, overridden by the launcher's, plus
// omp_threads_default(). Returned as "KEY=VALUE" strings for execve.
std::vector<std::string> worker_environment(const std::map<std::string, std::string>& inherited,
                                            const rendezvous::NodeAssignment& node, const WorkerSlot& slot);

}  // namespace ddp::launcher::agent
