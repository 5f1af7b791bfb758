#include "samplers/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <algorithm>
#include <mutex>

#include "ddp/base/error.h"
#include "ddp/distributed/process_group.h"
#include "samplers/reshard.h"

namespace ddp::samplers {
namespace {

void check_options(int64_t dataset_size, const DistributedSamplerOptions& options) {
  if (dataset_size < 0) {
    throw InvalidArgument(str("DistributedSampler: dataset size must be >= 0, got ", dataset_size));
  }
  if (options.num_replicas < 1) {
    throw InvalidArgument(
        str("DistributedSampler: num_replicas must be >= 1, got ", options.num_replicas));
  }
  if (options.rank < 0 || options.rank >= options.num_replicas) {
    throw InvalidArgument(str("DistributedSampler: rank ", options.rank,
                              " is outside [0, num_replicas = ", options.num_replicas,
                              "); pass the process group's rank and size"));
  }
}

int64_t read_int(torch::serialize::InputArchive& archive, const char* key) {
  torch::Tensor value;
  archive.read(key, value);
  return value.item<int64_t>();
}

}  // namespace

int64_t samples_per_rank(int64_t dataset_size, const DistributedSamplerOptions& options) {
  const int64_t replicas = options.num_replicas;
  return options.drop_last ? dataset_size / replicas : (dataset_size + replicas - 1) / replicas;
}

std::vector<int64_t> epoch_permutation(int64_t dataset_size, const DistributedSamplerOptions& options,
                                       int64_t epoch) {
  check_options(dataset_size, options);
  std::vector<int64_t> order(static_cast<size_t>(dataset_size));
  if (options.shuffle) {
    // Python: g = torch.Generator(); g.manual_seed(seed + epoch); torch.randperm(n, generator=g).
    auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed +
                                                              static_cast<uint64_t>(epoch));
    const torch::Tensor permutation = torch::randperm(dataset_size, generator, torch::kInt64);
    std::copy_n(permutation.data_ptr<int64_t>(), dataset_size, order.begin());
  } else {
    for (int64_t i = 0; i < dataset_size; ++i) order[static_cast<size_t>(i)] = i;
  }
  return order;
}

std::vector<int64_t> epoch_order(int64_t dataset_size, const DistributedSamplerOptions& options,
                                 int64_t epoch) {
  std::vector<int64_t> order = epoch_permutation(dataset_size, options, epoch);
  const auto total = static_cast<size_t>(samples_per_rank(dataset_size, options) *
                                         options.num_replicas);
  if (total <= order.size()) {
    order.resize(total);  // drop_last (or already a multiple of R)
  } else {
    // Pad by wrapping around to the start, as many times as needed (padding may exceed n when n < R).
    const size_t original = order.size();
    order.reserve(total);
    for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i % original]);
  }
  return order;
}

std::vector<int64_t> rank_indices(int64_t dataset_size, const DistributedSamplerOptions& options,
                                  int64_t epoch) {
  // The share that starts at offset 0 is the whole epoch: elements rank, rank + R, ... of epoch_order.
  return share_indices(dataset_size, options, epoch, /*start_offset=*/0);
}

struct DistributedSampler::State {
  State(int64_t size, DistributedSamplerOptions opts) : dataset_size(size), options(opts) {}

  // Computes the current epoch's order and moves to its start (see Note [Sampler epoch start]).
  void start_epoch() {
    const bool pending = start_index && start_index_epoch == epoch;
    share_start = pending ? pending_share_start : 0;
    indices = share_indices(dataset_size, options, epoch, share_start);
    position = pending ? std::min<int64_t>(*start_index, static_cast<int64_t>(indices.size())) : 0;
    start_index.reset();
    started = true;
  }

  // Position in the current epoch; before it started, the pending start index.
  int64_t current_position() const {
    if (started) return position;
    return start_index && start_index_epoch == epoch ? *start_index : 0;
  }

  // Where the current share starts in the epoch's order (before the epoch started: the pending one).
  int64_t current_share_start() const {
    if (started) return share_start;
    return start_index && start_index_epoch == epoch ? pending_share_start : 0;
  }

  // Makes the current epoch start at index `start` of the share at share_offset (validated).
  void set_start(int64_t share_offset, int64_t start) {
    const int64_t count = share_size(dataset_size, options, share_offset);
    if (start < 0 || start > count) {
      throw InvalidArgument(str("DistributedSampler::set_start_index(", start, "): must be in [0, ", count,
                                "], the number of samples per rank"));
    }
    start_index = start;
    pending_share_start = share_offset;
    start_index_epoch = epoch;
    started = false;
  }

  mutable std::mutex mutex;
  int64_t dataset_size;
  DistributedSamplerOptions options;
  int64_t epoch = 0;
  std::optional<int64_t> start_index;
  int64_t pending_share_start = 0;  // the share start_index counts in
  int64_t start_index_epoch = 0;
  bool started = false;  // false: the next next() starts the epoch first
  std::vector<int64_t> indices;
  int64_t share_start = 0;  // See Note [Re-sharding at a new world size]
  int64_t position = 0;
};

DistributedSampler::DistributedSampler(int64_t dataset_size, const DistributedSamplerOptions& options)
    : state_(std::make_shared<State>(dataset_size, options)) {
  check_options(dataset_size, options);
}

