#pragma once
// Re-sharding an epoch at a new world size: which samples of an epoch's global order are done, and how
// the rest is split among the ranks of another world. Pure functions; DistributedSampler::set_state()
// uses them. See Note [Re-sharding at a new world size].
#include <cstdint>
#include <vector>

#include "samplers/distributed_sampler.h"

namespace ddp::samplers {

// Note [Re-sharding at a new world size]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An epoch has one global order, the permutation P of 0..n-1 drawn from seed + epoch (or the identity).
// Every rank draws its samples from it in lock step, so after each rank consumed p samples of a share
// that started at global offset S in a world of R ranks, the samples P[0 .. S + p*R) are done: the
// state's global offset G = S + p*R is exact, whatever the world sizes before.
//
// A share is "the rest of the epoch from offset S, split among R ranks": with m = n - S left, rank r
// takes P[S + r], P[S + r + R], P[S + r + 2R], ... for
//   ceil(m / R) samples, the last row padded by wrapping around P from its start (P[0], P[1], ...),
//   floor(m / R) samples with drop_last: the last m mod R samples of the epoch are not trained on.
// S = 0 is PyTorch's DistributedSampler exactly (its padding also repeats the order from its start).
// When a share is consumed to its end the epoch is complete and G = n: with drop_last the dropped tail
// stays dropped, with padding the padded copies are not counted twice.
//
// Resuming a state at world size R' (set_state()):
//   R' == R and G < n: the same share (start S = G - p*R) at the same position p: nothing changes, as
//     before re-sharding existed, and the loader's batches are the ones the uninterrupted run had;
//   otherwise a new share starts at S' = G, position 0: the rest P[G .. n) split among the R' ranks.
// So across any number of changes within an epoch (3 -> 2 -> 3) every sample of P is trained on exactly
// once, except the padding of the last share (at most R' - 1 repeats, as PyTorch has) or the tail that
// drop_last drops (at most R' - 1 samples, the last of P). The next epoch starts at offset 0 as usual.
// A state from before offsets were saved (SamplerState::offset unset) had S = 0: G = p*R, or n if p was
// the end of the epoch.

// The number of samples each rank gets from a share that starts at global offset start_offset:
// ceil(m / R), or floor(m / R) with drop_last, m = dataset_size - start_offset.
int64_t share_size(int64_t dataset_size, const DistributedSamplerOptions& options, int64_t start_offset);

// This rank's samples of the share of `epoch` that starts at start_offset (Note above). start_offset 0
// gives rank_indices(). Throws ddp::InvalidArgument unless 0 <= start_offset <= dataset_size.
std::vector<int64_t> share_indices(int64_t dataset_size, const DistributedSamplerOptions& options,
                                   int64_t epoch, int64_t start_offset);

// The global offset G after `position` samples per rank of the share at start_offset: start_offset +
// position * R, or dataset_size once the share is consumed to its end.
int64_t offset_after(int64_t dataset_size, const DistributedSamplerOptions& options, int64_t start_offset,
                     int64_t position);

// The state's exact global offset: state.offset, or for a state saved without one (share start 0) its
// position * num_replicas, dataset_size at the end of the epoch. Throws ddp::InvalidArgument for a
// state that does not fit a data set of dataset_size.
int64_t global_offset(const SamplerState& state, int64_t dataset_size, bool drop_last);

// Where a sampler resumes a state: the share's start offset and the position in it (Note above).
struct ResumePoint {
  int64_t share_start = 0;
  int64_t start_index = 0;
};
ResumePoint resume_point(const SamplerState& state, int64_t dataset_size,
                         const DistributedSamplerOptions& options);

}  // namespace ddp::samplers
