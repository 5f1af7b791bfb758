#pragma once
// What ddp_bench's train scenario adds for issue 15 (header-only, used by train.cpp): the optimizer
// (--optimizer sgd|adam, --zero for ZeroRedundancyOptimizer), DataParallel's CPU replicas
// (--dp-replicas N) and the optimizer-state memory column.
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "benchmarks/harness.h"
#include "ddp/parallel/data_parallel.h"
#include "ddp/distributed/process_group.h"
#include "ddp/optim/zero_redundancy_optimizer.h"

namespace ddp::bench {

// SGD (momentum 0.9) or Adam, sharded over zero_group when --zero and a group of the DDP run is given.
inline std::unique_ptr<torch::optim::Optimizer> make_bench_optimizer(const BenchOptions& options,
                                                                     const std::vector<torch::Tensor>& parameters,
                                                                     const std::shared_ptr<ProcessGroup>& zero_group) {
  const auto sgd = torch::optim::SGDOptions(0.01).momentum(0.9);
  const auto adam = torch::optim::AdamOptions(1e-3);
  if (options.zero && zero_group) {
    if (options.optimizer == "adam") return ZeroRedundancyOptimizer::of<torch::optim::Adam>(parameters, adam, zero_group);
    return ZeroRedundancyOptimizer::of<torch::optim::SGD>(parameters, sgd, zero_group);
  }
  if (options.optimizer == "adam") return std::make_unique<torch::optim::Adam>(parameters, adam);
  return std::make_unique<torch::optim::SGD>(parameters, sgd);
}

// Bytes of this rank's optimizer state (the shard's with ZeRO).
inline int64_t bench_optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  if (const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer)) return zero->local_state_bytes();
  return optimizer_state_bytes(optimizer);
}

// DataParallel's devices: --dp-replicas N CPU replicas, each with its share of the intra-op threads
// (see Note [CPU replicas] in ddp/parallel/data_parallel.h); otherwise its default (every CUDA device, else the CPU).
inline DataParallelOptions bench_dp_options(const BenchOptions& options) {
  DataParallelOptions dp;
  if (options.dp_replicas > 0) {
    dp.devices = cpu_replicas(options.dp_replicas);
    dp.replica_threads = std::max(1, torch::get_num_threads() / static_cast<int>(options.dp_replicas));
  }
  return dp;
}

}  // namespace ddp::bench
