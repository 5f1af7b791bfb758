// GPU-path logic that needs no GPU: which device a rank binds, the NCCL settings, the CUDA helpers'
// errors on a machine without CUDA, and checkpoints loaded with a map location (the CPU side).
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <map>

#include "ddp/checkpoint/checkpoint.h"
#include "ddp/runtime/detail/cuda_support.h"
#include "ddp/runtime/version.h"
#include "ddp/base/error.h"
#include "tests/support/temp_dir.h"

namespace {

ddp::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::InvalidArgument& error) {
    return error.what();
  }
  return "(no ddp::InvalidArgument thrown)";
}

}  // namespace

TEST_CASE("local rank -> CUDA device", "[gpu][units]") {
  using ddp::detail::cuda::local_device_index;
  CHECK(local_device_index(0, 1, 1, std::nullopt) == 0);
  CHECK(local_device_index(3, 4, 4, std::nullopt) == 3);
  CHECK(local_device_index(1, 2, 8, std::string("0,1,2,3,4,5,6,7")) == 1);
  // ddp_launch --gpus: each worker sees only its own GPU, whatever its local rank.
  CHECK(local_device_index(3, 4, 1, std::string("5")) == 0);
  const std::string too_many = message_of([] { local_device_index(2, 4, 2, std::string("0,1")); });
  CHECK_THAT(too_many, Catch::Contains("local rank 2 of 4 has no GPU of its own"));
  CHECK_THAT(too_many, Catch::Contains("2 CUDA device(s) (CUDA_VISIBLE_DEVICES='0,1')"));
  CHECK_THAT(too_many, Catch::Contains("--nproc_per_node 2"));
  const std::string none = message_of([] { local_device_index(0, 1, 0, std::nullopt); });
  CHECK_THAT(none, Catch::Contains("sees 0 CUDA device(s) (CUDA_VISIBLE_DEVICES=unset)"));
  CHECK_THAT(none, Catch::Contains("gloo"));
  CHECK_THROWS_AS(local_device_index(4, 4, 8, std::nullopt), ddp::Error);
}

TEST_CASE("NCCL settings from the environment", "[gpu][units]") {
  using ddp::detail::cuda::parse_nccl_settings;
  const auto defaults = parse_nccl_settings(env_of({}));
  CHECK(defaults.async_error_handling == 3);
  CHECK_FALSE(defaults.blocking_wait);
  CHECK(defaults.nccl_variables.empty());

  const auto set = parse_nccl_settings(env_of({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
                                               {"TORCH_NCCL_BLOCKING_WAIT", "1"},
                                               {"NCCL_DEBUG", "INFO"},
                                               {"NCCL_SOCKET_IFNAME", "lo"}}));
  CHECK(set.async_error_handling == 1);
  CHECK(set.blocking_wait);
  CHECK(set.nccl_variables == "NCCL_DEBUG=INFO, NCCL_SOCKET_IFNAME=lo");
  // The old names work too; the TORCH_ ones win.
  CHECK(parse_nccl_settings(env_of({{"NCCL_ASYNC_ERROR_HANDLING", "2"}})).async_error_handling == 2);
  CHECK(parse_nccl_settings(env_of({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}, {"NCCL_ASYNC_ERROR_HANDLING", "2"}}))
            .async_error_handling == 0);

  CHECK_THAT(message_of([] { parse_nccl_settings(env_of({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "yes"}})); }),
             Catch::Contains("TORCH_NCCL_ASYNC_ERROR_HANDLING='yes' is not one of 0"));
  CHECK_THAT(message_of([] { parse_nccl_settings(env_of({{"TORCH_NCCL_BLOCKING_WAIT", "2"}})); }),
             Catch::Contains("TORCH_NCCL_BLOCKING_WAIT='2' must be 0 or 1"));
}

TEST_CASE("CUDA helpers refuse CPU devices and say why", "[gpu][units]") {
  CHECK_THAT(message_of([] { ddp::detail::cuda::memory_stats(torch::kCPU); }), Catch::Contains("needs a CUDA device, got cpu"));
  CHECK_NOTHROW(ddp::detail::cuda::synchronize(torch::kCPU));
  if (!ddp::built_with_cuda()) {
    CHECK_THAT(message_of([] { ddp::detail::cuda::reset_peak_memory_stats(torch::Device(torch::kCUDA, 0)); }),
               Catch::Contains("without CUDA"));
  } else if (ddp::detail::cuda::device_count() == 0) {
    CHECK_THAT(message_of([] { ddp::detail::cuda::memory_stats(torch::Device(torch::kCUDA, 0)); }),
               Catch::Contains("does not exist"));
  }
}

TEST_CASE("state dicts and checkpoints load with a map location", "[gpu][checkpoint]") {
  ddp::testing::TempDir dir;
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.01));
  model->forward(torch::randn({5, 4})).sum().backward();
  optimizer.step();

  const auto file = dir.path / "state.pt";
  ddp::save_state_dict(ddp::state_dict(*model), file);
  const auto loaded = ddp::load_state_dict_file(file, torch::Device(torch::kCPU));
  const auto original = ddp::state_dict(*model);
  REQUIRE(loaded.size() == original.size());
  for (const auto& item : original) {
    INFO(item.key());
    CHECK(loaded[item.key()].device() == torch::Device(torch::kCPU));
    CHECK(torch::equal(loaded[item.key()], item.value()));
  }

  const auto saved = ddp::save_checkpoint(dir.path / "ckpt", *model, &optimizer, {1, 4, {}}, 0, nullptr);
  torch::nn::Sequential restored(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  torch::optim::Adam restored_optimizer(restored->parameters(), torch::optim::AdamOptions(0.01));
  ddp::CheckpointOptions on_cpu;
  on_cpu.map_location = torch::kCPU;
  const auto progress = ddp::load_checkpoint(saved, *restored, &restored_optimizer, on_cpu);
  CHECK(progress.step == 4);
  for (const auto& item : original) {
    INFO(item.key());
    CHECK(torch::equal(ddp::state_dict(*restored)[item.key()], item.value()));
  }
  // The optimizer state (Adam's moments and step count) came back: one more identical step on both
  // gives identical parameters, which a fresh Adam would not.
  const auto x = torch::randn({5, 4});
  optimizer.zero_grad();
  restored_optimizer.zero_grad();
  model->forward(x).sum().backward();
  restored->forward(x).sum().backward();
  optimizer.step();
  restored_optimizer.step();
  for (const auto& item : ddp::state_dict(*model)) {
    INFO(item.key());
    CHECK(torch::allclose(ddp::state_dict(*restored)[item.key()], item.value(), 1e-6, 1e-7));
  }
}
