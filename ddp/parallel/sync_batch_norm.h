#pragma once
// SyncBatchNorm: batch normalisation whose statistics are computed over the whole global batch
// (every rank's rows), as torch.nn.SyncBatchNorm. Works on CPU (Gloo) and CUDA (NCCL or Gloo).
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>

#include <memory>

#include "ddp/distributed/process_group.h"

namespace ddp {

// Note [SyncBatchNorm]
// ~~~~~~~~~~~~~~~~~~~~
// Training forward, with a group of more than one rank:
//   1. each rank computes, per channel, its row count n_r, mean m_r and sum of squared deviations
//      M2_r (about its own mean: no cancellation);
//   2. one all-gather of [m_r, M2_r, n_r] (2C+1 values per rank); every rank combines them into
//      the global mean, biased variance (for normalising) and unbiased variance (for the running
//      statistics), exactly as one BatchNorm over the concatenated batch does; uneven batches and
//      ranks with zero rows are fine;
//   3. y = (x - mean) * invstd * weight + bias.
// Backward (a custom autograd node, SyncBatchNormBackward in the .cpp): one all-reduce of the
//   per-channel sums of dy and dy * (x - mean), from which each rank computes the gradient of its
//   own rows exactly; weight and bias get this rank's own sums, which DDP then averages like any
//   other gradient (as PyTorch's).
// Eval mode with running statistics, or a group of one rank, or no group: plain batch norm, no
// collective. All ranks must call forward and backward the same number of times (collectives).
// Parameters and buffers have BatchNorm's names (weight, bias, running_mean, running_var,
// num_batches_tracked), so state dicts move between BatchNorm and SyncBatchNorm.
class SyncBatchNormImpl
    : public torch::nn::NormImplBase<1, SyncBatchNormImpl, torch::nn::BatchNormOptions> {
 public:
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options,
                             std::shared_ptr<ProcessGroup> group = nullptr);
  explicit SyncBatchNormImpl(int64_t num_features) : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features)) {}

  // Input [N, C, *] (any number of trailing dimensions: the 1d, 2d and 3d cases).
  torch::Tensor forward(const torch::Tensor& input);

  // The group whose ranks share statistics; null: this rank alone (plain batch norm).
  void set_process_group(std::shared_ptr<ProcessGroup> group) { group_ = std::move(group); }
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }

  void pretty_print(std::ostream& stream) const override;

 protected:
  void _check_input_dim(const torch::Tensor& input) override;

 private:
  std::shared_ptr<ProcessGroup> group_;
};
TORCH_MODULE(SyncBatchNorm);

// Note [convert_sync_batchnorm]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's convert_sync_batchnorm swaps BatchNorm modules for SyncBatchNorm ones. In LibTorch a
// parent usually keeps its own handle to a child (a member `torch::nn::BatchNorm2d bn;`, or the
// AnyModule inside a Sequential), so swapping the registered child would leave forward using the
// old one while parameters() report the new one: training would silently go wrong. So:
//   - a BatchNorm1d/2d/3d that only the module tree refers to is replaced (register_module by
//     name and look it up in forward, or a child of a Sequential, which is rebuilt);
//   - a SyncBatchNorm anywhere gets `group` (models can declare ddp::SyncBatchNorm directly and be
//     built before the process group exists);
//   - a BatchNorm that something else still holds throws ddp::InvalidArgument naming its path and
//     what to do (declare ddp::SyncBatchNorm in the model) - nothing is changed in that case.
// The replacement copies weights, running statistics, train/eval mode, device and dtype. Build the
// optimizer after converting (as in PyTorch), since the parameters are new tensors.
// Returns the converted module: `module` itself, or a new one when `module` itself had to be
// replaced (a BatchNorm, or a Sequential with BatchNorm children).
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(const std::shared_ptr<torch::nn::Module>& module,
                                                          std::shared_ptr<ProcessGroup> group);

// Typed convenience for Sequential models: returns the converted Sequential.
torch::nn::Sequential convert_sync_batchnorm(const torch::nn::Sequential& module,
                                             std::shared_ptr<ProcessGroup> group);

}  // namespace ddp
