// What the collective diagnostics cost on the normal path (figures, not a test; docs/faults.md):
// recording one collective in the ring buffer (see Note [Collective ring buffer]) against a one-rank
// Gloo all-reduce of the same size through ddp::ProcessGroup, which includes that recording.
// A scenario over benchmarks/harness.h: warm-up, timed iterations, a table with a correctness column.
//
//   collective_log_bench [--iters N] [--numel K] [--warmup W] [--csv F] [--json F]   (one rank, file store)
#include <algorithm>
#include <cstdio>
#include <string>

#include "benchmarks/harness.h"
#include "benchmarks/scenarios/runtime.h"
#include "ddp/distributed/detail/collective_log.h"
#include "ddp/distributed/process_group.h"
#include "ddp/runtime/run_main.h"

namespace {

using namespace ddp::bench;

struct Options {
  TimingOptions timing{1000, 200000};
  int64_t numel = 161;  // fault_worker's one gradient bucket (1.3 KiB of doubles)
  OutputOptions output;
};

Options parse(int argc, char** argv) {
  CommandLine cli("collective_log_bench",
                  "The collective ring buffer's cost per collective against a one-rank Gloo all-reduce "
                  "(docs/faults.md). No launcher needed.");
  const Options d;
  cli.add_harness_flags(d.timing);
  cli.add("numel", "doubles per all-reduce", std::to_string(d.numel));
  cli.parse(argc, argv);
  Options o;
  o.timing = cli.timing();
  o.numel = cli.integer("numel", 1, int64_t{1} << 30);
  o.output = cli.output();
  return o;
}

// What ProcessGroup does per collective: begin, attach the work, find it at wait(), finish.
// Returns whether every record ended completed under the sequence number it began with.
bool record_one(ddp::detail::CollectiveLog& log, int64_t numel, const int* work) {
  ddp::CollectiveRecord r;
  r.op = "allreduce";
  r.what = "gradient all-reduce";
  r.bucket = 0;
  r.numel = numel;
  r.dtype = "Double";
  r.bytes = numel * 8;
  r.start_unix_us = ddp::detail::unix_now_us();
  const auto seq = log.begin(r);
  log.attach(seq, work);
  const auto found = log.find_started(work);
  log.finish(found.value_or(seq), ddp::CollectiveState::kCompleted);
  return found == seq;
}

int run(const Options& o) {
  ddp::detail::CollectiveLog log(64);
  int work = 0;
  bool records_ok = true;
  const double record_s = time_loop(o.timing, [&] { records_ok = record_one(log, o.numel, &work) && records_ok; });
  const auto last = log.find(log.last_seq());
  records_ok = records_ok && last && last->state == ddp::CollectiveState::kCompleted;

  auto group = single_process_group();
  auto tensor = torch::ones({o.numel}, torch::kDouble);
  TimingOptions reduce_timing;
  reduce_timing.warmup = std::min<int64_t>(100, o.timing.warmup);
  reduce_timing.iters = std::max<int64_t>(1, o.timing.iters / 20);
  const double reduce_s = time_loop(reduce_timing, [&] { group->allreduce(tensor); });
  // One rank: the sum is the tensor itself, every element still 1.
  const bool reduce_ok = tensor.eq(1).all().item<bool>();
  group->destroy();

  Table table({"operation", "numel", "iters", "ns_per_op", "correct"});
  const auto row = [&](const char* operation, int64_t iters, double seconds, bool ok) {
    table.add_row();
    table.set("operation", operation);
    table.set("numel", std::to_string(o.numel));
    table.set("iters", std::to_string(iters));
    table.set("ns_per_op", seconds * 1e9, 0);
    table.set("correct", ok ? "OK" : "FAIL");
  };
  row("record one collective (begin/attach/find_started/finish)", o.timing.iters, record_s, records_ok);
  row("one-rank Gloo all-reduce through ProcessGroup", reduce_timing.iters, reduce_s, reduce_ok);
  const double share = reduce_s > 0 ? 100.0 * record_s / reduce_s : 0.0;
  emit(table, o.output, {{"benchmark", "collective_log_bench"}, {"record_share_percent", fixed(share, 2)}},
       {"collective_log_bench: the ring buffer's bookkeeping per collective vs a one-rank all-reduce of " +
            std::to_string(o.numel) + " doubles",
        "recording / all-reduce: " + fixed(share, 2) + "%"});
  return records_ok && reduce_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main(argc, argv, [](int c, char** v) {
    return with_usage("collective_log_bench", [&] { return run(parse(c, v)); });
  });
}
