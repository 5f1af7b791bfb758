// DDP training with the hierarchical all-reduce equals single-process training on the whole batch:
// in-process ranks on 2 faked hosts x 2 ranks (tests/ddp/in_process_group.h).
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <string>
#include <vector>

#include "ddp/parallel/distributed_data_parallel.h"
#include "tests/ddp/in_process_group.h"

using ddp::testing::borrow;

namespace {

constexpr int kHosts = 2;
constexpr int kPerHost = 2;
constexpr int kWorld = kHosts * kPerHost;
constexpr int kRowsPerRank = 3;
constexpr int kSteps = 3;

// The ranks are threads and torch's default generator is one for the process: a model built on a
// rank's thread could draw numbers another rank's seed left. Every model is built this way and then
// given `initial` (drawn once, on the main thread), so all ranks start from the reference's state.
torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(6, 33), torch::nn::Tanh(), torch::nn::Linear(33, 1));
}

void assign(torch::nn::Sequential& model, const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  const auto parameters = model->parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) parameters[i].copy_(values[i]);
}

// The whole batch of step s; rank r trains on rows [r * kRowsPerRank, (r + 1) * kRowsPerRank).
torch::Tensor inputs(int step) {
  return torch::arange(kWorld * kRowsPerRank * 6, torch::kFloat).reshape({kWorld * kRowsPerRank, 6}).mul(0.01F * (step + 1)).cos();
}
torch::Tensor targets(int step) { return inputs(step).sum(1, true).sin(); }

std::vector<torch::Tensor> parameters_of(torch::nn::Sequential& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("hierarchical: DDP training equals single-process training", "[hierarchical]") {
  torch::manual_seed(7);
  auto reference = make_model();
  const auto initial = parameters_of(reference);
  torch::optim::SGD reference_sgd(reference->parameters(), 0.1);
  for (int step = 0; step < kSteps; ++step) {
    reference_sgd.zero_grad();
    torch::mse_loss(reference->forward(inputs(step)), targets(step)).backward();
    reference_sgd.step();
  }
  const auto expected = parameters_of(reference);

  struct Seen {
    std::vector<torch::Tensor> parameters;
    std::vector<std::string> gradient_algorithms;
  };
  const auto seen = ddp::testing::run_ranks_on_hosts<Seen>(kHosts, kPerHost, [&initial](ddp::ProcessGroup& group) {
    auto local = make_model();
    assign(local, initial);
    ddp::DdpOptions options;
    options.algorithm = ddp::CollectiveAlgorithm::kHierarchical;
    options.first_bucket_cap_bytes = 64;  // several buckets in flight on the worker at once
    options.bucket_cap_bytes = 256;
    ddp::DistributedDataParallel<torch::nn::Sequential> model(local, borrow(group), options);
    torch::optim::SGD sgd(local->parameters(), 0.1);
    for (int step = 0; step < kSteps; ++step) {
      sgd.zero_grad();
      const auto rows = torch::indexing::Slice(group.rank() * kRowsPerRank, (group.rank() + 1) * kRowsPerRank);
      torch::mse_loss(model.forward(inputs(step).index({rows})), targets(step).index({rows})).backward();
      sgd.step();
    }
    Seen s;
    s.parameters = parameters_of(local);
    for (const auto& record : group.recent_collectives()) {
      if (std::string(record.what) == "gradient all-reduce") s.gradient_algorithms.push_back(record.algorithm);
    }
    return s;
  });
  for (const auto& s : seen) {
    REQUIRE(s.parameters.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      CAPTURE(i);
      REQUIRE(torch::allclose(s.parameters[i], expected[i], 1e-5, 1e-6));
    }
    REQUIRE(s.gradient_algorithms.size() >= kSteps);
    for (const auto& algorithm : s.gradient_algorithms) REQUIRE(algorithm == "hierarchical");
  }
}
