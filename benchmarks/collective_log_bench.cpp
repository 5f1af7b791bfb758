// What the collective diagnostics cost on the normal path (figures, not a test; docs/faults.md):
// recording one collective in the ring buffer (Note [Collective ring buffer]) against a one-rank
// Gloo all-reduce of the same size through ddp::ProcessGroup, which includes that recording.
//
//   collective_log_bench [--iters N] [--numel K]      (no launcher needed: one rank, file store)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ddp/collective_log.h"
#include "ddp/base/error.h"
#include "ddp/process_group.h"
#include "ddp/run_main.h"

namespace {

using Clock = std::chrono::steady_clock;

double ns_per(Clock::time_point start, long iterations) {
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(iterations);
}

int bench_main(int argc, char** argv) {
  long iters = 200000;
  long numel = 161;  // fault_worker's one gradient bucket (1.3 KiB of doubles)
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--iters") iters = std::stol(argv[i + 1]);
    else if (flag == "--numel") numel = std::stol(argv[i + 1]);
    else throw ddp::InvalidArgument("usage: collective_log_bench [--iters N] [--numel K]");
  }
  if (iters < 1 || numel < 1) throw ddp::InvalidArgument("--iters and --numel must be positive");

  // What ProcessGroup does per collective: begin, attach the work, find it at wait(), finish.
  ddp::CollectiveLog log(64);
  int work = 0;
  auto start = Clock::now();
  for (long i = 0; i < iters; ++i) {
    ddp::CollectiveRecord r;
    r.op = "allreduce";
    r.what = "gradient all-reduce";
    r.bucket = 0;
    r.numel = numel;
    r.dtype = "Double";
    r.bytes = numel * 8;
    r.start_unix_us = ddp::unix_now_us();
    const auto seq = log.begin(r);
    log.attach(seq, &work);
    log.finish(log.find_started(&work).value_or(seq), ddp::CollectiveState::kCompleted);
  }
  const double record_ns = ns_per(start, iters);

  const std::string store = "/tmp/collective_log_bench_" + std::to_string(::getpid());
  auto group = ddp::init_process_group(
      ddp::InitOptions().set_backend("gloo").set_init_method("file://" + store).set_rank(0).set_world_size(1));
  auto tensor = torch::ones({numel}, torch::kDouble);
  const long reduce_iters = std::max(1L, iters / 20);
  for (int i = 0; i < 100; ++i) group->allreduce(tensor);  // warm-up
  start = Clock::now();
  for (long i = 0; i < reduce_iters; ++i) group->allreduce(tensor);
  const double allreduce_ns = ns_per(start, reduce_iters);
  group->destroy();
  std::remove(store.c_str());

  std::printf("recording one collective (begin, attach, find_started, finish): %.0f ns (%ld iterations)\n",
              record_ns, iters);
  std::printf("one-rank Gloo all-reduce of %ld doubles through ProcessGroup: %.0f ns (%ld iterations)\n", numel,
              allreduce_ns, reduce_iters);
  std::printf("recording / all-reduce: %.2f%%\n", 100.0 * record_ns / allreduce_ns);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ddp::run_main(argc, argv, bench_main); }
