// DataParallel over CPU replicas (see Note [CPU replicas] in ddp/parallel/data_parallel.h): training equals
// single-process training on the whole batch; each replica's thread has its own intra-op count;
// autocast reaches the replicas.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/Parallel.h>

#include <thread>
#include <vector>

#include "ddp/amp/autocast.h"
#include "ddp/parallel/data_parallel.h"

namespace {

// Cloneable: DataParallel copies the module into each replica.
struct NetImpl : torch::nn::Cloneable<NetImpl> {
  NetImpl() { reset(); }
  void reset() override {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)));
    fc = register_module("fc", torch::nn::Linear(4 * 6 * 6, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc(torch::relu(conv(x)).flatten(1)); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

torch::Tensor flat_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : module.parameters()) flat.push_back(p.detach().flatten());
  return torch::cat(flat);
}

// Trains `steps` SGD-with-momentum steps on fixed batches of 10 samples; replicas == 0: no DataParallel.
torch::Tensor train(int replicas, int steps) {
  torch::manual_seed(3);
  // The batches first: a replica's clone() runs reset(), which draws from the global generator.
  std::vector<torch::Tensor> xs, ys;
  for (int step = 0; step < steps; ++step) {
    xs.push_back(torch::randn({10, 1, 8, 8}));
    ys.push_back(torch::randint(0, 5, {10}, torch::kInt64));
  }
  Net net;
  std::unique_ptr<ddp::DataParallel<Net>> dp;
  if (replicas > 0) {
    ddp::DataParallelOptions options;
    options.devices = ddp::cpu_replicas(replicas);
    options.replica_threads = 1;
    dp = std::make_unique<ddp::DataParallel<Net>>(net, options);
  }
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    const torch::Tensor& x = xs[static_cast<size_t>(step)];
    const torch::Tensor& y = ys[static_cast<size_t>(step)];
    const torch::Tensor out = dp ? dp->forward(x) : net->forward(x);
    torch::nn::functional::cross_entropy(out, y).backward();
    optimizer.step();
    optimizer.zero_grad();
  }
  return flat_parameters(*net);
}

}  // namespace

TEST_CASE("DataParallel with N CPU replicas trains the parameters of single-process training", "[data_parallel]") {
  const torch::Tensor single = train(0, 6);
  for (int replicas : {1, 2, 3}) {
    CAPTURE(replicas);
    const torch::Tensor parallel = train(replicas, 6);
    CHECK(torch::allclose(parallel, single, /*rtol=*/1e-5, /*atol=*/1e-6));
    CHECK(!torch::equal(parallel, train(0, 5)));  // the steps did change the parameters
  }
  CHECK_THROWS_AS(ddp::cpu_replicas(0), ddp::InvalidArgument);
}

TEST_CASE("at::set_num_threads in a replica's thread leaves the caller's intra-op count", "[data_parallel]") {
  at::set_num_threads(2);
  int seen_in_worker = 0;
  std::thread worker([&] {
    at::set_num_threads(1);
    seen_in_worker = at::get_num_threads();
  });
  worker.join();
  CHECK(seen_in_worker == 1);
  CHECK(at::get_num_threads() == 2);  // See Note [CPU replicas].
}

TEST_CASE("DataParallel replicas run under the caller's autocast and grad mode", "[data_parallel]") {
  torch::manual_seed(4);
  Net net;
  ddp::DataParallelOptions options;
  options.devices = ddp::cpu_replicas(2);
  ddp::DataParallel<Net> dp(net, options);
  const torch::Tensor x = torch::randn({4, 1, 8, 8});
  {
    ddp::amp::AutocastScope autocast(torch::kCPU, torch::kBFloat16);
    CHECK(dp(x).scalar_type() == torch::kBFloat16);
  }
  CHECK(dp(x).scalar_type() == torch::kFloat);
  torch::NoGradGuard no_grad;
  CHECK(!dp(x).requires_grad());
}
