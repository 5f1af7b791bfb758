#pragma once
// Post-local SGD (Lin et al., 2020) with PyTorch's semantics: all-reduce gradients for the first
// iterations, then train locally and average the parameters every `period` steps.
//   auto state = std::make_shared<ddp::PostLocalSgdHook>(ddp::PostLocalSgdOptions{...});
//   model.register_comm_hook(state);                          // post_localSGD_hook
//   ddp::PeriodicModelAverager averager(pg, {period, warmup}); // warmup = start_localSGD_iter
//   ddp::PostLocalSgdOptimizer optimizer(sgd, averager);       // step(): sgd.step(), then average
// See Note [Post-local SGD] in model_averaging.cpp.
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/algorithms/comm.h"

namespace ddp {

struct PostLocalSgdOptions {
  // Iterations whose gradients are all-reduced over the whole group (global SGD) before local SGD.
  std::int64_t start_localsgd_iter = 0;
  // After that, gradients are averaged over this group only (PyTorch's subgroup, e.g. the ranks
  // of one host); null: not communicated at all (each rank keeps its own gradient).
  std::shared_ptr<ProcessGroup> subgroup;
};

// PyTorch's post_localSGD_hook with its PostLocalSGDState.
class PostLocalSgdHook : public CommHookInterface {
 public:
  explicit PostLocalSgdHook(PostLocalSgdOptions options);
  std::string name() const override { return "post_local_sgd"; }
  HookWork run(ProcessGroup& group, GradBucket& bucket) override;
  StateDict state() const override;
  void load_state(const StateDict& state) override;
  std::int64_t iteration() const { return iteration_; }

 private:
  PostLocalSgdOptions options_;
  std::int64_t iteration_ = 0;
};

struct ModelAveragerOptions {
  std::int64_t period = 1;        // average every `period` steps...
  std::int64_t warmup_steps = 0;  // ...from this step on (steps before it never average)
};

// PyTorch's PeriodicModelAverager: average_parameters() is called after every optimizer step; at
// step t >= warmup_steps with (t - warmup_steps) % period == 0 it replaces every parameter that has
// a gradient by its average over the group (one all-reduce of the packed parameters).
class PeriodicModelAverager {
 public:
  // Throws ddp::InvalidArgument for a null group, period < 1 or warmup_steps < 0.
  PeriodicModelAverager(std::shared_ptr<ProcessGroup> group, ModelAveragerOptions options);
  void average_parameters(const std::vector<torch::Tensor>& parameters);
  std::int64_t step() const { return step_; }
  void set_step(std::int64_t step) { step_ = step; }  // restoring a checkpoint

 private:
  std::shared_ptr<ProcessGroup> group_;
  ModelAveragerOptions options_;
  std::int64_t step_ = 0;
};

// PyTorch's PostLocalSGDOptimizer: step() runs the wrapped optimizer's step, then the averager on
// every parameter of its groups.
class PostLocalSgdOptimizer {
 public:
  PostLocalSgdOptimizer(torch::optim::Optimizer& optimizer, PeriodicModelAverager& averager)
      : optimizer_(&optimizer), averager_(&averager) {}
  void step();
  void zero_grad() { optimizer_->zero_grad(); }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }

 private:
  torch::optim::Optimizer* optimizer_;
  PeriodicModelAverager* averager_;
};

}  // namespace ddp
