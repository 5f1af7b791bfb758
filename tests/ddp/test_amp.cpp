// ddp::amp: the autocast scope, and GradScaler against Python's torch.amp.GradScaler("cpu") (the
// reference is computed at test time by tests/ddp/data/grad_scaler_reference.py), alone and with
// DistributedDataParallel over in-process ranks.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "ddp/amp/autocast.h"
#include "ddp/amp/grad_scaler.h"
#include "ddp/base/error.h"
#include "ddp/checkpoint/checkpoint.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "tests/ddp/in_process_group.h"
#include "tests/ddp/test_checkpoint_support.h"
#include "tests/support/temp_dir.h"

using ddp::testing::borrow;

namespace {

using ddp::amp::AutocastScope;
using ddp::amp::GradScaler;
using ddp::amp::GradScalerOptions;

double number(const ddp::StateDict& reference, const std::string& key) {
  const torch::Tensor* value = reference.find(key);
  if (value == nullptr) throw ddp::Error("the reference has no " + key);
  return value->item<double>();
}

const torch::Tensor& tensor(const ddp::StateDict& reference, const std::string& key) {
  const torch::Tensor* value = reference.find(key);
  if (value == nullptr) throw ddp::Error("the reference has no " + key);
  return *value;
}

}  // namespace

TEST_CASE("autocast scope: lower precision inside, the previous state after, nested", "[amp]") {
  const auto a = torch::randn({4, 4});
  REQUIRE(torch::mm(a, a).scalar_type() == torch::kFloat);
  {
    AutocastScope scope(torch::kCPU, torch::kBFloat16);
    CHECK(torch::mm(a, a).scalar_type() == torch::kBFloat16);
    {
      AutocastScope inner(torch::kCPU, torch::kHalf);
      CHECK(torch::mm(a, a).scalar_type() == torch::kHalf);
    }
    CHECK(torch::mm(a, a).scalar_type() == torch::kBFloat16);
    AutocastScope off(torch::kCPU, ddp::amp::Precision::kOff);  // changes nothing
    CHECK(torch::mm(a, a).scalar_type() == torch::kBFloat16);
  }
  CHECK(torch::mm(a, a).scalar_type() == torch::kFloat);
  CHECK_THROWS_AS(AutocastScope(torch::kCPU, torch::kFloat), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::amp::parse_precision("fp8"), ddp::InvalidArgument);
  CHECK(ddp::amp::parse_precision("bf16") == ddp::amp::Precision::kBFloat16);
}

