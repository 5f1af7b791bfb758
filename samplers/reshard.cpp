#include "samplers/reshard.h"

#include "ddp/base/error.h"

namespace ddp::samplers {
namespace {

void check_start_offset(int64_t dataset_size, int64_t start_offset) {
  if (start_offset < 0 || start_offset > dataset_size) {
    throw InvalidArgument(str("DistributedSampler: start offset ", start_offset, " is outside [0, ", dataset_size,
                              "], the epoch's samples"));
  }
}

}  // namespace

int64_t share_size(int64_t dataset_size, const DistributedSamplerOptions& options, int64_t start_offset) {
  check_start_offset(dataset_size, start_offset);
  return samples_per_rank(dataset_size - start_offset, options);
}

std::vector<int64_t> share_indices(int64_t dataset_size, const DistributedSamplerOptions& options, int64_t epoch,
                                   int64_t start_offset) {
  const int64_t count = share_size(dataset_size, options, start_offset);
  const std::vector<int64_t> order = epoch_permutation(dataset_size, options, epoch);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    const int64_t at = start_offset + options.rank + k * options.num_replicas;
    // Past the end: the padding of the last row, wrapping around the order from its start.
    mine.push_back(order[static_cast<size_t>(at < dataset_size ? at : (at - dataset_size) % dataset_size)]);
  }
  return mine;
}

int64_t offset_after(int64_t dataset_size, const DistributedSamplerOptions& options, int64_t start_offset,
                     int64_t position) {
  const int64_t count = share_size(dataset_size, options, start_offset);
  if (position < 0 || position > count) {
    throw InvalidArgument(str("DistributedSampler: position ", position, " is outside [0, ", count,
                              "], this rank's samples of the share"));
  }
  return position == count ? dataset_size : start_offset + position * options.num_replicas;
}

int64_t global_offset(const SamplerState& state, int64_t dataset_size, bool drop_last) {
  if (state.position < 0 || state.num_replicas < 1) {
    throw InvalidArgument(str("sampler state: invalid position ", state.position, " or num_replicas ",
                              state.num_replicas));
  }
  if (state.offset) {
    if (*state.offset < 0 || *state.offset > dataset_size) {
      throw InvalidArgument(str("sampler state: offset ", *state.offset, " is outside [0, ", dataset_size,
                                "]: it was saved for another data set"));
    }
    return *state.offset;
  }
  // Saved before offsets were: the share started at 0 (See Note [Re-sharding at a new world size]).
  DistributedSamplerOptions saved(state.num_replicas, 0);
  saved.drop_last = drop_last;
  const int64_t per_rank = samples_per_rank(dataset_size, saved);
  if (state.position > per_rank) {
    throw InvalidArgument(str("sampler state: position ", state.position, " is beyond the ", per_rank,
                              " samples per rank of ", state.num_replicas, " ranks: it was saved for another data set"));
  }
  return offset_after(dataset_size, saved, 0, state.position);
}

ResumePoint resume_point(const SamplerState& state, int64_t dataset_size, const DistributedSamplerOptions& options) {
  const int64_t offset = global_offset(state, dataset_size, options.drop_last);
  if (state.num_replicas == options.num_replicas && offset < dataset_size) {
    // The same world: the same share, at the same position (the state counts in it).
    const int64_t start = offset - state.position * state.num_replicas;
    if (start < 0) {
      throw InvalidArgument(str("sampler state: offset ", offset, " is less than position ", state.position,
                                " x ", state.num_replicas, " ranks: the state is inconsistent"));
    }
    return {start, state.position};
  }
  return {offset, 0};  // a new share: the rest of the epoch split among this world's ranks
}

}  // namespace ddp::samplers
