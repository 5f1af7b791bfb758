#pragma once
// ZeRO stage 1 for LibTorch: ZeroRedundancyOptimizer wraps any torch::optim optimizer and keeps on
// each rank only the optimizer state of that rank's shard of the parameters (PyTorch's
// torch.distributed.optim.ZeroRedundancyOptimizer). See Note [ZeroRedundancyOptimizer].
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace ddp {

class ProcessGroup;

// Builds the optimizer of one shard from its param groups (each group's options, when it has them,
// are the user's; the factory supplies the defaults), e.g.
//   [](std::vector<torch::optim::OptimizerParamGroup> groups) {
//     return std::make_unique<torch::optim::Adam>(std::move(groups), torch::optim::AdamOptions(1e-3));
//   }
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::optim::OptimizerParamGroup>)>;

// Note [ZeroRedundancyOptimizer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Partition: as PyTorch, group by group, the parameters sorted by size (largest first, ties in
// order) go one by one to the rank with the smallest total so far (lowest rank on ties), so every
// rank holds about 1/W of the elements and at most one parameter more; every rank computes the same
// partition. Each rank builds the wrapped optimizer over its shard only (the "local optimizer"):
// its state (SGD's momentum, Adam's two moments) exists for the shard alone.
// step(): the gradients are already the same on every rank (DistributedDataParallel averaged them),
// the group options (learning rate, ...) set on this wrapper's param_groups() are copied into the
// local optimizer, which steps the shard; then the updated parameters reach every rank with one
// all-gather per dtype of the shards flattened (padded to the largest shard), bounded by the group's
// timeout like every collective. The parameters stay whole on every rank, so the model, its
// forward and its state dict (model.pt) are as without ZeRO.
// Checkpoints: consolidate_state_dict(to) sends every rank's state (as bytes, through
// ProcessGroup::broadcast_bytes, as PyTorch's broadcast_object) to rank `to`, which holds it in this
// wrapper's own state() in the unsharded layout: save_checkpoint(..., &zero, ...) then writes Python's
// optimizer.state_dict() layout, as for the unsharded optimizer, which Python reads and which
// resumes at any world size. Loading (load_checkpoint) fills this wrapper's state() on every rank;
// the next step() keeps the entries of the rank's shard in the local optimizer and drops the others.
// Saving without consolidating first is an error (the state would be missing).
class ZeroRedundancyOptimizer : public torch::optim::Optimizer {
 public:
  // param_groups: all of the model's parameters (every rank passes the same, in the same order).
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                          const OptimizerFactory& make_local, std::shared_ptr<ProcessGroup> group);
  // One group of parameters with an optimizer type and its options:
  //   ZeroRedundancyOptimizer::of<torch::optim::Adam>(model->parameters(), AdamOptions(1e-3), group)
  template <class Wrapped, class Options>
  static std::unique_ptr<ZeroRedundancyOptimizer> of(const std::vector<torch::Tensor>& parameters,
                                                     const Options& defaults, std::shared_ptr<ProcessGroup> group) {
    return std::make_unique<ZeroRedundancyOptimizer>(
        std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(parameters)},
        [defaults](std::vector<torch::optim::OptimizerParamGroup> groups) {
          return std::make_unique<Wrapped>(std::move(groups), defaults);
        },
        std::move(group));
  }

  // Steps this rank's shard, then all-gathers the updated parameters (every rank calls it).
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Every rank calls it; afterwards rank `to` holds the whole state in state() (see the Note).
  void consolidate_state_dict(int to = 0);
  // Throws ddp::InvalidArgument unless state() holds the whole state (consolidated or loaded) or
  // there is none yet; optimizer_state_dict() (checkpoints) calls it.
  void check_state_is_whole() const;

  // The rank that owns each parameter, in param_groups() order (groups concatenated).
  const std::vector<int>& owners() const { return owners_; }
  torch::optim::Optimizer& local_optimizer() { return *local_; }
  // Bytes of this rank's optimizer state (the local optimizer's tensors).
  int64_t local_state_bytes() const;

  // The parts built before the base class (its default options come from the local optimizer).
  struct Prepared;
  explicit ZeroRedundancyOptimizer(Prepared prepared);

 private:
  struct Bucket;  // the parameters of one dtype, per rank, flattened for the all-gather
  static Prepared prepare(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                          const OptimizerFactory& make_local, const std::shared_ptr<ProcessGroup>& group);
  void sync_options();
  void take_whole_state();
  void gather_parameters();

  std::shared_ptr<ProcessGroup> group_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::vector<int> owners_;
  std::vector<int64_t> local_to_global_;  // the local optimizer's parameters' index in param_groups() order
  std::vector<std::shared_ptr<Bucket>> buckets_;
  bool consolidating_ = false;
};

// Bytes of an optimizer's state tensors (any optimizer checkpoints know: SGD, Adam, AdamW, Adagrad,
// RMSprop). For the benchmarks' optimizer-state memory column.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace ddp