TEST_CASE("GradScaler: the same scales, skips and parameters as Python's GradScaler(\"cpu\")", "[amp][python]") {
  const std::string python = DDP_PYTHON;
  if (python.empty()) {
    WARN("skipped: no Python with torch (configure with -DDDP_PYTHON=/path/to/python)");
    return;
  }
  ddp::testing::TempDir dir;
  const std::string out = dir / "reference.pt";
  const std::string command = python + " " + DDP_TEST_DATA_DIR + "/grad_scaler_reference.py " + out + " 2>/dev/null";
  REQUIRE(std::system(command.c_str()) == 0);
  const ddp::StateDict reference = ddp::load_state_dict_file(out);

  std::vector<torch::Tensor> params;
  for (int i = 0; i < 2; ++i) params.push_back(tensor(reference, "init." + std::to_string(i)).clone().requires_grad_());
  GradScalerOptions options;
  options.init_scale = number(reference, "config.init_scale");
  options.growth_factor = number(reference, "config.growth_factor");
  options.backoff_factor = number(reference, "config.backoff_factor");
  options.growth_interval = static_cast<int64_t>(number(reference, "config.growth_interval"));
  GradScaler scaler(torch::kCPU, options);
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(number(reference, "config.lr"))
                                          .momentum(number(reference, "config.momentum")));
  int skipped = 0, clipped = 0;
  for (int k = 0; reference.contains("stepped." + std::to_string(k)); ++k) {
    const std::string step = std::to_string(k);
    CAPTURE(k);
    const torch::Tensor scaled = scaler.scale(tensor(reference, "loss." + step));
    CHECK(torch::equal(scaled, tensor(reference, "scaled_loss." + step)));
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = tensor(reference, "grad." + step + "." + std::to_string(i)).clone();
    }
    if (number(reference, "clip." + step) != 0) {
      ++clipped;
      scaler.unscale_(optimizer);
      CHECK_THROWS_AS(scaler.unscale_(optimizer), ddp::Error);  // once per step
      torch::nn::utils::clip_grad_norm_(params, number(reference, "config.max_norm"));
    }
    const bool stepped = scaler.step(optimizer);
    CHECK_THROWS_AS(scaler.step(optimizer), ddp::Error);
    CHECK(stepped == (number(reference, "stepped." + step) != 0));
    skipped += stepped ? 0 : 1;
    scaler.update();
    CHECK(scaler.get_scale() == number(reference, "scale." + step));
    CHECK(scaler.growth_tracker() == static_cast<int64_t>(number(reference, "tracker." + step)));
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& expected = tensor(reference, "param." + step + "." + std::to_string(i));
      CHECK(torch::allclose(params[i].detach(), expected, /*rtol=*/1e-5, /*atol=*/1e-7));
    }
    optimizer.zero_grad();
  }
  CHECK(skipped >= 3);  // the reference has inf and NaN steps, and clipped ones
  CHECK(clipped >= 3);
  const ddp::amp::GradScalerState state = scaler.state_dict();
  CHECK(state.scale == number(reference, "state.scale"));
  CHECK(state.growth_factor == number(reference, "state.growth_factor"));
  CHECK(state.backoff_factor == number(reference, "state.backoff_factor"));
  CHECK(state.growth_interval == static_cast<int64_t>(number(reference, "state.growth_interval")));
  CHECK(state.growth_tracker == static_cast<int64_t>(number(reference, "state._growth_tracker")));

  GradScaler restored(torch::kCPU);
  restored.load_state_dict(state);
  CHECK(restored.get_scale() == state.scale);
  CHECK(restored.options().growth_interval == state.growth_interval);
}

