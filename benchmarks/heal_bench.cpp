// A joiner's healing throughput (figures, not a test; docs/faults.md "Healing at link speed"): one
// process per host (scripts/bench-heal.sh runs them on shaped namespace hosts). --members processes
// train a model that holds --state-mib MiB (a frozen parameter, which travels with the state, plus a
// small trained layer) under ddp::FaultTolerant with a ddp::StoreMembership over a TCPStore that
// rank 0 serves; a process started with --join joins the running job and receives the state
// (FaultTolerantOptions::healing: --healing peers or broadcast). The joiner prints
//   heal: <bytes> bytes from <K> rank(s) in <transfer> s, loaded <total> s, group built to trained <S> s
// (FaultTolerant::last_healing(): the chunks' transfer, then the state agreement to the state loaded
// and checked; and from its group built to start()'s return).
//
//   heal_bench --store HOST:PORT --addr ADDR --members N (--rank R | --join) [--state-mib S] [--healing peers|broadcast]
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "benchmarks/harness.h"
#include "ddp/base/error.h"
#include "ddp/elastic/fault_tolerant.h"
#include "ddp/elastic/membership.h"
#include "ddp/runtime/run_main.h"

namespace {

using namespace ddp::bench;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string store_host;
  std::string addr = "127.0.0.1";  // the address this process's Gloo pairs listen on
  int store_port = 0;
  int members = 2;
  int rank = -1;  // -1: the joiner
  int64_t state_mib = 64;
  bool broadcast = false;
  int64_t timeout_s = 60;  // the group's: per chunk (peers) or for the whole broadcast
};

Options parse(int argc, char** argv) {
  CommandLine cli("heal_bench", "A joiner's healing throughput under ddp::FaultTolerant, one process per host.");
  cli.add("store", "HOST:PORT of the job's TCPStore (rank 0 serves it)", "");
  cli.add("addr", "this host's address for the group's connections", "127.0.0.1");
  cli.add("members", "processes of the running job", "2");
  cli.add("rank", "this member's rank (not with --join)", "-1");
  cli.add_switch("join", "join the running job and receive its state");
  cli.add("state-mib", "MiB of state (a frozen parameter)", "64");
  cli.add("healing", "peers (every holder sends chunks) or broadcast (one broadcast, as before)", "peers");
  cli.add("timeout-s", "the group's timeout: per chunk (peers), for the whole state (broadcast)", "60");
  cli.parse(argc, argv);
  Options o;
  const std::string store = cli.text("store");
  const auto colon = store.rfind(':');
  if (colon == std::string::npos || colon == 0) throw ddp::UsageError("--store: expected HOST:PORT, got '" + store + "'");
  o.store_host = store.substr(0, colon);
  o.store_port = static_cast<int>(std::stoi(store.substr(colon + 1)));
  o.addr = cli.text("addr");
  o.members = static_cast<int>(cli.integer("members", 1, 64));
  o.rank = static_cast<int>(cli.integer("rank", -1, o.members - 1));
  if (cli.given("join") == (o.rank >= 0)) throw ddp::UsageError("give --rank R for a member or --join, one of them");
  o.state_mib = cli.integer("state-mib", 1, 1 << 16);
  o.broadcast = cli.choice("healing", {"peers", "broadcast"}) == "broadcast";
  o.timeout_s = cli.integer("timeout-s", 1, 86400);
  return o;
}

struct Net : torch::nn::Module {
  explicit Net(int64_t state_mib) {
    // Frozen: it travels with the state but has no gradient (no DDP bucket of its size).
    register_parameter("state", torch::full({state_mib << 18}, 0.5F), /*requires_grad=*/false);
    head = register_module("head", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(x); }
  torch::nn::Linear head{nullptr};
};

int run(const Options& o) {
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(o.store_port);
  store_options.isServer = o.rank == 0;
  store_options.waitWorkers = false;
  store_options.timeout = std::chrono::minutes(10);
  auto store = c10::make_intrusive<c10d::TCPStore>(o.store_host, store_options);
  ddp::StoreMembershipOptions membership_options;
  membership_options.initial_size = o.members;
  membership_options.initial_rank = o.rank;
  membership_options.joining = o.rank < 0;
  membership_options.settle_timeout = 10s;
  const std::string id = o.rank < 0 ? "joiner" : "member-" + std::to_string(o.rank);
  auto membership = std::make_shared<ddp::StoreMembership>(store, id, membership_options);
  ddp::FaultTolerantOptions options;
  options.group.timeout = std::chrono::seconds(o.timeout_s);
  options.group.host = o.addr;
  options.group.spans_hosts = true;
  options.healing = o.broadcast ? ddp::FaultTolerantOptions::Healing::kBroadcast : ddp::FaultTolerantOptions::Healing::kFromPeers;
  Clock::time_point built{};  // the recovery's group built
  options.on_group_built = [&](ddp::ProcessGroup&, const ddp::Membership&) { built = Clock::now(); };
  ddp::FaultTolerant ft(store, membership, options);
  auto net = std::make_shared<Net>(o.state_mib);
  ddp::DistributedDataParallel model(net, ft.group());
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
  ft.track(model);
  ft.track(optimizer);
  ft.start();
  if (o.rank >= 0) {
    std::printf("heal_bench: member %d trains\n", o.rank);
    std::fflush(stdout);
  }
  if (o.rank < 0) {
    const ddp::FaultTolerant::Healing& h = ft.last_healing();
    const double seconds = std::chrono::duration<double>(Clock::now() - built).count();
    std::printf("heal: %lld bytes from %d rank(s) in %.3f s, loaded %.3f s, group built to trained %.3f s\n",
                static_cast<long long>(h.bytes), h.senders, h.transfer_s, h.total_s, seconds);
    std::fflush(stdout);
  }
  // Members step until the joiner is in (the step's agreement admits it), then one step together.
  const auto deadline = Clock::now() + 30min;
  while (ft.group()->size() < o.members + 1 || ft.steps() < 2) {
    if (Clock::now() > deadline) throw ddp::TimeoutError("heal_bench: the joiner did not come within 30 minutes");
    ft.step([&] {
      optimizer.zero_grad();
      model(torch::ones({2, 16})).sum().backward();
      std::this_thread::sleep_for(20ms);
    }, [&] { optimizer.step(); });
  }
  ft.finish();
  ft.group()->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main(argc, argv, [](int c, char** v) { return run(parse(c, v)); });
}
