#pragma once
// Process-group set-up and cross-rank reductions shared by the scenarios (header-only: it adds no
// LibTorch translation unit).
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "ddp/process_group.h"

namespace ddp::bench {

// True when a launcher (ddp_launch, torchrun) started this process (it sets WORLD_SIZE).
inline bool under_launcher() { return std::getenv("WORLD_SIZE") != nullptr; }

// The launcher's group (env://), or a group of one over a file store when started alone.
inline std::shared_ptr<ProcessGroup> bench_process_group() {
  if (under_launcher()) return init_process_group(InitOptions().set_backend("gloo"));
  const auto path = std::filesystem::temp_directory_path() / ("ddp_bench_store_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  auto group = init_process_group(
      InitOptions().set_backend("gloo").set_init_method("file://" + path.string()).set_rank(0).set_world_size(1));
  std::filesystem::remove(path);
  return group;
}

// init_process_group already shares the cores out among local ranks (Note [Threads per rank] in
// ddp/process_group.cpp) or applies OMP_NUM_THREADS; --threads overrides both. Returns the count in use.
inline int configure_threads(int requested) {
  if (requested > 0) torch::set_num_threads(requested);
  return torch::get_num_threads();
}

// value reduced over the group (MAX or SUM); value itself without a group.
inline double reduce(ProcessGroup* group, double value, c10d::ReduceOp op) {
  if (group == nullptr || group->size() == 1) return value;
  auto tensor = torch::tensor({value}, torch::kDouble);
  group->allreduce(tensor, op);
  return tensor.item<double>();
}

}  // namespace ddp::bench
