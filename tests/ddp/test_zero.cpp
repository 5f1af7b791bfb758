// ZeroRedundancyOptimizer (ddp/optim/zero_redundancy_optimizer.h) over in-process ranks: the parameters of
// the unsharded optimizer, the state sharded, checkpoints consolidated, resumed at another world size
// and read by Python.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/checkpoint/checkpoint.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "tests/ddp/in_process_group.h"
#include "tests/ddp/test_checkpoint_support.h"
#include "tests/support/temp_dir.h"

using ddp::testing::borrow;

namespace {

using ddp::ZeroRedundancyOptimizer;
namespace optim = torch::optim;

// Parameters of several sizes (the partition has something to balance).
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 8));
    fc3 = register_module("fc3", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::tanh(fc2(torch::tanh(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

torch::Tensor flat(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : params) parts.push_back(p.detach().flatten());
  return torch::cat(parts);
}

enum class Kind { kSgd, kAdam };

std::unique_ptr<optim::Optimizer> unsharded(Kind kind, const std::vector<torch::Tensor>& params) {
  if (kind == Kind::kSgd) return std::make_unique<optim::SGD>(params, optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<optim::Adam>(params, optim::AdamOptions(0.01));
}

std::unique_ptr<ZeroRedundancyOptimizer> sharded(Kind kind, const std::vector<torch::Tensor>& params,
                                                 ddp::ProcessGroup& group) {
  if (kind == Kind::kSgd) {
    return ZeroRedundancyOptimizer::of<optim::SGD>(params, optim::SGDOptions(0.05).momentum(0.9), borrow(group));
  }
  return ZeroRedundancyOptimizer::of<optim::Adam>(params, optim::AdamOptions(0.01), borrow(group));
}

// The gradient of step `step` for parameter i: the same on every rank and at every world size (no
// random generator: the ranks are threads sharing the global one).
torch::Tensor gradient(int step, size_t i, const torch::Tensor& like) {
  const auto n = like.numel();
  return torch::sin(torch::arange(n, torch::kFloat) * 0.37 * (step + 1) + static_cast<double>(i)).view(like.sizes());
}

}  // namespace

TEST_CASE("ZeRO with DDP: the parameters of the unsharded optimizer, state sharded", "[zero]") {
  for (Kind kind : {Kind::kSgd, Kind::kAdam}) {
    for (int world : {1, 2, 3}) {
      CAPTURE(world, kind == Kind::kSgd ? "sgd" : "adam");
      struct Seen {
        torch::Tensor zero, reference;
        int64_t local_bytes = 0, unsharded_bytes = 0, largest_param_bytes = 0;
        std::vector<int> owners;
      };
      const auto seen = ddp::testing::run_ranks<Seen>(world, [&](ddp::ProcessGroup& group) {
        Mlp net, reference;
        ddp::DistributedDataParallel<Mlp> model(net, borrow(group));  // broadcasts rank 0's parameters
        {
          torch::NoGradGuard no_grad;
          for (size_t i = 0; i < net->parameters().size(); ++i) reference->parameters()[i].copy_(net->parameters()[i]);
        }
        auto zero = sharded(kind, net->parameters(), group);
        auto full = unsharded(kind, reference->parameters());
        for (int step = 0; step < 5; ++step) {
          const torch::Tensor x = torch::cos(torch::arange(24, torch::kFloat).view({4, 6}) * (step + 1) + group.rank());
          model(x).pow(2).mean().backward();  // DDP averages the gradients
          for (size_t i = 0; i < net->parameters().size(); ++i) {
            reference->parameters()[i].mutable_grad() = net->parameters()[i].grad().clone();
          }
          zero->step();
          full->step();
          zero->zero_grad();
          full->zero_grad();
        }
        Seen s;
        s.zero = flat(net->parameters());
        s.reference = flat(reference->parameters());
        s.local_bytes = zero->local_state_bytes();
        s.unsharded_bytes = ddp::optimizer_state_bytes(*full);
        for (const auto& p : net->parameters()) {
          s.largest_param_bytes = std::max<int64_t>(s.largest_param_bytes, static_cast<int64_t>(p.nbytes()));
        }
        s.owners = zero->owners();
        return s;
      });
      int64_t total = 0;
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        CHECK(torch::allclose(seen[r].zero, seen[r].reference, /*rtol=*/1e-5, /*atol=*/1e-7));
        CHECK(torch::equal(seen[r].zero, seen[0].zero));
        CHECK(seen[r].owners == seen[0].owners);
        total += seen[r].local_bytes;
        // See Note [ZeroRedundancyOptimizer]: 1/W of the state plus at most one parameter's.
        const int64_t per_param_state = kind == Kind::kSgd ? 1 : 2;
        CHECK(seen[r].local_bytes <=
              seen[r].unsharded_bytes / world + per_param_state * seen[r].largest_param_bytes + 64);
      }
      // Adam's state has a 0-dim "step" tensor per parameter: the shards add up to the whole.
      CHECK(total == seen[0].unsharded_bytes);
    }
  }
}

TEST_CASE("ZeRO: greedy partition by size, as PyTorch's", "[zero]") {
  const auto owners = ddp::testing::run_ranks<std::vector<int>>(2, [](ddp::ProcessGroup& group) {
    std::vector<torch::Tensor> params;
    for (int64_t n : {3, 10, 4, 10, 1}) params.push_back(torch::zeros({n}, torch::requires_grad()));
    return ZeroRedundancyOptimizer::of<optim::SGD>(params, optim::SGDOptions(0.1), borrow(group))->owners();
  });
  // Sorted by size (stable): 10 (#1) -> r0, 10 (#3) -> r1 (10 vs 0), 4 -> r0 (10 vs 10: the lowest
  // rank), 3 -> r1 (14 vs 10), 1 -> r1 (14 vs 13).
  CHECK(owners[0] == std::vector<int>{1, 0, 0, 1, 1});
  CHECK(owners[1] == owners[0]);
}

TEST_CASE("ZeRO checkpoint: consolidated at world size 2, resumed at 3, read by Python", "[zero][python]") {
  ddp::testing::TempDir dir;
  constexpr int kSaveAt = 3, kSteps = 6;
  // The unsharded run.
  torch::manual_seed(9);
  Mlp reference;
  ddp::StateDict initial;  // copies: state_dict() shares the parameters' storage
  for (const auto& item : ddp::state_dict(*reference)) initial.insert(item.key(), item.value().clone());
  auto full = unsharded(Kind::kAdam, reference->parameters());
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < reference->parameters().size(); ++i) {
      reference->parameters()[i].mutable_grad() = gradient(step, i, reference->parameters()[i]);
    }
    full->step();
  }
  const auto run = [&](int world, int from, int to, bool resume) {
    return ddp::testing::run_ranks<torch::Tensor>(world, [&](ddp::ProcessGroup& group) {
      Mlp net;
      ddp::load_state_dict(*net, initial);
      auto zero = sharded(Kind::kAdam, net->parameters(), group);
      if (resume) {
        const auto latest = ddp::find_latest_valid_checkpoint(dir.path);
        if (!latest) throw ddp::Error("no checkpoint to resume");
        ddp::load_checkpoint(latest->path, *net, zero.get());
      }
      for (int step = from; step < to; ++step) {
        for (size_t i = 0; i < net->parameters().size(); ++i) {
          net->parameters()[i].mutable_grad() = gradient(step, i, net->parameters()[i]);
        }
        zero->step();
      }
      if (!resume) {
        if (group.rank() == 0 && group.size() > 1) {
          bool refused = false;
          try {
            zero->check_state_is_whole();
          } catch (const ddp::InvalidArgument&) {
            refused = true;
          }
          if (!refused) throw ddp::Error("saving a sharded state was not refused");
        }
        zero->consolidate_state_dict(0);
        ddp::TrainingProgress progress;
        progress.step = to;
        ddp::save_checkpoint(dir.path, *net, zero.get(), progress, group);
      }
      return flat(net->parameters());
    });
  };
  run(2, 0, kSaveAt, /*resume=*/false);
  const auto resumed = run(3, kSaveAt, kSteps, /*resume=*/true);
  for (const auto& params : resumed) CHECK(torch::allclose(params, flat(reference->parameters()), 1e-5, 1e-7));

  // Python's Adam takes the consolidated state as its own state_dict.
  const auto latest = ddp::list_checkpoints(dir.path).back();  // the one written at world size 2
  const auto output = ddp::testing::checkpoint::run_python(
      "import torch\n"
      "state = torch.load('" + (latest.path / "trainer.pt").string() + "', weights_only=True)['optimizer']\n"
      "params = [torch.zeros(s) for s in [(16, 6), (16,), (8, 16), (8,), (3, 8), (3,)]]\n"
      "adam = torch.optim.Adam(params)\n"
      "adam.load_state_dict(state)\n"
      "print(len(adam.state), int(adam.state[params[0]]['step']))\n",
      dir.path);
  if (!ddp::testing::checkpoint::have_python()) return;
  REQUIRE(output.has_value());
  CHECK(*output == "6 " + std::to_string(kSaveAt) + "\n");
}
