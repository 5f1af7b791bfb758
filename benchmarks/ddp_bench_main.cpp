// build/bin/ddp_bench: training benchmarks (and, with --scenario allreduce, the all-reduce one).
// docs/benchmarks.md has the commands and the figures.
#include "benchmarks/scenarios/scenarios.h"
#include "ddp/runtime/run_main.h"

int main(int argc, char** argv) {
  return ddp::run_main(argc, argv, [](int c, char** v) { return ddp::bench::bench_main(c, v, "train", ddp::bench::run_scenario); });
}