DistributedSampler::DistributedSampler(int64_t dataset_size, const ProcessGroup& group)
    : DistributedSampler(dataset_size, DistributedSamplerOptions(group.size(), group.rank())) {}

DistributedSampler::DistributedSampler(std::shared_ptr<State> state) : state_(std::move(state)) {}

void DistributedSampler::reset(std::optional<size_t> new_size) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (new_size) {
    check_options(static_cast<int64_t>(*new_size), state_->options);
    state_->dataset_size = static_cast<int64_t>(*new_size);
  }
  state_->start_epoch();
}

std::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!state_->started) state_->start_epoch();
  const auto available = static_cast<int64_t>(state_->indices.size()) - state_->position;
  if (available <= 0 || batch_size == 0) return std::nullopt;
  const int64_t count = std::min<int64_t>(available, static_cast<int64_t>(batch_size));
  const auto first = state_->indices.begin() + state_->position;
  std::vector<size_t> batch(first, first + count);
  state_->position += count;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const auto write = [&](const char* key, int64_t value) {
    archive.write(key, torch::tensor(value, torch::kInt64), /*is_buffer=*/true);
  };
  write("dataset_size", state_->dataset_size);
  write("num_replicas", state_->options.num_replicas);
  write("seed", static_cast<int64_t>(state_->options.seed));
  write("shuffle", state_->options.shuffle ? 1 : 0);
  write("drop_last", state_->options.drop_last ? 1 : 0);
  write("epoch", state_->epoch);
  write("position", state_->current_position());
  write("offset", offset_after(state_->dataset_size, state_->options, state_->current_share_start(),
                               state_->current_position()));
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  const int64_t size = read_int(archive, "dataset_size");
  const int64_t seed = read_int(archive, "seed");
  const bool shuffle = read_int(archive, "shuffle") != 0;
  const bool drop_last = read_int(archive, "drop_last") != 0;
  const DistributedSamplerOptions& mine = options();
  if (size != dataset_size() || static_cast<uint64_t>(seed) != mine.seed ||
      shuffle != mine.shuffle || drop_last != mine.drop_last) {
    throw InvalidArgument(str(
        "DistributedSampler::load: the saved sampler has dataset size ", size, ", seed ", seed,
        ", shuffle ", shuffle, ", drop_last ", drop_last, " but this one has ", dataset_size(), ", ",
        mine.seed, ", ", mine.shuffle, ", ", mine.drop_last,
        ": construct the sampler with the options it was saved with"));
  }
  SamplerState saved{read_int(archive, "epoch"), read_int(archive, "position"), read_int(archive, "num_replicas"),
                     std::nullopt};
  torch::Tensor offset;
  if (archive.try_read("offset", offset)) saved.offset = offset.item<int64_t>();  // absent in older archives
  set_state(saved);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (epoch != state_->epoch) state_->started = false;
  state_->epoch = epoch;
}

int64_t DistributedSampler::epoch() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->epoch;
}

void DistributedSampler::set_start_index(int64_t start) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->set_start(/*share_offset=*/0, start);
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->started) return state_->indices;
  return share_indices(state_->dataset_size, state_->options, state_->epoch, state_->current_share_start());
}

int64_t DistributedSampler::size() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return samples_per_rank(state_->dataset_size, state_->options);
}

int64_t DistributedSampler::dataset_size() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->dataset_size;
}

int64_t DistributedSampler::position() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->current_position();
}

SamplerState DistributedSampler::state(std::optional<int64_t> consumed) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const int64_t share = state_->current_share_start();
  // A loop that counts batch_size x batches overshoots at the end of the epoch: that is its end.
  const int64_t position = std::clamp<int64_t>(consumed ? *consumed : state_->current_position(), 0,
                                               share_size(state_->dataset_size, state_->options, share));
  return {state_->epoch, position, state_->options.num_replicas,
          offset_after(state_->dataset_size, state_->options, share, position)};
}

void DistributedSampler::set_state(const SamplerState& state) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  // Everything is checked before anything changes: a bad state leaves the sampler as it was.
  const ResumePoint point = resume_point(state, state_->dataset_size, state_->options);
  const int64_t count = share_size(state_->dataset_size, state_->options, point.share_start);
  if (point.start_index > count) {
    throw InvalidArgument(str("sampler state: position ", state.position, " is beyond the ", count,
                              " samples per rank of the epoch: it was saved for another data set"));
  }
  if (state.epoch != state_->epoch) state_->started = false;
  state_->epoch = state.epoch;
  state_->set_start(point.share_start, point.start_index);
}

const DistributedSamplerOptions& DistributedSampler::options() const {
  // Options never change after construction: no lock needed for the reference.
  return state_->options;
}

DistributedSampler DistributedSampler::clone() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto copy = std::make_shared<State>(state_->dataset_size, state_->options);
  copy->epoch = state_->epoch;
  copy->start_index = state_->start_index;
  copy->pending_share_start = state_->pending_share_start;
  copy->start_index_epoch = state_->start_index_epoch;
  copy->started = state_->started;
  copy->indices = state_->indices;
  copy->share_start = state_->share_start;
  copy->position = state_->position;
  return DistributedSampler(std::move(copy));
}

}  // namespace ddp::samplers
