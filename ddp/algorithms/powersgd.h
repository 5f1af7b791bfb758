#pragma once
// PowerSGD gradient compression (Vogels et al., 2019) as a communication hook, with the semantics of
// PyTorch's powerSGD_hook: see Note [PowerSGD] in powersgd.cpp.
//   auto hook = std::make_shared<ddp::PowerSgdHook>(ddp::PowerSgdOptions{});
//   model.register_comm_hook(hook);
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "ddp/algorithms/comm.h"

namespace ddp {
namespace detail {
class PowerSgdStages;  // ddp/algorithms/detail/powersgd_stages.h
}  // namespace detail

// PyTorch's PowerSGDState arguments (defaults included); a plain struct.
struct PowerSgdOptions {
  // The rank r of the approximation: a gradient matrix n x m goes as n x r and m x r.
  std::int64_t matrix_approximation_rank = 1;
  // Iterations (synchronized backwards) all-reduced as they are before compression starts; at least
  // 2 with error feedback or warm start (the buckets are rebuilt after the first iteration).
  std::int64_t start_powersgd_iter = 1000;
  // A matrix is compressed only when (n + m) * r * min_compression_rate < n * m.
  double min_compression_rate = 2;
  // Adds what compression lost in the previous iteration to this one's gradient.
  bool use_error_feedback = true;
  // Starts each iteration's Q from the previous one's instead of a random matrix.
  bool warm_start = true;
  // Added to the norm in the Gram-Schmidt orthogonalisation (0: none, as PyTorch's default).
  double orthogonalization_epsilon = 0;
  // Seeds the random initial Qs (the same on every rank, so that every rank starts from the same Q).
  std::uint32_t random_seed = 0;
};

class PowerSgdHook : public CommHookInterface {
 public:
  // Throws ddp::InvalidArgument for a rank below 1, a negative rate or epsilon, or
  // start_powersgd_iter <= 1 with error feedback or warm start.
  explicit PowerSgdHook(PowerSgdOptions options = {});
  // Waits for the stages still running (each of their waits is bounded by the group's timeout).
  ~PowerSgdHook() override;
  std::string name() const override { return "powersgd"; }
  HookWork run(ProcessGroup& group, GradBucket& bucket) override;
  // "iter", "rng", "error.<bucket>", "p.<bucket>", "q.<bucket>" (per rank: the errors differ).
  StateDict state() const override;
  void load_state(const StateDict& state) override;

  const PowerSgdOptions& options() const { return options_; }
  // Completed iterations (counted at the last bucket of each synchronized backward).
  std::int64_t iteration() const { return iteration_; }
  // The error-feedback buffer of a bucket (undefined before its first compressed iteration),
  // updated in place by every compressed iteration: clone it to keep one iteration's.
  torch::Tensor error(std::size_t bucket) const;
  // Elements before and after compression over every compressed iteration so far.
  std::int64_t numel_before_compression() const { return numel_before_; }
  std::int64_t numel_after_compression() const { return numel_after_; }
  // Called with a bucket's index when, in a compressed iteration, its averaged gradient is in the
  // bucket, on the thread that ran its last stages (see Note [PowerSGD stages] in
  // ddp/algorithms/detail/powersgd_stages.cpp); for tests and tools that observe when a bucket's communication ends.
  // Set it before the first backward.
  void set_stage_listener(std::function<void(std::size_t bucket)> listener) { listener_ = std::move(listener); }

 private:
  HookWork compress(ProcessGroup& group, GradBucket& bucket);
  std::uint32_t next_seed();

  PowerSgdOptions options_;
  std::int64_t iteration_ = 0;
  std::mt19937 seeds_;  // numpy.random.RandomState(random_seed)'s generator
  std::map<std::size_t, torch::Tensor> errors_, p_memory_, q_memory_;
  std::int64_t numel_before_ = 0, numel_after_ = 0;
  std::function<void(std::size_t)> listener_;
  std::unique_ptr<detail::PowerSgdStages> stages_;  // null with a group the stage thread cannot serve
};

// Orthogonalises the columns of each matrix of a batch (b, n, r), in place, as PyTorch's PowerSGD:
// Gram-Schmidt for r <= 2 (column /= norm + epsilon), a reduced QR otherwise.
void orthogonalize(torch::Tensor& matrices, double epsilon = 0);

}  // namespace ddp
