// PowerSGD's later stages run as soon as a bucket's P all-reduce ends, while backward still
// computes (Note [PowerSGD stages] in ddp/algorithms/detail/powersgd_stages.cpp): observed by the order of events,
// never by time. In-process ranks (tests/ddp/in_process_group.h).
#include <catch2/catch.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/algorithms/powersgd.h"
#include "tests/ddp/in_process_group.h"

namespace {

struct ThreeLayersImpl : torch::nn::Module {
  ThreeLayersImpl()
      : fc1(register_module("fc1", torch::nn::Linear(12, 24))),
        fc2(register_module("fc2", torch::nn::Linear(24, 24))),
        fc3(register_module("fc3", torch::nn::Linear(24, 6))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))).square().sum(); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(ThreeLayers);

// What one rank saw, in the order it happened: "stage K" when bucket K's stages ended, "last
// gradient" when a gradient of the deepest layer (fc1's weight, among the last to be ready, after
// bucket 0's) arrived, before its gradient-ready callback; "backward ended" once backward() returned.
struct Record {
  std::vector<std::string> events;
  std::size_t buckets = 0;
  torch::Tensor fc2_grad;
};

}  // namespace

TEST_CASE("powersgd: a bucket's stages end before backward does when it is not the last bucket", "[hooks]") {
  const auto records = ddp::testing::run_ranks<Record>(2, [](ddp::ProcessGroup& group) {
    ThreeLayers net;
    ddp::DdpOptions options;
    options.bucket_cap_bytes = options.first_bucket_cap_bytes = 1;  // one parameter per bucket
    ddp::DistributedDataParallel<ThreeLayers> model(
        net, std::shared_ptr<ddp::ProcessGroup>(&group, [](ddp::ProcessGroup*) {}), options);
    ddp::PowerSgdOptions powersgd;
    powersgd.start_powersgd_iter = 2;
    auto hook = std::make_shared<ddp::PowerSgdHook>(powersgd);

    Record record;
    std::mutex mutex;
    std::condition_variable changed;
    bool bucket0_done = false, observing = false;
    hook->set_stage_listener([&](std::size_t bucket) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!observing) return;
      record.events.push_back("stage " + std::to_string(bucket));
      if (bucket == 0) bucket0_done = true;
      changed.notify_all();
    });
    model.register_comm_hook(hook);
    // Before fc1's weight is accumulated (so before the last gradient-ready callback), wait for
    // bucket 0's stages, bounded: stages run only at the end of backward would never come here.
    net->fc1->weight.register_hook([&](const torch::Tensor&) {
      std::unique_lock<std::mutex> lock(mutex);
      if (!observing) return;
      changed.wait_for(lock, std::chrono::seconds(20), [&] { return bucket0_done; });
      record.events.push_back("last gradient");
    });

    auto generator = at::detail::createCPUGenerator(100 + static_cast<std::uint64_t>(group.rank()));
    for (int t = 0; t < 3; ++t) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        observing = t == 2;  // the first compressed iteration
      }
      net->zero_grad();
      model(torch::randn({8, 12}, generator)).backward();
    }
    std::lock_guard<std::mutex> lock(mutex);
    record.events.push_back("backward ended");
    record.buckets = model.bucket_parameter_names().size();
    record.fc2_grad = net->fc2->weight.grad().clone();
    return record;
  });
  for (const auto& record : records) {
    CAPTURE(record.events);
    REQUIRE(record.buckets == 6);
    const auto at = [&](const std::string& event) {
      return std::find(record.events.begin(), record.events.end(), event) - record.events.begin();
    };
    const auto n = static_cast<std::ptrdiff_t>(record.events.size());
    REQUIRE(n == 8);  // 6 stages, the last gradient, the end
    REQUIRE(at("stage 0") < at("last gradient"));
    // Stages end in bucket order (one thread runs them), every one before backward() returns.
    for (std::size_t k = 1; k < record.buckets; ++k) REQUIRE(at("stage " + std::to_string(k - 1)) < at("stage " + std::to_string(k)));
    REQUIRE(at("stage 5") < at("backward ended"));
  }
  REQUIRE(torch::equal(records[0].fc2_grad, records[1].fc2_grad));
}
