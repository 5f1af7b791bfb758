#include "ddp/algorithms/model_averaging.h"

#include <torch/torch.h>

#include <utility>

#include "ddp/base/error.h"

namespace ddp {

// Note [Post-local SGD]
// ~~~~~~~~~~~~~~~~~~~~~
// As PyTorch (torch.distributed.algorithms.model_averaging and post_localSGD_hook): the hook counts
// iterations at each backward's last bucket and, before start_localsgd_iter, averages gradients
// over the whole group (divide, all-reduce); afterwards over the subgroup only, or not at all. The
// averager then keeps the replicas from drifting apart: parameters are averaged every `period`
// optimizer steps from warmup_steps on (PyTorch passes start_localSGD_iter as the warm-up). With
// period 1 and no warm-up, plain SGD on averaged gradients and averaged parameters coincide.

PostLocalSgdHook::PostLocalSgdHook(PostLocalSgdOptions options) : options_(std::move(options)) {
  if (options_.start_localsgd_iter < 0) {
    throw InvalidArgument(str("post-local SGD: start_localsgd_iter must not be negative, got ",
                              options_.start_localsgd_iter));
  }
}

HookWork PostLocalSgdHook::run(ProcessGroup& group, GradBucket& bucket) {
  const int tag = static_cast<int>(bucket.index);
  if (iteration_ < options_.start_localsgd_iter) {
    if (bucket.last) ++iteration_;
    return allreduce_average(group, bucket.buffer, bucket.divisor, "gradient all-reduce", tag);
  }
  if (!options_.subgroup) return HookWork::completed(bucket.buffer);
  return allreduce_average(*options_.subgroup, bucket.buffer, options_.subgroup->size(),
                           "gradient all-reduce (subgroup)", tag);
}

StateDict PostLocalSgdHook::state() const {
  StateDict out;
  out.insert("iter", torch::tensor({iteration_}, torch::kLong));
  return out;
}

void PostLocalSgdHook::load_state(const StateDict& state) {
  const auto* iter = state.find("iter");
  if (iter == nullptr || iter->numel() != 1) {
    throw InvalidArgument("post-local SGD: the saved hook state lacks 'iter'");
  }
  iteration_ = iter->item<std::int64_t>();
}

PeriodicModelAverager::PeriodicModelAverager(std::shared_ptr<ProcessGroup> group, ModelAveragerOptions options)
    : group_(std::move(group)), options_(options) {
  if (!group_) throw InvalidArgument("PeriodicModelAverager: the process group is null");
  if (options_.period < 1 || options_.warmup_steps < 0) {
    throw InvalidArgument(str("PeriodicModelAverager: period must be at least 1 and warmup_steps not negative (got ",
                              options_.period, " and ", options_.warmup_steps, ")"));
  }
}

void PeriodicModelAverager::average_parameters(const std::vector<torch::Tensor>& parameters) {
  const bool due = step_ >= options_.warmup_steps && (step_ - options_.warmup_steps) % options_.period == 0;
  ++step_;
  if (!due || group_->size() == 1) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> averaged, flat;
  for (const auto& p : parameters) {
    if (!p.grad().defined()) continue;  // as PyTorch: parameters without a gradient are left alone
    averaged.push_back(p);
    flat.push_back(p.detach().reshape({-1}));
  }
  if (averaged.empty()) return;
  auto packed = torch::cat(flat);
  packed.div_(group_->size());
  group_->allreduce(packed, c10d::ReduceOp::SUM, "model averaging all-reduce");
  std::int64_t at = 0;
  for (auto& p : averaged) {
    p.detach().copy_(packed.narrow(0, at, p.numel()).view_as(p));
    at += p.numel();
  }
}

void PostLocalSgdOptimizer::step() {
  optimizer_->step();
  std::vector<torch::Tensor> parameters;
  for (const auto& group : optimizer_->param_groups()) {
    for (const auto& p : group.params()) parameters.push_back(p);
  }
  averager_->average_parameters(parameters);
}

}  // namespace ddp
