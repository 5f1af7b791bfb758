#include "launcher/agent/worker_variables.h"

#include <string>

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/str.h"

namespace ddp::launcher::agent {

// Note [GPU numbering]
// ~~~~~~~~~~~~~~~~~~~~
// --gpus and NVML number GPUs in PCI bus order; CUDA's default order (fastest first) can differ, so
// the launcher pins CUDA to PCI order unless the user chose an order.

// Note [torchrun's worker environment]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A worker gets every variable torchrun 2.13 sets (checked against the venv's torchrun by a worker
// that records its environment): the ranks, ROLE_*, GROUP_*, MASTER_*, TORCHELASTIC_* and
// TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless the user set it. One is left out on purpose:
// TORCHELASTIC_USE_AGENT_STORE=True tells a Python worker that the agent serves the store on
// MASTER_PORT, so its env:// init only connects; ddp_launch serves no store for its workers (rank 0
// does, as under a plain `MASTER_ADDR=... python train.py`), so the variable is never true here and
// never set: set to True it would leave every Python rank waiting for a store nobody serves.

int global_rank(const rendezvous::NodeAssignment& node, int local_rank) {
  return node.node_rank * node.nproc_per_node + local_rank;
}

std::vector<std::pair<std::string, std::string>> launcher_variables(const rendezvous::NodeAssignment& node,
                                                                    const WorkerSlot& slot) {
  const int world = node.nnodes * node.nproc_per_node;
  // A spare has no rank until it is claimed (FaultTolerant gives it one): it gets its node's first
  // worker's, so that the torchrun variables stay valid (See Note [Hot spares in ddp_launch]).
  const bool spare = slot.live && slot.live->spare;
  const int local_rank = spare ? 0 : slot.local_rank;
  const std::string rank = std::to_string(global_rank(node, local_rank));
  std::vector<std::pair<std::string, std::string>> vars = {
      {env::kRank, rank},
      {env::kLocalRank, std::to_string(slot.virtual_local_rank ? 0 : local_rank)},
      {env::kWorldSize, std::to_string(world)},
      {env::kLocalWorldSize, std::to_string(node.nproc_per_node)},
      {env::kGroupRank, std::to_string(node.node_rank)},
      {env::kGroupWorldSize, std::to_string(node.nnodes)},
      // One role per job, as torchrun's default: role ranks equal global ranks.
      {env::kRoleName, node.role},
      {env::kRoleRank, rank},
      {env::kRoleWorldSize, std::to_string(world)},
      {env::kMasterAddr, node.master_addr},
      {env::kMasterPort, std::to_string(node.master_port)},
      {env::kRestartCount, std::to_string(slot.restart_count)},
      {env::kMaxRestarts, std::to_string(node.max_restarts)},
      {env::kRunId, node.run_id},
      {env::kErrorFile, slot.error_file},
      {env::kSignalsToHandle, slot.signals_to_handle},
  };
  if (slot.visible_gpu) {
    vars.emplace_back(env::kCudaVisibleDevices, *slot.visible_gpu);
  }
  if (slot.agent_socket) vars.emplace_back(env::kAgentSocket, *slot.agent_socket);
  if (slot.agent_socket && slot.agent_rank) vars.emplace_back(env::kAgentRank, std::to_string(*slot.agent_rank));
  if (slot.log_dir) vars.emplace_back(env::kLogDir, *slot.log_dir);
  if (slot.join_timeout_s) vars.emplace_back(env::kJoinTimeout, ddp::str(*slot.join_timeout_s));
  if (slot.live) {
    vars.emplace_back(env::kLiveStore, slot.live->store);
    vars.emplace_back(env::kLivePrefix, slot.live->prefix);
    vars.emplace_back(env::kLiveMember, slot.live->member);
    if (spare) vars.emplace_back(env::kLiveSpare, "1");
  }
  return vars;
}

bool needs_omp_default(const std::map<std::string, std::string>& inherited, int nproc_per_node) {
  return nproc_per_node > 1 && inherited.find(env::kOmpNumThreads) == inherited.end();
}

std::optional<std::string> omp_threads_default(const std::map<std::string, std::string>& inherited,
                                               int nproc_per_node, const WorkerSlot& slot) {
  if (inherited.find(env::kOmpNumThreads) != inherited.end()) return std::nullopt;
  if (!slot.cpus.empty()) return std::to_string(slot.cpus.size());
  if (needs_omp_default(inherited, nproc_per_node)) return "1";
  return std::nullopt;
}

std::vector<std::string> worker_environment(const std::map<std::string, std::string>& inherited,
                                            const rendezvous::NodeAssignment& node, const WorkerSlot& slot) {
  std::map<std::string, std::string> env = inherited;
  for (auto& [key, value] : launcher_variables(node, slot)) env[key] = value;
  if (auto omp = omp_threads_default(inherited, node.nproc_per_node, slot)) env[env::kOmpNumThreads] = *omp;
  // torchrun's default (See Note [torchrun's worker environment]).
  env.emplace(env::kTorchNcclAsyncErrorHandling, "1");
  // See Note [GPU numbering].
  if (slot.visible_gpu && env.find(env::kCudaDeviceOrder) == env.end()) env[env::kCudaDeviceOrder] = "PCI_BUS_ID";
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

}  // namespace ddp::launcher::agent