TEST_CASE("GradScaler: misuse and a disabled scaler", "[amp]") {
  auto p = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD optimizer({p}, torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  p.mutable_grad() = torch::ones({2});
  CHECK_THROWS_AS(scaler.unscale_(optimizer), ddp::Error);  // before any scale()
  p.mutable_grad() = torch::ones({2}, torch::kHalf);
  (void)scaler.scale(torch::ones({}));
  CHECK_THROWS_AS(scaler.unscale_(optimizer), ddp::InvalidArgument);  // fp16 gradients
  GradScalerOptions off;
  off.enabled = false;
  GradScaler disabled(torch::kCPU, off);
  CHECK(disabled.get_scale() == 1.0);
  CHECK(torch::equal(disabled.scale(torch::full({}, 3.0)), torch::full({}, 3.0)));
  CHECK_THROWS_AS(disabled.load_state_dict({}), ddp::InvalidArgument);
}

TEST_CASE("GradScaler under DDP: every rank skips the step where one rank's batch overflows", "[amp][reducer]") {
  constexpr int kWorld = 2;
  struct Seen {
    std::vector<bool> stepped;
    std::vector<double> scales;
    torch::Tensor params;
  };
  const auto seen = ddp::testing::run_ranks<Seen>(kWorld, [](ddp::ProcessGroup& group) {
    torch::manual_seed(7);
    torch::nn::Linear net(3, 2);
    ddp::DistributedDataParallel<torch::nn::Linear> model(net, borrow(group));
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
    GradScalerOptions options;
    options.growth_interval = 1;
    GradScaler scaler(torch::kCPU, options);
    Seen s;
    for (int step = 0; step < 4; ++step) {
      torch::Tensor x = torch::full({2, 3}, static_cast<double>(group.rank() + step + 1));
      if (step == 2 && group.rank() == 1) x[0][0] = std::numeric_limits<float>::infinity();
      // Two micro-batches, the first under no_sync: accumulated locally, averaged on the second.
      {
        auto guard = model.no_sync();
        scaler.scale(model(x).sum()).backward();
      }
      scaler.scale(model(x).sum()).backward();
      s.stepped.push_back(scaler.step(optimizer));
      scaler.update();
      s.scales.push_back(scaler.get_scale());
      optimizer.zero_grad();
    }
    s.params = torch::cat({net->weight.detach().flatten(), net->bias.detach()});
    return s;
  });
  CHECK(seen[0].stepped == std::vector<bool>{true, true, false, true});
  for (int r = 1; r < kWorld; ++r) {
    CHECK(seen[r].stepped == seen[0].stepped);
    CHECK(seen[r].scales == seen[0].scales);
    CHECK(torch::equal(seen[r].params, seen[0].params));
  }
  CHECK(seen[0].scales == std::vector<double>{131072.0, 262144.0, 131072.0, 262144.0});
}

TEST_CASE("GradScaler with a group: a rank's local overflow makes every rank skip", "[amp][reducer]") {
  const auto stepped = ddp::testing::run_ranks<std::vector<bool>>(3, [](ddp::ProcessGroup& group) {
    auto p = torch::ones({4}, torch::requires_grad());
    torch::optim::SGD optimizer({p}, torch::optim::SGDOptions(0.1));
    GradScalerOptions options;
    options.group = borrow(group);
    GradScaler scaler(torch::kCPU, options);
    std::vector<bool> result;
    for (int step = 0; step < 3; ++step) {
      scaler.scale(p.sum()).backward();  // local gradients, never averaged
      if (step == 1 && group.rank() == 2) p.mutable_grad()[3] = std::nan("");
      result.push_back(scaler.step(optimizer));
      scaler.update();
      optimizer.zero_grad();
    }
    return result;
  });
  for (const auto& ranks : stepped) CHECK(ranks == std::vector<bool>{true, false, true});
}

TEST_CASE("GradScaler state in a checkpoint: saved, resumed, read by Python", "[amp][python]") {
  ddp::testing::TempDir dir;
  torch::nn::Linear net(2, 2);
  GradScalerOptions options;
  options.init_scale = 512.0;
  options.growth_interval = 7;
  GradScaler scaler(torch::kCPU, options);
  ddp::TrainingProgress progress;
  progress.grad_scaler = scaler.state_dict();
  progress.grad_scaler->growth_tracker = 5;
  const auto folder = ddp::save_checkpoint(dir.path, *net, nullptr, progress, 0, [] {});
  const ddp::TrainingProgress loaded = ddp::load_checkpoint(folder, *net, nullptr);
  REQUIRE(loaded.grad_scaler.has_value());
  CHECK(loaded.grad_scaler->scale == 512.0);
  CHECK(loaded.grad_scaler->growth_interval == 7);
  CHECK(loaded.grad_scaler->growth_tracker == 5);
  GradScaler resumed(torch::kCPU);
  resumed.load_state_dict(*loaded.grad_scaler);
  CHECK(resumed.get_scale() == 512.0);
  CHECK(resumed.growth_tracker() == 5);

  // Python's GradScaler takes the saved dict as it is.
  const auto output = ddp::testing::checkpoint::run_python(
      "import torch\n"
      "state = torch.load('" + (folder / "trainer.pt").string() + "', weights_only=True)['grad_scaler']\n"
      "scaler = torch.amp.GradScaler('cpu')\n"
      "scaler.load_state_dict(state)\n"
      "print(sorted(state), scaler.get_scale(), scaler._growth_interval)\n",
      dir.path);
  if (!ddp::testing::checkpoint::have_python()) return;
  REQUIRE(output.has_value());
  CHECK(*output == "['_growth_tracker', 'backoff_factor', 'growth_factor', 'growth_interval', 'scale'] 512.0 7\n");
}
