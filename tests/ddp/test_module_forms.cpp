// DistributedDataParallel's three module forms (See Note [Module forms]) and its module-like API,
// with in-process ranks (tests/ddp/in_process_group.h): a plain module object by reference, a
// std::shared_ptr and a TORCH_MODULE holder each train to the same averaged gradient, deduced by
// class template argument deduction; and ddp::DistributedSampler takes its rank from the group.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <memory>
#include <type_traits>
#include <vector>

#include "ddp/ddp.h"
#include "tests/ddp/in_process_group.h"

namespace {

using ddp::testing::run_ranks;

// LibTorch's style of a user model: a plain struct, members registered in the constructor.
struct Net : torch::nn::Module {
  Net() {
    fc = register_module("fc", torch::nn::Linear(3, 1));
    norm = register_module("norm", torch::nn::BatchNorm1d(1));
    torch::NoGradGuard no_grad;
    fc->weight.fill_(0.5);
    fc->bias.fill_(0.0);
  }
  torch::Tensor forward(torch::Tensor x) { return norm(fc(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};

struct NetHolderImpl : Net {};
TORCH_MODULE(NetHolder);

static_assert(ddp::detail::module_form<Net>() == ddp::ModuleForm::kReference);
static_assert(ddp::detail::module_form<std::shared_ptr<Net>>() == ddp::ModuleForm::kSharedPtr);
static_assert(ddp::detail::module_form<NetHolder>() == ddp::ModuleForm::kHolder);
static_assert(ddp::detail::module_form<torch::nn::Linear>() == ddp::ModuleForm::kHolder);
static_assert(ddp::detail::module_form<Net*>() == ddp::ModuleForm::kUnsupported);
static_assert(ddp::detail::module_form<int>() == ddp::ModuleForm::kUnsupported);
static_assert(ddp::detail::module_form<std::shared_ptr<int>>() == ddp::ModuleForm::kUnsupported);

// Rank r feeds inputs (r + 1) * ones, so the averaged weight gradient differs from every local one.
torch::Tensor input(int rank) { return torch::ones({4, 3}) * static_cast<float>(rank + 1) + torch::arange(4).unsqueeze(1); }

// A function written against the wrapper, as a ported train() is: it uses only module-like calls.
template <class Wrapper>
std::vector<float> train_step(Wrapper& model, int rank) {
  model.train();
  model.zero_grad();
  auto loss = model(input(rank)).pow(2).sum();
  loss.backward();
  std::vector<float> grad;
  for (const auto& p : model.parameters()) {
    auto flat = p.grad().reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) grad.push_back(flat[i].template item<float>());
  }
  return grad;
}

std::vector<std::vector<float>> run_form(int form) {
  return run_ranks<std::vector<float>>(2, [form](ddp::ProcessGroup& group) {
    std::shared_ptr<ddp::ProcessGroup> pg(&group, [](ddp::ProcessGroup*) {});
    if (form == 0) {
      Net model;
      ddp::DistributedDataParallel ddp_model(model, pg);
      static_assert(std::is_same_v<decltype(ddp_model), ddp::DistributedDataParallel<Net>>);
      // Non-owning: the wrapper's module is the caller's object.
      if (&ddp_model.module() != &model || ddp_model.operator->() != &model) throw ddp::Error("not the same object");
      return train_step(ddp_model, group.rank());
    }
    if (form == 1) {
      auto model = std::make_shared<Net>();
      ddp::DistributedDataParallel ddp_model(model, pg);
      static_assert(std::is_same_v<decltype(ddp_model), ddp::DistributedDataParallel<std::shared_ptr<Net>>>);
      if (ddp_model.module().get() != model.get()) throw ddp::Error("not the same module");
      return train_step(ddp_model, group.rank());
    }
    NetHolder model;
    ddp::DistributedDataParallel ddp_model(model, pg);
    static_assert(std::is_same_v<decltype(ddp_model), ddp::DistributedDataParallel<NetHolder>>);
    static_assert(std::is_same_v<decltype(ddp_model.operator->()), NetHolderImpl*>);
    if (ddp_model.module().get() != model.get()) throw ddp::Error("not the same module");
    return train_step(ddp_model, group.rank());
  });
}

}  // namespace

TEST_CASE("module forms: by reference, shared_ptr and holder all average the gradient over ranks", "[reducer]") {
  const auto reference = run_form(0);
  REQUIRE(reference.size() == 2);
  REQUIRE(reference[0].size() == 4 + 2);  // fc weight 3, fc bias 1, norm weight 1, norm bias 1
  CHECK(reference[0] == reference[1]);     // averaged: the same on both ranks
  // The average is not rank 0's own gradient: one rank, same input, gives something else.
  const auto alone = run_ranks<std::vector<float>>(1, [](ddp::ProcessGroup& group) {
    std::shared_ptr<ddp::ProcessGroup> pg(&group, [](ddp::ProcessGroup*) {});
    Net model;
    ddp::DistributedDataParallel ddp_model(model, pg);
    return train_step(ddp_model, 0);
  });
  CHECK(alone[0] != reference[0]);
  for (int form : {1, 2}) {
    const auto got = run_form(form);
    CHECK(got[0] == reference[0]);
    CHECK(got[1] == reference[1]);
  }
}

TEST_CASE("module forms: the wrapper is module-like", "[reducer]") {
  const auto results = run_ranks<int>(1, [](ddp::ProcessGroup& group) {
    std::shared_ptr<ddp::ProcessGroup> pg(&group, [](ddp::ProcessGroup*) {});
    Net model;
    ddp::DistributedDataParallel ddp_model(model, pg);
    int checks = 0;
    ddp_model.eval();
    checks += !ddp_model.is_training() && !model.is_training();
    ddp_model.train();
    checks += ddp_model.is_training();
    checks += ddp_model->fc->weight.data_ptr() == model.fc->weight.data_ptr();
    checks += ddp_model.named_parameters().size() == 4 && ddp_model.parameters().size() == 4;
    checks += ddp_model.buffers().size() == 3 && ddp_model.named_buffers().contains("norm.running_mean");
    ddp_model.to(torch::kCPU);  // where it already is: allowed
    ddp_model.to(torch::kFloat);
    try {
      ddp_model.to(torch::kDouble);
    } catch (const ddp::InvalidArgument& error) {
      checks += std::string(error.what()).find("before wrapping") != std::string::npos;
    }
    checks += model.fc->weight.scalar_type() == torch::kFloat;  // the refused to() changed nothing
    ddp_model(input(0)).sum().backward();
    ddp_model.zero_grad();
    checks += !model.fc->weight.grad().defined();
    // An rvalue is moved into a wrapper-owned module (no dangling temporary).
    ddp::DistributedDataParallel<Net> owned(Net(), pg);
    checks += owned.parameters().size() == 4 && owned(input(0)).size(0) == 4;
    return checks;
  });
  CHECK(results[0] == 9);
}

TEST_CASE("DistributedSampler: the group form takes rank and size from the group", "[reducer]") {
  const auto shares = run_ranks<std::vector<int64_t>>(3, [](ddp::ProcessGroup& group) {
    ddp::DistributedSampler sampler(10, group);
    ddp::samplers::DistributedSamplerOptions options(group.size(), group.rank());
    if (sampler.indices() != ddp::samplers::DistributedSampler(10, options).indices()) throw ddp::Error("differs");
    return sampler.indices();
  });
  CHECK(shares[0].size() == 4);
  CHECK(shares[0] != shares[1]);
  CHECK(shares[1] != shares[2]);
}
