// Live recovery with ddp_launch: a small model trained under ddp::FaultTolerant, its membership from
// the launcher (ddp::live_job_from_environment). A lost host costs the survivors the step in flight,
// not their processes; a restarted worker heals from a survivor. See Note [Live recovery with
// ddp_launch] in launcher/live_launch.cpp.
//   ddp_launch --nnodes 2:3 --rdzv_endpoint host0:29400 --rdzv_id job --recovery live
//       build/bin/live_recovery_demo --steps 200   (one command line, on every host)
// Prints "live demo: started pid P ...", one "live demo: step S world W at_ms T" per applied step
// (T: the wall clock, for the recovery figure), and at the end
// "live demo: finished S steps pid P params <FNV-1a of the parameters>" (equal on every rank).
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "ddp/base/error.h"
#include "ddp/fault_tolerant.h"
#include "ddp/fault_tolerant_state.h"
#include "ddp/live_environment.h"
#include "ddp/run_main.h"

namespace {

struct Args {
  std::int64_t steps = 100;
  int step_ms = 0;       // extra time per step, so that a test can act mid-training
  int settle_ms = 2000;  // StoreMembershipOptions::settle_timeout
  int timeout_ms = 10000;  // each collective's bound: the detection bound of a silent host
};

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw ddp::UsageError(flag + " needs a value (flags: --steps --step-ms --settle-ms --timeout-ms)");
    const int value = ddp::parse_int(argv[++i], flag, 0, 1 << 30);
    if (flag == "--steps") {
      args.steps = value;
    } else if (flag == "--step-ms") {
      args.step_ms = value;
    } else if (flag == "--settle-ms") {
      args.settle_ms = value;
    } else if (flag == "--timeout-ms") {
      args.timeout_ms = value;
    } else {
      throw ddp::UsageError("unknown flag " + flag + " (flags: --steps --step-ms --settle-ms --timeout-ms)");
    }
  }
  if (args.settle_ms <= 0 || args.timeout_ms <= 0) throw ddp::UsageError("--settle-ms and --timeout-ms must be > 0");
  return args;
}

long long wall_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

int train(const Args& args) {
  ddp::StoreMembershipOptions membership_options;
  membership_options.settle_timeout = std::chrono::milliseconds(args.settle_ms);
  std::optional<ddp::LiveJob> job = ddp::live_job_from_environment(ddp::process_environment(), membership_options);
  if (!job) throw ddp::UsageError("live_recovery_demo runs under ddp_launch --recovery live (DDP_LIVE_STORE is unset)");
  std::printf("live demo: started pid %d member %s%s\n", static_cast<int>(::getpid()), job->member_id.c_str(),
              job->joining ? " (joining)" : "");
  std::fflush(stdout);
  ddp::FaultTolerantOptions options;
  options.group.timeout = std::chrono::milliseconds(args.timeout_ms);
  options.group.host = job->group_host;
  options.on_new_group = [](ddp::ProcessGroup& group, const ddp::Membership& m) {
    std::printf("live demo: round %llu rank %d world %d\n", static_cast<unsigned long long>(m.round), group.rank(),
                group.size());
    std::fflush(stdout);
  };
  ddp::FaultTolerant ft(job->store, job->membership, options);
  torch::manual_seed(1);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 4));
  ddp::DistributedDataParallel model(net, ft.group());
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  ft.track(model);
  ft.track(optimizer);
  ft.start();
  while (ft.steps() < args.steps) {
    const int world = ft.group()->size();
    auto generator = at::detail::createCPUGenerator(static_cast<std::uint64_t>(ft.steps() * 100 + ft.group()->rank()));
    auto x = at::randn({8, 16}, generator);
    auto y = at::randn({8, 4}, generator);
    const bool applied = ft.step(
        [&] {
          optimizer.zero_grad();
          torch::mse_loss(model(x), y).backward();
          if (args.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(args.step_ms));
        },
        [&] { optimizer.step(); });
    if (applied) {
      std::printf("live demo: step %lld world %d at_ms %lld\n", static_cast<long long>(ft.steps()), world, wall_ms());
      std::fflush(stdout);
    }
  }
  // The store lives in one host's launcher: nobody leaves while another still trains.
  ft.group()->barrier();
  ddp::detail::StateWriter params;
  for (const auto& p : net->parameters()) params.tensor(p);
  std::printf("live demo: finished %lld steps pid %d params %016llx\n", static_cast<long long>(ft.steps()),
              static_cast<int>(::getpid()), static_cast<unsigned long long>(ddp::detail::fnv1a64(params.bytes())));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main(argc, argv, [](int c, char** v) { return train(parse_args(c, v)); });
}
