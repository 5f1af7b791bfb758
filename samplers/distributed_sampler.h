#pragma once
// DistributedSampler: each rank iterates over its own share of a dataset, in an order that is the
// same permutation on every rank and changes with the epoch, like PyTorch's
// torch.utils.data.distributed.DistributedSampler, for LibTorch's data loaders.
#include <torch/data/samplers/base.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace ddp {
class ProcessGroup;  // ddp/distributed/process_group.h
}

namespace ddp::samplers {

// DistributedSampler's options: a plain struct (c10d's style), constructed with the two values every
// sampler needs:
//   ddp::samplers::DistributedSamplerOptions options(pg->size(), pg->rank());
//   options.seed = 42;
struct DistributedSamplerOptions {
  DistributedSamplerOptions() = default;
  DistributedSamplerOptions(int64_t num_replicas, int64_t rank) : num_replicas(num_replicas), rank(rank) {}

  int64_t num_replicas = 1;
  int64_t rank = 0;
  // Shuffle with a permutation drawn from seed + epoch; false keeps 0, 1, 2, ...
  bool shuffle = true;
  // Must be the same on every rank.
  uint64_t seed = 0;
  // Drop the tail so that every rank gets floor(n / R) samples, instead of padding by wrapping
  // around to ceil(n / R).
  bool drop_last = false;
};

// Where a sampler stands: what a checkpoint stores to resume mid-epoch (see ddp/checkpoint/checkpoint.h).
// set_state() resumes it at any world size: see Note [Re-sharding at a new world size] (samplers/reshard.h).
struct SamplerState {
  SamplerState() = default;
  SamplerState(int64_t epoch, int64_t position, int64_t num_replicas,
               std::optional<int64_t> offset = std::nullopt)
      : epoch(epoch), position(position), num_replicas(num_replicas), offset(offset) {}

  int64_t epoch = 0;
  // How many of this rank's indices of `epoch` were consumed (of its current share, which is the whole
  // epoch unless the epoch was resumed at another world size).
  int64_t position = 0;
  // The world size the position was counted in.
  int64_t num_replicas = 1;
  // How many samples of the epoch's global order all ranks together are done with, exactly, in
  // [0, dataset size]; the dataset size once the epoch is complete. Unset in states saved before it
  // existed: then position * num_replicas (See Note [Re-sharding at a new world size]).
  std::optional<int64_t> offset;
};

// The global order of one epoch, before it is split: a permutation of 0..n-1 (randperm on a CPU
// generator seeded with seed + epoch, as PyTorch does, so the order equals Python's) or the
// identity, padded by wrapping around or truncated to a multiple of num_replicas. Pure function.
std::vector<int64_t> epoch_order(int64_t dataset_size, const DistributedSamplerOptions& options,
                                 int64_t epoch);

// The permutation of 0..n-1 (or the identity) that epoch_order pads or truncates. Pure function.
std::vector<int64_t> epoch_permutation(int64_t dataset_size, const DistributedSamplerOptions& options,
                                       int64_t epoch);

// This rank's share of epoch_order: elements rank, rank + R, rank + 2R, ... Pure function.
std::vector<int64_t> rank_indices(int64_t dataset_size, const DistributedSamplerOptions& options,
                                  int64_t epoch);

// Number of samples each rank gets per epoch: ceil(n / R), or floor(n / R) with drop_last.
int64_t samples_per_rank(int64_t dataset_size, const DistributedSamplerOptions& options);

// Note [Sampler copies share state]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch's make_data_loader takes the sampler by value and calls reset() on its own copy at every
// begin(); with LibTorch's samplers a set_epoch() on the object the user kept therefore changes
// nothing (pytorch issue 73141). A DistributedSampler is a handle: copies share one state (options,
// epoch, position), so the natural code works:
//
//   DistributedSampler sampler(dataset.size().value(), *pg);
//   auto loader = torch::data::make_data_loader(dataset, sampler, batch_size);
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);
//     for (auto& batch : *loader) ...
//   }
//
// clone() gives an independent sampler (e.g. for a second loader over the same data). Access is guarded by a mutex, so a data loader's main
// thread and the training loop may use copies concurrently.
//
// Note [Sampler epoch start]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The order of an epoch is computed when it starts: at reset() (the loader's begin()) or, when the
// sampler is used on its own, at the first next() after set_epoch()/set_start_index(). The epoch
// starts at the start index given by set_start_index() for that epoch, else at 0; the start index is
// used once: a later reset() of the same epoch starts at 0 again (as a new pass would in Python).
class DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  // dataset_size: the number of samples n. Throws ddp::InvalidArgument on a negative size,
  // num_replicas < 1 or a rank outside [0, num_replicas).
  DistributedSampler(int64_t dataset_size, const DistributedSamplerOptions& options);
  // The common case: num_replicas and rank from the group, the other options at their defaults:
  //   ddp::DistributedSampler sampler(dataset_size, *pg);
  DistributedSampler(int64_t dataset_size, const ProcessGroup& group);

  // Starts the epoch's order again from its start index (see Note [Sampler epoch start]); a new_size
  // changes the dataset size.
  void reset(std::optional<size_t> new_size = std::nullopt) override;
  // The next up to batch_size of this rank's indices; nullopt when the epoch is exhausted.
  std::optional<std::vector<size_t>> next(size_t batch_size) override;
  // Writes and reads the options check values, the epoch and the position (LibTorch archives).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // Selects the permutation of the next epoch; call it before each epoch, on any copy.
  void set_epoch(int64_t epoch);
  int64_t epoch() const;
  // Mid-epoch resume: the current epoch starts after the first `start` of this rank's indices (of the
  // whole epoch: it cancels a pending re-shard of set_state()). Takes effect at the next reset() or
  // next(), for the current epoch only (set_epoch() to another epoch cancels it). Throws
  // ddp::InvalidArgument if start is negative or beyond size().
  void set_start_index(int64_t start);

  // This rank's indices for the current epoch (all of its share, whatever the position: after a
  // resume at another world size, the rest of the epoch's order from the resumed offset on).
  std::vector<int64_t> indices() const;
  // The number of samples this rank gets per epoch (PyTorch's len(sampler)).
  int64_t size() const;
  int64_t dataset_size() const;
  // How many of this rank's indices (of indices()) next() handed out in the current epoch (before the
  // epoch starts: its pending start index; 0 right after set_state() at another world size). A loader with workers prefetches: this may run up to max_jobs batches
  // ahead of what the training loop consumed, so a checkpoint should count consumed samples instead
  // (see state()).
  int64_t position() const;

  // {epoch, position, num_replicas, offset}; pass consumed = samples the loop actually trained on
  // this epoch (of indices()) to store that instead of position(); it is capped at indices().size(),
  // the end of the epoch, where offset is the dataset size.
  SamplerState state(std::optional<int64_t> consumed = std::nullopt) const;
  // Resumes from a saved state: set_epoch(state.epoch) and where the epoch goes on. At the world size
  // it was saved with, the same position; at another, the rest of the epoch from the state's exact
  // global offset, split among this world's ranks: no sample of the epoch lost or seen twice. See
  // Note [Re-sharding at a new world size]. Throws ddp::InvalidArgument for a state that does not fit.
  void set_state(const SamplerState& state);

  const DistributedSamplerOptions& options() const;
  // An independent sampler with the same options and state.
  DistributedSampler clone() const;

 private:
  struct State;
  explicit DistributedSampler(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace ddp::samplers
