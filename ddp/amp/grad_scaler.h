#pragma once
// Mixed precision, part two: dynamic loss scaling with torch.amp.GradScaler's semantics, for
// LibTorch optimizers, alone or under DistributedDataParallel (see Note [GradScaler and DDP]).
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <unordered_map>

#include "ddp/amp/grad_scaler_state.h"

namespace ddp {
class ProcessGroup;
}

namespace ddp::amp {

// GradScaler's options: Python's constructor arguments, a plain struct.
struct GradScalerOptions {
  double init_scale = 65536.0;  // 2**16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  // false: scale() returns its input, step() steps, update() does nothing (e.g. for bf16 runs).
  bool enabled = true;
  // When set, unscale_() takes the maximum of found_inf over this group's ranks, so that every rank
  // skips or steps together. See Note [GradScaler and DDP] for when that is needed.
  std::shared_ptr<ProcessGroup> group;
};

// Note [GradScaler semantics]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// As torch.amp.GradScaler: the scale is a float32 tensor on `device`, created at the first scale()
// with init_scale. Per optimizer, in one iteration: scale(loss).backward(); optionally unscale_(opt)
// (at most once, e.g. to clip gradients); step(opt) unscales if not done yet and skips
// optimizer.step() when a gradient held inf or NaN; then update() once for all optimizers: on inf/NaN
// the scale is multiplied by backoff_factor and the growth tracker reset, otherwise the tracker grows
// and after growth_interval steps without inf/NaN the scale is multiplied by growth_factor (only when
// the result is finite). Unscaling and the inf/NaN check are ATen's fused kernels
// (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_), the ones Python calls, so the
// same gradients give the same scales, skips and parameters. Gradients in float16 are refused, as
// in Python (fp16 parameters need fp32 master weights, which is not what autocast does).
//
// Note [GradScaler and DDP]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// DistributedDataParallel averages the gradients during backward, so unscale_() sees the same
// gradients on every rank and every rank takes the same skip decision without communicating: inf
// and NaN survive the all-reduce (inf + x = inf, NaN + x = NaN), also through the fp16/bf16
// compression hooks, whose overflow to inf is itself caught; with no_sync accumulation the micro-
// batches' scaled gradients add up locally and are averaged on the last one, before step().
// Scale and growth tracker then evolve identically on every rank. Where the gradients are NOT the
// same on every rank (local gradients that a ZeRO or hand-written scheme reduces later, or parameters
// outside the DDP model), set GradScalerOptions::group: found_inf is then all-reduced with MAX
// before the decision, one 4-byte collective per step.
class GradScaler {
 public:
  explicit GradScaler(torch::Device device = torch::kCPU, GradScalerOptions options = {});

  // outputs * scale (outputs unchanged when disabled).
  torch::Tensor scale(const torch::Tensor& outputs);
  // Divides the optimizer's gradients by the scale in place and records whether any is inf/NaN.
  // Throws ddp::Error when called twice before update(), or after step().
  void unscale_(torch::optim::Optimizer& optimizer);
  // unscale_() if not done yet, then optimizer.step() unless inf/NaN was found. Returns whether the
  // optimizer stepped. Throws ddp::Error when called twice before update().
  bool step(torch::optim::Optimizer& optimizer);
  // Adjusts the scale after this iteration's steps (see Note [GradScaler semantics]); new_scale
  // sets it instead. Throws ddp::Error when no optimizer was unscaled since the last update().
  void update(std::optional<double> new_scale = std::nullopt);

  bool is_enabled() const { return options_.enabled; }
  // The current scale (init_scale before the first scale(); 1.0 when disabled).
  double get_scale() const;
  int64_t growth_tracker() const;
  const GradScalerOptions& options() const { return options_; }
  // Live recovery: GradScalerOptions::group becomes `group` (when one was set). See Note [Live
  // recovery] in ddp/elastic/fault_tolerant.h.
  void reset_process_group(std::shared_ptr<ProcessGroup> group) {
    if (options_.group) options_.group = std::move(group);
  }

  // Python's state_dict() and load_state_dict() (keys in ddp/amp/grad_scaler_state.h). Loading into
  // a disabled scaler is an error, as in Python.
  GradScalerState state_dict() const;
  void load_state_dict(const GradScalerState& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    torch::Tensor found_inf;  // float32, one element, on the scale's device
  };
  void lazy_init();

  torch::Device device_;
  GradScalerOptions options_;
  torch::Tensor scale_;           // float32 scalar
  torch::Tensor growth_tracker_;  // int32 scalar
  int64_t init_growth_tracker_ = 0;
  std::unordered_map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace ddp::amp
