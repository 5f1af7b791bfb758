// build/bin/allreduce_bench: all-reduce bandwidth over ddp::ProcessGroup, nccl-tests style
// (benchmarks/scenarios/allreduce.cpp has the formulas).
#include "benchmarks/scenarios/scenarios.h"
#include "ddp/runtime/run_main.h"

int main(int argc, char** argv) {
  return ddp::run_main(argc, argv, [](int c, char** v) { return ddp::bench::bench_main(c, v, "allreduce", ddp::bench::run_scenario); });
}
