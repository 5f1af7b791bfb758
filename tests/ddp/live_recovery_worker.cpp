// One process of tests/ddp/test_live_recovery_procs.sh: a real rank under ddp::FaultTolerant over a
// TCPStore that rank 0 serves on 127.0.0.1 (a free port it writes to PORT_FILE). The rank named
// DIE_RANK raises SIGKILL before step DIE_AT: a process death, whose sockets the kernel closes; nobody
// marks it gone, so the survivors' next round closes after StoreMembershipOptions::settle_timeout.
// Each prints "started pid P" first; the survivors end with one line:
// "rank R pid P steps N world W,W,... params <FNV-1a of the parameters>".
//
//   live_recovery_worker RANK WORLD PORT_FILE STEPS DIE_RANK DIE_AT
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "ddp/base/error.h"
#include "ddp/base/detail/files.h"
#include "ddp/elastic/fault_tolerant.h"
#include "ddp/checkpoint/detail/state_bytes.h"
#include "ddp/elastic/membership.h"
#include "ddp/runtime/run_main.h"

namespace {

using namespace std::chrono_literals;

struct Args {
  int rank = 0;
  int world = 1;
  std::string port_file;
  std::int64_t steps = 0;
  int die_rank = -1;
  std::int64_t die_at = -1;
};

c10::intrusive_ptr<c10d::Store> connect(const Args& args) {
  c10d::TCPStoreOptions options;
  options.isServer = args.rank == 0;
  options.waitWorkers = false;
  options.timeout = 30s;
  if (args.rank == 0) {
    options.port = 0;
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    ddp::detail::write_file_atomically(args.port_file, std::to_string(store->getPort()));
    return store;
  }
  std::string port;
  for (int tries = 0; tries < 3000 && port.empty(); ++tries) {  // rank 0 writes it at once: 30 s at most
    try {
      port = ddp::detail::read_file(args.port_file, 64);
    } catch (const std::exception&) {
      std::this_thread::sleep_for(10ms);
    }
  }
  if (port.empty()) throw ddp::TimeoutError("rank 0 wrote no port file within 30 s");
  options.port = static_cast<std::uint16_t>(std::stoi(port));
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

int train(const Args& args) {
  std::printf("started pid %d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
  auto store = connect(args);
  ddp::StoreMembershipOptions membership_options;
  membership_options.initial_size = args.world;
  membership_options.initial_rank = args.rank;
  membership_options.settle_timeout = 2s;  // the dead process is marked by nobody
  auto membership = std::make_shared<ddp::StoreMembership>(store, "proc-" + std::to_string(args.rank),
                                                           membership_options);
  ddp::FaultTolerantOptions options;
  options.group.timeout = 20s;
  ddp::FaultTolerant ft(store, membership, options);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 4));
  ddp::DistributedDataParallel model(net, ft.group());
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  ft.track(model);
  ft.track(optimizer);
  ft.start();
  std::string worlds;
  while (ft.steps() < args.steps) {
    if (args.rank == args.die_rank && ft.steps() == args.die_at) ::raise(SIGKILL);
    const int world = ft.group()->size();
    auto generator = at::detail::createCPUGenerator(static_cast<std::uint64_t>(ft.steps() * 100 + ft.group()->rank()));
    auto x = at::randn({8, 16}, generator);
    auto y = at::randn({8, 4}, generator);
    const bool applied = ft.step(
        [&] {
          optimizer.zero_grad();
          torch::mse_loss(model(x), y).backward();
        },
        [&] { optimizer.step(); });
    if (applied) worlds += (worlds.empty() ? "" : ",") + std::to_string(world);
  }
  ft.group()->barrier();  // rank 0 serves the store: nobody leaves while another still needs it
  ddp::detail::StateWriter params;
  for (const auto& p : net->parameters()) params.tensor(p);
  std::printf("rank %d pid %d steps %lld world %s params %016llx\n", args.rank, static_cast<int>(::getpid()),
              static_cast<long long>(ft.steps()), worlds.c_str(),
              static_cast<unsigned long long>(ddp::detail::fnv1a64(params.bytes())));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main(argc, argv, [](int c, char** v) {
    if (c != 7) throw ddp::UsageError("usage: live_recovery_worker RANK WORLD PORT_FILE STEPS DIE_RANK DIE_AT");
    Args args;
    args.rank = std::stoi(v[1]);
    args.world = std::stoi(v[2]);
    args.port_file = v[3];
    args.steps = std::stoll(v[4]);
    args.die_rank = std::stoi(v[5]);
    args.die_at = std::stoll(v[6]);
    return train(args);
  });
}
