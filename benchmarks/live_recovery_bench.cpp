// Live recovery's time from a lost rank to the survivors' next completed step (figures, not a test;
// docs/faults.md "Live recovery (library)"). In-process ranks (threads over one c10d::HashStore, as
// tests/ddp/in_process_group.h): world ranks train an MLP with DistributedDataParallel and SGD under
// ddp::FaultTolerant; before step --fail-at the last rank marks itself gone, aborts and destroys its
// group (Gloo closes its pairs: what a killed process's sockets do) and leaves. Per run: the time
// from that moment to the end of the survivors' regroup (new group, DDP rebound, state agreement)
// and to their next completed step (the slowest survivor), and the steps they dropped.
//
//   live_recovery_bench [--world N] [--runs R] [--hidden H] [--fail-at S] [--csv F] [--json F]
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/harness.h"
#include "ddp/elastic/fault_tolerant.h"
#include "ddp/elastic/membership.h"
#include "ddp/runtime/run_main.h"

namespace {

using namespace ddp::bench;
using Clock = std::chrono::steady_clock;

struct Options {
  int64_t world = 4;
  int64_t runs = 5;
  int64_t hidden = 512;
  int64_t fail_at = 3;
  OutputOptions output;
};

Options parse(int argc, char** argv) {
  CommandLine cli("live_recovery_bench",
                  "Time from a lost rank to the survivors' next completed step with ddp::FaultTolerant, "
                  "in-process ranks (docs/faults.md).");
  const Options d;
  cli.add_harness_flags(TimingOptions{0, 1});
  cli.add("world", "ranks at the start (the last one is lost)", std::to_string(d.world));
  cli.add("runs", "repetitions", std::to_string(d.runs));
  cli.add("hidden", "width of the MLP's two hidden layers", std::to_string(d.hidden));
  cli.add("fail-at", "the step before which the last rank leaves", std::to_string(d.fail_at));
  cli.parse(argc, argv);
  Options o;
  o.world = cli.integer("world", 2, 64);
  o.runs = cli.integer("runs", 1, 1000);
  o.hidden = cli.integer("hidden", 1, 1 << 14);
  o.fail_at = cli.integer("fail-at", 1, 1000);
  o.output = cli.output();
  return o;
}

struct RunFigures {
  double regroup_s = 0;     // loss -> the slowest survivor's regroup done
  double next_step_s = 0;   // loss -> the slowest survivor's next completed step
  int64_t dropped = 0;      // steps dropped by a survivor (the most)
  int64_t state_bytes = 0;  // parameters of the model, for the table
  std::string error;
};

RunFigures run_once(const Options& o) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(std::chrono::seconds(60));
  const int world = static_cast<int>(o.world);
  std::atomic<int64_t> lost_at_ns{0};
  std::mutex mutex;
  RunFigures figures;
  const auto since_loss = [&](Clock::time_point t) {
    return static_cast<double>(t.time_since_epoch().count() - lost_at_ns.load()) * 1e-9;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        ddp::StoreMembershipOptions membership_options;
        membership_options.initial_size = world;
        membership_options.initial_rank = r;
        auto membership = std::make_shared<ddp::StoreMembership>(store, "rank-" + std::to_string(r), membership_options);
        ddp::FaultTolerantOptions options;
        options.group.timeout = std::chrono::seconds(60);
        Clock::time_point regrouped{};
        options.on_new_group = [&](ddp::ProcessGroup&, const ddp::Membership&) { regrouped = Clock::now(); };
        ddp::FaultTolerant ft(store, membership, options);
        torch::nn::Sequential net(torch::nn::Linear(64, o.hidden), torch::nn::ReLU(),
                                  torch::nn::Linear(o.hidden, o.hidden), torch::nn::ReLU(),
                                  torch::nn::Linear(o.hidden, 10));
        ddp::DistributedDataParallel model(net, ft.group());
        torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
        ft.track(model);
        ft.track(optimizer);
        ft.start();
        int64_t dropped = 0;
        bool after_loss = false;
        while (ft.steps() < o.fail_at + 2) {
          if (r == world - 1 && ft.steps() == o.fail_at) {
            lost_at_ns.store(Clock::now().time_since_epoch().count());
            membership->mark_left(ft.membership().round);
            ft.group()->abort();
            ft.group()->destroy();
            return;
          }
          auto x = torch::randn({32, 64});
          const bool applied = ft.step(
              [&] {
                optimizer.zero_grad();
                torch::nn::functional::cross_entropy(model(x), torch::randint(10, {32})).backward();
              },
              [&] { optimizer.step(); });
          if (!applied) {
            ++dropped;
            after_loss = true;
            continue;
          }
          if (after_loss) {
            const auto done = Clock::now();
            std::lock_guard<std::mutex> lock(mutex);
            figures.regroup_s = std::max(figures.regroup_s, since_loss(regrouped));
            figures.next_step_s = std::max(figures.next_step_s, since_loss(done));
            figures.dropped = std::max(figures.dropped, dropped);
            after_loss = false;
          }
        }
        std::lock_guard<std::mutex> lock(mutex);
        int64_t numel = 0;
        for (const auto& p : net->parameters()) numel += p.numel();
        figures.state_bytes = numel * 4;
      } catch (const std::exception& error) {
        std::lock_guard<std::mutex> lock(mutex);
        figures.error = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return figures;
}

int run(const Options& o) {
  torch::set_num_threads(1);
  std::vector<double> regroup, next_step;
  int64_t dropped = 0, bytes = 0;
  bool ok = true;
  for (int64_t i = 0; i < o.runs; ++i) {
    const RunFigures f = run_once(o);
    if (!f.error.empty()) {
      std::fprintf(stderr, "live_recovery_bench: run %lld failed: %s\n", static_cast<long long>(i), f.error.c_str());
      ok = false;
      continue;
    }
    regroup.push_back(f.regroup_s);
    next_step.push_back(f.next_step_s);
    dropped = std::max(dropped, f.dropped);
    bytes = f.state_bytes;
  }
  Table table({"world", "to", "runs", "median_ms", "min_ms", "max_ms", "steps_dropped", "param_bytes"});
  const auto row = [&](const char* what, const std::vector<double>& samples) {
    const Summary s = summarize(samples);
    table.add_row();
    table.set("world", std::to_string(o.world) + "->" + std::to_string(o.world - 1));
    table.set("to", what);
    table.set("runs", std::to_string(s.count));
    table.set("median_ms", s.median * 1e3, 1);
    table.set("min_ms", s.min * 1e3, 1);
    table.set("max_ms", s.max * 1e3, 1);
    table.set("steps_dropped", std::to_string(dropped));
    table.set("param_bytes", std::to_string(bytes));
  };
  row("regroup done", regroup);
  row("next completed step", next_step);
  emit(table, o.output, {{"benchmark", "live_recovery_bench"}},
       {"live_recovery_bench: a lost rank (its group destroyed: connections closed) to the survivors' regroup "
        "and next completed step, in-process Gloo ranks"});
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main(argc, argv, [](int c, char** v) {
    return with_usage("live_recovery_bench", [&] { return run(parse(c, v)); });
  });
}
