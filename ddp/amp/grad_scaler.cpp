#include "ddp/amp/grad_scaler.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>

#include <map>
#include <utility>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/distributed/process_group.h"

namespace ddp::amp {

GradScaler::GradScaler(torch::Device device, GradScalerOptions options)
    : device_(device), options_(std::move(options)) {
  if (!(options_.growth_factor > 1.0)) {
    throw InvalidArgument(str("GradScaler: growth_factor must be above 1, not ", options_.growth_factor));
  }
  if (!(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0)) {
    throw InvalidArgument(str("GradScaler: backoff_factor must be in (0, 1), not ", options_.backoff_factor));
  }
  if (options_.growth_interval < 1) {
    throw InvalidArgument(str("GradScaler: growth_interval must be at least 1, not ", options_.growth_interval));
  }
  if (!(options_.init_scale > 0.0)) {
    throw InvalidArgument(str("GradScaler: init_scale must be positive, not ", options_.init_scale));
  }
}

void GradScaler::lazy_init() {
  if (scale_.defined()) return;
  const auto on_device = torch::TensorOptions().device(device_);
  scale_ = torch::full({}, options_.init_scale, on_device.dtype(torch::kFloat32));
  growth_tracker_ = torch::full({}, init_growth_tracker_, on_device.dtype(torch::kInt32));
}

torch::Tensor GradScaler::scale(const torch::Tensor& outputs) {
  if (!options_.enabled) return outputs;
  lazy_init();
  return outputs * scale_.to(outputs.device(), /*non_blocking=*/true);
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  PerOptimizer& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kUnscaled) {
    throw Error("GradScaler: unscale_() has already been called on this optimizer since the last update()");
  }
  if (state.stage == Stage::kStepped) throw Error("GradScaler: unscale_() is being called after step()");
  if (!scale_.defined()) {
    throw Error("GradScaler: unscale_() before any scale(): scale the loss with scaler.scale(loss) first");
  }
  // Python divides in float64 and rounds once: the same inverse bit for bit.
  const torch::Tensor inv_scale = scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32);
  // The fused kernel takes gradients of one device and dtype at a time.
  std::map<std::pair<std::string, int>, std::vector<torch::Tensor>> grads;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) {
      const torch::Tensor& grad = parameter.grad();
      if (!grad.defined()) continue;
      if (grad.scalar_type() == torch::kHalf) {
        throw InvalidArgument("GradScaler: attempting to unscale FP16 gradients (keep the parameters in float32; "
                              "autocast casts them in the forward)");
      }
      DDP_CHECK(!grad.is_sparse(), "GradScaler: sparse gradients are not supported");
      grads[{grad.device().str(), static_cast<int>(grad.scalar_type())}].push_back(grad);
    }
  }
  torch::Tensor found_inf = torch::zeros({1}, torch::TensorOptions().device(device_).dtype(torch::kFloat32));
  for (auto& [key, tensors] : grads) {
    const torch::Device device = tensors.front().device();
    torch::Tensor found_here = torch::zeros({1}, torch::TensorOptions().device(device).dtype(torch::kFloat32));
    at::_amp_foreach_non_finite_check_and_unscale_(tensors, found_here, inv_scale.to(device));
    found_inf.add_(found_here.to(device_));
  }
  // See Note [GradScaler and DDP].
  if (options_.group) options_.group->allreduce(found_inf, c10d::ReduceOp::MAX, "GradScaler found_inf");
  state.found_inf = found_inf;
  state.stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  PerOptimizer& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kStepped) {
    throw Error("GradScaler: step() has already been called since the last update()");
  }
  if (state.stage == Stage::kReady) unscale_(optimizer);
  const bool skip = per_optimizer_[&optimizer].found_inf.item<float>() != 0.0F;
  if (!skip) optimizer.step();
  per_optimizer_[&optimizer].stage = Stage::kStepped;
  return !skip;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!options_.enabled) return;
  if (!scale_.defined()) throw Error("GradScaler: update() before any scale()");
  if (new_scale) {
    scale_.fill_(*new_scale);
  } else {
    torch::Tensor found_inf_combined;
    for (const auto& [optimizer, state] : per_optimizer_) {
      if (!state.found_inf.defined()) continue;
      found_inf_combined = found_inf_combined.defined() ? found_inf_combined + state.found_inf : state.found_inf.clone();
    }
    if (!found_inf_combined.defined()) throw Error("GradScaler: no inf checks were recorded prior to update()");
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_combined, options_.growth_factor,
                           options_.backoff_factor, options_.growth_interval);
  }
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? scale_.item<double>() : options_.init_scale;
}

int64_t GradScaler::growth_tracker() const {
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : init_growth_tracker_;
}

GradScalerState GradScaler::state_dict() const {
  GradScalerState state;
  state.scale = get_scale();
  state.growth_factor = options_.growth_factor;
  state.backoff_factor = options_.backoff_factor;
  state.growth_interval = options_.growth_interval;
  state.growth_tracker = growth_tracker();
  return state;
}

void GradScaler::load_state_dict(const GradScalerState& state) {
  if (!options_.enabled) {
    throw InvalidArgument("GradScaler: load_state_dict() into a disabled scaler (it keeps no state)");
  }
  options_.init_scale = state.scale;
  options_.growth_factor = state.growth_factor;
  options_.backoff_factor = state.backoff_factor;
  options_.growth_interval = state.growth_interval;
  init_growth_tracker_ = state.growth_tracker;
  if (scale_.defined()) scale_.fill_(state.scale);
  if (growth_tracker_.defined()) growth_tracker_.fill_(state.growth_tracker);
}

}  // namespace ddp::amp
