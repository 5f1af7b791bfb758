#include "samplers/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <algorithm>
#include <mutex>

#include "ddp/base/error.h"
#include "ddp/process_group.h"

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

std::vector<int64_t> epoch_order(int64_t dataset_size, const DistributedSamplerOptions& options,
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
  const std::vector<int64_t> order = epoch_order(dataset_size, options, epoch);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(samples_per_rank(dataset_size, options)));
  for (size_t i = static_cast<size_t>(options.rank); i < order.size();
       i += static_cast<size_t>(options.num_replicas)) {
    mine.push_back(order[i]);
  }
  return mine;
}

int64_t convert_start_index(const SamplerState& state, int64_t num_replicas) {
  if (state.position < 0 || state.num_replicas < 1 || num_replicas < 1) {
    throw InvalidArgument(str("sampler state: invalid position ", state.position,
                              " or num_replicas ", state.num_replicas, " -> ", num_replicas));
  }
  if (state.num_replicas == num_replicas) return state.position;
  // All ranks advance in step, so position p in a world of R means global offsets [0, p * R) done.
  return state.position * state.num_replicas / num_replicas;
}

struct DistributedSampler::State {
  State(int64_t size, DistributedSamplerOptions opts) : dataset_size(size), options(opts) {}

  // Computes the current epoch's order and moves to its start (see Note [Sampler epoch start]).
  void start_epoch() {
    indices = rank_indices(dataset_size, options, epoch);
    position = 0;
    if (start_index && start_index_epoch == epoch) {
      position = std::min<int64_t>(*start_index, static_cast<int64_t>(indices.size()));
    }
    start_index.reset();
    started = true;
  }

  // Position in the current epoch; before it started, the pending start index.
  int64_t current_position() const {
    if (started) return position;
    return start_index && start_index_epoch == epoch ? *start_index : 0;
  }

  mutable std::mutex mutex;
  int64_t dataset_size;
  DistributedSamplerOptions options;
  int64_t epoch = 0;
  std::optional<int64_t> start_index;
  int64_t start_index_epoch = 0;
  bool started = false;  // false: the next next() starts the epoch first
  std::vector<int64_t> indices;
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
  set_state({read_int(archive, "epoch"), read_int(archive, "position"),
             read_int(archive, "num_replicas")});
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
  const int64_t per_rank = samples_per_rank(state_->dataset_size, state_->options);
  if (start < 0 || start > per_rank) {
    throw InvalidArgument(str("DistributedSampler::set_start_index(", start,
                              "): must be in [0, ", per_rank, "], the number of samples per rank"));
  }
  state_->start_index = start;
  state_->start_index_epoch = state_->epoch;
  state_->started = false;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->started) return state_->indices;
  return rank_indices(state_->dataset_size, state_->options, state_->epoch);
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
  const int64_t position = consumed ? *consumed : state_->current_position();
  return {state_->epoch, position, state_->options.num_replicas};
}

void DistributedSampler::set_state(const SamplerState& state) {
  const int64_t start = std::min(convert_start_index(state, options().num_replicas), size());
  set_epoch(state.epoch);
  set_start_index(start);
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
  copy->start_index_epoch = state_->start_index_epoch;
  copy->started = state_->started;
  copy->indices = state_->indices;
  copy->position = state_->position;
  return DistributedSampler(std::move(copy));
}

}  // namespace ddp::samplers
