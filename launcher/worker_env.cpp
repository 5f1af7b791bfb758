#include "launcher/worker_env.h"

#include <string>

namespace ddp::launcher {

int global_rank(const NodeAssignment& node, int local_rank) {
  return node.node_rank * node.nproc_per_node + local_rank;
}

std::vector<std::pair<std::string, std::string>> launcher_variables(const NodeAssignment& node,
                                                                    const WorkerSlot& slot) {
  const int world = node.nnodes * node.nproc_per_node;
  const std::string rank = std::to_string(global_rank(node, slot.local_rank));
  std::vector<std::pair<std::string, std::string>> vars = {
      {"RANK", rank},
      {"LOCAL_RANK", std::to_string(slot.local_rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(node.nproc_per_node)},
      {"GROUP_RANK", std::to_string(node.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(node.nnodes)},
      // One role per job, as torchrun's default: role ranks equal global ranks.
      {"ROLE_RANK", rank},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", node.master_addr},
      {"MASTER_PORT", std::to_string(node.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(slot.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(node.max_restarts)},
      {"TORCHELASTIC_RUN_ID", node.run_id},
      {"TORCHELASTIC_ERROR_FILE", slot.error_file},
  };
  if (slot.visible_gpu) {
    vars.emplace_back("CUDA_VISIBLE_DEVICES", *slot.visible_gpu);
  }
  if (slot.agent_socket) vars.emplace_back("DDP_AGENT_SOCKET", *slot.agent_socket);
  if (slot.log_dir) vars.emplace_back("DDP_LOG_DIR", *slot.log_dir);
  return vars;
}

bool needs_omp_default(const std::map<std::string, std::string>& inherited, int nproc_per_node) {
  return nproc_per_node > 1 && inherited.find("OMP_NUM_THREADS") == inherited.end();
}

std::optional<std::string> omp_threads_default(const std::map<std::string, std::string>& inherited,
                                               int nproc_per_node, const WorkerSlot& slot) {
  if (inherited.find("OMP_NUM_THREADS") != inherited.end()) return std::nullopt;
  if (!slot.cpus.empty()) return std::to_string(slot.cpus.size());
  if (needs_omp_default(inherited, nproc_per_node)) return "1";
  return std::nullopt;
}

std::vector<std::string> worker_environment(const std::map<std::string, std::string>& inherited,
                                            const NodeAssignment& node, const WorkerSlot& slot) {
  std::map<std::string, std::string> env = inherited;
  for (auto& [key, value] : launcher_variables(node, slot)) env[key] = value;
  if (auto omp = omp_threads_default(inherited, node.nproc_per_node, slot)) env["OMP_NUM_THREADS"] = *omp;
  // Note [GPU numbering]: --gpus and NVML number GPUs in PCI bus order; CUDA's default order
  // (fastest first) can differ, so pin CUDA to PCI order unless the user chose an order.
  if (slot.visible_gpu && env.find("CUDA_DEVICE_ORDER") == env.end()) env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

}  // namespace ddp::launcher
