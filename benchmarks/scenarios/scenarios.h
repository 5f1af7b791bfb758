#pragma once
// The scenarios of ddp_bench and allreduce_bench, one file each (nccl-tests style). Free of LibTorch
// headers: the mains that dispatch to them compile in a second.
#include "benchmarks/harness.h"

namespace ddp::bench {

// model x mode x batch training steps (benchmarks/scenarios/train.cpp).
int run_train(const BenchOptions& options);
// all-reduce sizes from --min-bytes to --max-bytes (benchmarks/scenarios/allreduce.cpp).
int run_allreduce(const BenchOptions& options);

// Dispatches on options.scenario.
inline int run_scenario(const BenchOptions& options) {
  return options.scenario == "allreduce" ? run_allreduce(options) : run_train(options);
}

}  // namespace ddp::bench
