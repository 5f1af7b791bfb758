// Scenario "allreduce", in the manner of nccl-tests' all_reduce_perf, over ddp::ProcessGroup: for
// each size from --min-bytes doubling to --max-bytes, a correctness round, --warmup untimed and
// --iters timed all-reduces (sum, float32); each --algorithm and --slice-bytes in turn on each size.
//   time   = mean time of one all-reduce, of the slowest rank
//   algbw  = bytes / time
//   busbw  = algbw * 2 (n - 1) / n   (the bytes each rank's link carries in a ring all-reduce,
//                                    comparable across world sizes; nccl-tests' definition)
//   correct: every rank fills rank + 1; after one all-reduce every element must be n (n + 1) / 2.
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <vector>

#include "benchmarks/scenarios/runtime.h"
#include "benchmarks/scenarios/scenarios.h"

namespace ddp::bench {

namespace {

// One all-reduce size under the group's current algorithm and slice size.
struct Measured {
  bool correct = false;  // on every rank
  double seconds = 0;    // mean time of one all-reduce, of the slowest rank
  std::string used;      // the algorithm the timed all-reduces took
};

Measured measure(ProcessGroup& group, int64_t bytes, const BenchOptions& options, std::string& choice) {
  const int rank = group.rank(), world = group.size();
  torch::Tensor buffer = torch::full({bytes / 4}, static_cast<float>(rank + 1));
  group.allreduce(buffer);
  if (group.recent_collectives().back().algorithm == std::string("hierarchical")) choice = group.algorithm_choice();
  const float expected = static_cast<float>(world) * static_cast<float>(world + 1) / 2.0f;
  const double wrong = buffer.ne(expected).sum().item<double>();
  Measured result;
  // Every rank must agree: the largest count of wrong elements over the ranks.
  result.correct = reduce(&group, wrong, c10d::ReduceOp::MAX) == 0;
  buffer.zero_();  // timed rounds sum zeros: values stay finite whatever the iteration count
  for (int64_t i = 0; i < options.warmup; ++i) group.allreduce(buffer);
  group.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < options.iters; ++i) group.allreduce(buffer);
  const double local = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.used = group.recent_collectives().back().algorithm;
  result.seconds = reduce(&group, local, c10d::ReduceOp::MAX) / static_cast<double>(options.iters);
  return result;
}

}  // namespace

int run_allreduce(const BenchOptions& options) {
  const auto group = bench_process_group();
  const int rank = group->rank(), world = group->size();
  Table table({"size_bytes", "count", "type", "redop", "world_size", "iters", "time_us", "algbw_GBps", "busbw_GBps",
               "correct", "algorithm", "slice_bytes"});
  const double bus_factor = 2.0 * (world - 1) / world;
  bool all_correct = true;
  std::string choice;  // what auto and hierarchical came to (ProcessGroup::algorithm_choice)
  for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    // Each algorithm and slice size in turn on the same size: side by side, under the same load.
    for (const std::string& algorithm : options.algorithms) {
      for (const int64_t slice_bytes : options.slice_bytes) {
        group->set_collective_algorithm(parse_collective_algorithm(algorithm));
        if (slice_bytes != BenchOptions::kGroupsSliceBytes) group->set_allreduce_slice_bytes(slice_bytes);
        const Measured m = measure(*group, bytes, options, choice);
        all_correct = all_correct && m.correct;
        if (rank != 0) continue;
        const double algbw = static_cast<double>(bytes) / m.seconds / 1e9;
        table.add_row();
        table.set("size_bytes", std::to_string(bytes));
        table.set("count", std::to_string(bytes / 4));
        table.set("type", "float");
        table.set("redop", "sum");
        table.set("world_size", std::to_string(world));
        table.set("iters", std::to_string(options.iters));
        table.set("time_us", m.seconds * 1e6, 2);
        table.set("algbw_GBps", algbw, 6);
        table.set("busbw_GBps", algbw * bus_factor, 6);
        table.set("correct", m.correct ? "OK" : "FAIL");
        table.set("algorithm", algorithm == "auto" ? "auto:" + m.used : algorithm);
        table.set("slice_bytes", std::to_string(group->allreduce_slice_bytes()));
      }
    }
  }
  if (rank == 0) {
    emit(table, options,
         {{"scenario", "allreduce"}, {"world_size", std::to_string(world)}, {"backend", group->backend_name()},
          {"algbw", "bytes / time"}, {"busbw", "algbw * 2 * (n - 1) / n"}},
         {"allreduce_bench: world " + std::to_string(world) + ", backend " + group->backend_name() +
              ", float32 sum over ddp::ProcessGroup::allreduce, " + std::to_string(options.warmup) + " warm-up + " +
              std::to_string(options.iters) + " timed iterations per size",
          "time = mean per all-reduce of the slowest rank; algbw = bytes / time; busbw = algbw * 2 (n - 1) / n; "
          "GB = 1e9 bytes",
          "correct: each rank fills rank + 1, every element must equal n (n + 1) / 2 after one all-reduce",
          "algorithm: " + (choice.empty() ? std::string("flat throughout") : choice)});
  }
  group->barrier();
  return all_correct ? 0 : 1;
}

}  // namespace ddp::bench
