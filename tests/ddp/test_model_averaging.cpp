// Post-local SGD and periodic model averaging (ddp/algorithms/model_averaging.h) against closed forms, with
// in-process ranks.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/algorithms/model_averaging.h"
#include "tests/ddp/in_process_group.h"

namespace {

using ddp::testing::borrow;
using ddp::testing::run_ranks;

// One parameter w (3 elements); rank r's loss is (r + 1) * <w, (1, 2, 3)>.
struct ScaledSumImpl : torch::nn::Module {
  ScaledSumImpl() { w = register_parameter("w", torch::zeros({3}, torch::kDouble)); }
  torch::Tensor forward(int rank) { return (w * torch::tensor({1.0, 2.0, 3.0}, torch::kDouble)).sum() * (rank + 1); }
  torch::Tensor w;
};
TORCH_MODULE(ScaledSum);

}  // namespace

TEST_CASE("post-local SGD hook: global average before start_localsgd_iter, the local gradient after", "[hooks]") {
  const int world = 2;
  const auto scales = run_ranks<std::vector<double>>(world, [&](ddp::ProcessGroup& group) {
    ScaledSum net;
    ddp::DistributedDataParallel<ScaledSum> model(net, borrow(group));
    ddp::PostLocalSgdOptions options;
    options.start_localsgd_iter = 2;
    model.register_comm_hook(std::make_shared<ddp::PostLocalSgdHook>(options));
    std::vector<double> out;  // grad / (1, 2, 3) per iteration, when it is that multiple
    for (int t = 0; t < 4; ++t) {
      net->w.mutable_grad() = torch::Tensor();
      model(group.rank()).backward();
      const auto ratio = net->w.grad() / torch::tensor({1.0, 2.0, 3.0}, torch::kDouble);
      out.push_back((ratio - ratio[0]).abs().max().item<double>() < 1e-12 ? ratio[0].item<double>() : -1);
    }
    return out;
  });
  for (int r = 0; r < world; ++r) {
    const auto& s = scales[static_cast<std::size_t>(r)];
    CAPTURE(r, s);
    REQUIRE(s[0] == Approx(1.5).epsilon(1e-12));  // (1 + 2) / 2
    REQUIRE(s[1] == Approx(1.5).epsilon(1e-12));
    REQUIRE(s[2] == Approx(r + 1.0).epsilon(1e-12));
    REQUIRE(s[3] == Approx(r + 1.0).epsilon(1e-12));
  }
}

TEST_CASE("periodic model averager: averages at warmup + k * period, leaves the rest local", "[hooks]") {
  const int world = 3, steps = 7;
  const ddp::ModelAveragerOptions options{2, 1};  // period 2, warm-up 1: steps 1, 3, 5
  const auto values = run_ranks<std::vector<double>>(world, [&](ddp::ProcessGroup& group) {
    auto p = torch::zeros({4}, torch::kDouble).requires_grad_(true);
    p.mutable_grad() = torch::zeros({4}, torch::kDouble);
    auto no_grad = torch::full({2}, 7.0, torch::kDouble).requires_grad_(true);  // has no gradient: never averaged
    ddp::PeriodicModelAverager averager(borrow(group), options);
    std::vector<double> out;
    for (int t = 0; t < steps; ++t) {
      {
        torch::NoGradGuard guard;
        p.add_(static_cast<double>((group.rank() + 1) * (t + 1)));
        no_grad.add_(group.rank());
      }
      averager.average_parameters({p, no_grad});
      out.push_back(p[0].item<double>());
    }
    out.push_back(no_grad[0].item<double>());
    out.push_back(static_cast<double>(averager.step()));
    return out;
  });
  // Closed form: x_r += (r + 1)(t + 1) at each step; at t = 1, 3, 5 every x_r becomes the mean.
  std::vector<double> x(world, 0.0);
  for (int t = 0; t < steps; ++t) {
    for (int r = 0; r < world; ++r) x[r] += (r + 1) * (t + 1);
    if (t == 1 || t == 3 || t == 5) {
      const double mean = (x[0] + x[1] + x[2]) / world;
      for (auto& v : x) v = mean;
    }
    for (int r = 0; r < world; ++r) {
      CAPTURE(t, r);
      REQUIRE(values[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)] == Approx(x[r]).epsilon(1e-12));
    }
  }
  for (int r = 0; r < world; ++r) {
    REQUIRE(values[static_cast<std::size_t>(r)][steps] == 7.0 + r * steps);
    REQUIRE(values[static_cast<std::size_t>(r)][steps + 1] == steps);
  }
}

TEST_CASE("post-local SGD optimizer: local SGD steps, parameters averaged every period", "[hooks]") {
  const int world = 2;
  const auto results = run_ranks<std::vector<double>>(world, [&](ddp::ProcessGroup& group) {
    ScaledSum net;
    ddp::DistributedDataParallel<ScaledSum> model(net, borrow(group));
    ddp::PostLocalSgdOptions hook_options;  // local from the first iteration, no subgroup
    model.register_comm_hook(std::make_shared<ddp::PostLocalSgdHook>(hook_options));
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    ddp::PeriodicModelAverager averager(borrow(group), ddp::ModelAveragerOptions{2, 0});
    ddp::PostLocalSgdOptimizer optimizer(sgd, averager);
    std::vector<double> w0;
    for (int t = 0; t < 4; ++t) {
      optimizer.zero_grad();
      model(group.rank()).backward();
      optimizer.step();
      w0.push_back(net->w[0].item<double>());
    }
    return w0;
  });
  // Closed form: the local gradient of w[0] is r + 1; lr 0.1; averaged after steps 0 and 2:
  // step 0: -0.1(r+1) -> mean -0.15; step 1: -0.15 - 0.1(r+1); step 2: that - 0.1(r+1) -> mean
  // -0.45; step 3: -0.45 - 0.1(r+1).
  const std::vector<std::vector<double>> expected{{-0.15, -0.25, -0.45, -0.55}, {-0.15, -0.35, -0.45, -0.65}};
  for (int r = 0; r < world; ++r) {
    for (int t = 0; t < 4; ++t) {
      CAPTURE(r, t);
      REQUIRE(results[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)] ==
              Approx(expected[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)]).epsilon(1e-12));
    }
  }
}
