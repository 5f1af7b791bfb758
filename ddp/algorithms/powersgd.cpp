#include "ddp/algorithms/powersgd.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/algorithms/detail/powersgd_stages.h"

namespace ddp {

// Note [PowerSGD]
// ~~~~~~~~~~~~~~~
// Per bucket and iteration, as PyTorch's powerSGD_hook (the reference for every choice here):
//  1. Before start_powersgd_iter: the plain average (divide, all-reduce), nothing kept.
//  2. Error feedback: the bucket += the error left by the previous iteration; a copy is kept (in
//     the error buffer itself, which step 6 turns into the new error).
//  3. Each gradient is viewed as a matrix M (n = its first dimension, m = the rest); with
//     r = min(n, m, rank) it is compressed when (n + m) r min_compression_rate < n m. The others
//     (1-D tensors among them: n x 1 never passes the test) are all-reduced as they are, packed.
//  4. Q (m x r): the previous iteration's (warm start, orthogonalised again) or a random one, drawn
//     from a CPU generator seeded by numpy's RandomState(random_seed).randint(10^9), in the order
//     of the matrices grouped by shape (as PyTorch lays them out); P = M Q.
//  5. All-reduce the uncompressed tensors and all Ps (each bucket's Ps in one flat tensor).
//  6. Orthogonalise P; Q = M^T P; all-reduce the Qs; Q /= divisor; M = P Q^T (written into the
//     bucket); error = the copy of step 2 - the bucket's new content (in place); the iteration counts at the
//     last bucket.
// Steps 1, 2-5 run in run(); 6 on the hook's stage thread as soon as the all-reduces of step 5
// end, as PyTorch chains it (Note [PowerSGD stages] in powersgd_stages.cpp). PyTorch all-reduces the Ps after the uncompressed tensors; both are started at once
// here, which changes no figure.

namespace {

// The 2-D view of a gradient PowerSGD works on; 0-D and empty tensors stay uncompressed.
bool matrix_shape(const torch::Tensor& tensor, std::int64_t& n, std::int64_t& m) {
  if (tensor.dim() == 0 || tensor.numel() == 0) return false;
  n = tensor.size(0);
  m = tensor.numel() / n;
  return true;
}

struct Compressed {
  torch::Tensor matrix;  // (1, n, m) view into the bucket
  torch::Tensor p;       // (1, n, r) view into the bucket's P memory
  torch::Tensor q;       // (1, m, r) view into the bucket's Q memory
};

}  // namespace

void orthogonalize(torch::Tensor& matrices, double epsilon) {
  DDP_CHECK(matrices.dim() == 3 && matrices.size(2) <= matrices.size(1),
            "orthogonalize: expected a batch (b, n, r) with r <= n");
  const std::int64_t columns = matrices.size(2);
  const auto dtype = matrices.scalar_type();
  if (columns > 2 && dtype != torch::kHalf && dtype != torch::kBFloat16) {
    auto qr = torch::linalg_qr(matrices);
    matrices.copy_(std::get<0>(qr));
    return;
  }
  for (std::int64_t i = 0; i < columns; ++i) {
    auto column = matrices.narrow(2, i, 1);
    auto norm = torch::linalg_vector_norm(column, 2, std::vector<std::int64_t>{1}, true);
    if (epsilon != 0) norm = norm + epsilon;
    column.div_(norm);
    if (i + 1 < columns) {
      auto rest = matrices.narrow(2, i + 1, columns - i - 1);
      rest.sub_(torch::sum(column * rest, {1}, true) * column);
    }
  }
}

PowerSgdHook::~PowerSgdHook() = default;

PowerSgdHook::PowerSgdHook(PowerSgdOptions options) : options_(options), seeds_(options.random_seed) {
  if (options_.matrix_approximation_rank < 1) {
    throw InvalidArgument(str("PowerSGD: matrix_approximation_rank must be at least 1, got ",
                              options_.matrix_approximation_rank));
  }
  if (options_.min_compression_rate < 0 || options_.orthogonalization_epsilon < 0) {
    throw InvalidArgument("PowerSGD: min_compression_rate and orthogonalization_epsilon must not be negative");
  }
  if ((options_.use_error_feedback || options_.warm_start) && options_.start_powersgd_iter <= 1) {
    throw InvalidArgument(str("PowerSGD: start_powersgd_iter must be above 1 with error feedback or warm start "
                              "(got ", options_.start_powersgd_iter,
                              "): the buckets are rebuilt after the first iteration"));
  }
}

// numpy's legacy RandomState.randint(10^9): 32-bit Mersenne Twister draws masked to 30 bits,
// rejected above the bound (std::mt19937 seeded with an integer is numpy's init_genrand).
std::uint32_t PowerSgdHook::next_seed() {
  constexpr std::uint32_t kHighest = 999999999, kMask = (1u << 30) - 1;
  while (true) {
    const std::uint32_t value = static_cast<std::uint32_t>(seeds_()) & kMask;
    if (value <= kHighest) return value;
  }
}

torch::Tensor PowerSgdHook::error(std::size_t bucket) const {
  const auto found = errors_.find(bucket);
  return found == errors_.end() ? torch::Tensor() : found->second;
}

HookWork PowerSgdHook::run(ProcessGroup& group, GradBucket& bucket) {
  if (iteration_ < options_.start_powersgd_iter) {
    if (bucket.last) ++iteration_;
    return allreduce_average(group, bucket.buffer, bucket.divisor, "gradient all-reduce",
                             static_cast<int>(bucket.index));
  }
  return compress(group, bucket);
}

HookWork PowerSgdHook::compress(ProcessGroup& group, GradBucket& bucket) {
  torch::NoGradGuard no_grad;
  torch::Tensor input = bucket.buffer;
  const std::size_t index = bucket.index;
  const auto options = input.options();
  if (options_.use_error_feedback) {
    // The error buffer keeps this iteration's input (M + the previous error) until step 6 turns it
    // into M - the approximation: one buffer per bucket, no copy allocated every iteration.
    torch::Tensor& error = errors_[index];
    if (error.defined() && error.numel() == input.numel()) {
      if (error.device() != input.device() || error.scalar_type() != input.scalar_type()) error = error.to(options);
      input.add_(error);
      error.copy_(input);
    } else {
      error = input.clone();
    }
  }

  // Step 3: which gradients are compressed; the compressed ones grouped by shape.
  std::vector<torch::Tensor> uncompressed;
  std::vector<std::pair<std::pair<std::int64_t, std::int64_t>, std::vector<torch::Tensor>>> by_shape;
  std::int64_t p_numel = 0, q_numel = 0;
  for (const auto& gradient : bucket.gradients) {
    std::int64_t n = 0, m = 0;
    if (!matrix_shape(gradient, n, m)) {
      uncompressed.push_back(gradient);
      continue;
    }
    const std::int64_t r = std::min({n, m, options_.matrix_approximation_rank});
    const auto whole = n * m, small = (n + m) * r;
    numel_before_ += whole;
    if (static_cast<double>(small) * options_.min_compression_rate < static_cast<double>(whole)) {
      auto key = std::make_pair(n, m);
      auto found = std::find_if(by_shape.begin(), by_shape.end(), [&](const auto& e) { return e.first == key; });
      if (found == by_shape.end()) found = by_shape.insert(by_shape.end(), {key, {}});
      found->second.push_back(gradient.view({1, n, m}));
      p_numel += n * r;
      q_numel += m * r;
      numel_after_ += small;
    } else {
      uncompressed.push_back(gradient);
      numel_after_ += whole;
    }
  }
  std::vector<torch::Tensor> flat_uncompressed;
  for (const auto& t : uncompressed) flat_uncompressed.push_back(t.reshape({-1}));
  torch::Tensor uncompressed_memory =
      flat_uncompressed.empty() ? torch::empty({0}, options) : torch::cat(flat_uncompressed);

  // Step 4: P and Q memory, kept across iterations with warm start.
  torch::Tensor& p_memory = p_memory_[index];
  torch::Tensor& q_memory = q_memory_[index];
  bool randomize = !options_.warm_start || !p_memory.defined() || p_memory.numel() != p_numel ||
                   q_memory.numel() != q_numel;
  if (randomize) {
    p_memory = torch::empty({p_numel}, options);
    q_memory = torch::empty({q_numel}, options);
  } else if (q_memory.device() != input.device() || q_memory.scalar_type() != input.scalar_type()) {
    p_memory = p_memory.to(options);  // loaded from a checkpoint
    q_memory = q_memory.to(options);
  }
  auto compressed = std::make_shared<std::vector<Compressed>>();
  std::int64_t p_at = 0, q_at = 0;
  for (const auto& [shape, matrices] : by_shape) {
    const auto [n, m] = shape;
    const std::int64_t r = std::min({n, m, options_.matrix_approximation_rank});
    for (const auto& matrix : matrices) {
      Compressed c;
      c.matrix = matrix;
      c.p = p_memory.narrow(0, p_at, n * r).view({1, n, r});
      c.q = q_memory.narrow(0, q_at, m * r).view({1, m, r});
      p_at += n * r;
      q_at += m * r;
      compressed->push_back(std::move(c));
    }
  }
  if (!randomize) {
    for (auto& c : *compressed) orthogonalize(c.q, options_.orthogonalization_epsilon);
  } else if (!compressed->empty()) {
    auto generator = at::detail::createCPUGenerator(next_seed());
    for (auto& c : *compressed) {
      c.q.copy_(torch::randn(c.q.sizes(), generator, torch::TensorOptions().dtype(input.scalar_type())));
      orthogonalize(c.q, options_.orthogonalization_epsilon);
    }
  }
  for (auto& c : *compressed) torch::bmm_out(c.p, c.matrix, c.q);

  // Step 5.
  const int tag = static_cast<int>(index);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  if (uncompressed_memory.numel() > 0) {
    works.push_back(group.allreduce_async(uncompressed_memory, "PowerSGD uncompressed all-reduce", tag));
  }
  if (p_memory.numel() > 0) works.push_back(group.allreduce_async(p_memory, "PowerSGD P all-reduce", tag));

  // Step 6, once the all-reduces are done: on the stage thread (Note [PowerSGD stages]), or inline
  // in the reducer's wait where the group's backend cannot be served there.
  const double divisor = bucket.divisor;
  torch::Tensor error = options_.use_error_feedback ? errors_[index] : torch::Tensor();
  const double epsilon = options_.orthogonalization_epsilon;
  auto listener = listener_;
  auto stages = [input, error, uncompressed, uncompressed_memory, compressed, q_all = q_memory, divisor,
                 epsilon, index, listener](ProcessGroup& on) mutable {
    torch::NoGradGuard no_grad;
    if (divisor != 1) uncompressed_memory.div_(divisor);
    std::int64_t at = 0;
    for (auto& t : uncompressed) {
      t.copy_(uncompressed_memory.narrow(0, at, t.numel()).view_as(t));
      at += t.numel();
    }
    for (auto& c : *compressed) {
      orthogonalize(c.p, epsilon);
      torch::bmm_out(c.q, c.matrix.transpose(1, 2), c.p);
    }
    if (!compressed->empty()) on.allreduce(q_all, c10d::ReduceOp::SUM, "PowerSGD Q all-reduce");
    if (divisor != 1) q_all.div_(divisor);
    for (auto& c : *compressed) torch::bmm_out(c.matrix, c.p, c.q.transpose(1, 2));
    if (error.defined()) error.sub_(input);
    if (listener) listener(index);
  };
  // The hook's own state changes here, in the reducer's wait, after the bucket's stages ended.
  const bool last = bucket.last;
  auto finish = [this, input, last] {
    if (!options_.warm_start) {
      p_memory_.clear();
      q_memory_.clear();
    }
    if (last) ++iteration_;
    return input;
  };
  if (!detail::PowerSgdStages::supported(group)) {
    return HookWork(group, std::move(works), "PowerSGD all-reduce", [&group, stages, finish]() mutable {
      stages(group);
      return finish();
    });
  }
  if (!stages_) stages_ = std::make_unique<detail::PowerSgdStages>();
  auto done = stages_->submit(group, std::move(works), "PowerSGD all-reduce", std::move(stages));
  return HookWork(group, {std::move(done)}, "PowerSGD stages", std::move(finish));
}

StateDict PowerSgdHook::state() const {
  StateDict out;
  out.insert("iter", torch::tensor({iteration_}, torch::kLong));
  const std::string text = str(seeds_);
  auto bytes = torch::empty({static_cast<std::int64_t>(text.size())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr<std::uint8_t>(), text.data(), text.size());
  out.insert("rng", bytes);
  const auto add = [&](const char* prefix, const std::map<std::size_t, torch::Tensor>& tensors) {
    for (const auto& [bucket, tensor] : tensors) {
      if (tensor.defined()) out.insert(str(prefix, bucket), tensor.detach().cpu().clone());
    }
  };
  add("error.", errors_);
  add("p.", p_memory_);
  add("q.", q_memory_);
  return out;
}

void PowerSgdHook::load_state(const StateDict& state) {
  const auto* iter = state.find("iter");
  const auto* rng = state.find("rng");
  if (iter == nullptr || rng == nullptr || iter->numel() != 1 || rng->scalar_type() != torch::kUInt8) {
    throw InvalidArgument("PowerSGD: the saved hook state lacks 'iter' or 'rng'; it is not a PowerSGD state");
  }
  std::map<std::size_t, torch::Tensor> errors, ps, qs;
  for (const auto& item : state) {
    const std::string& key = item.key();
    std::map<std::size_t, torch::Tensor>* target = nullptr;
    std::size_t skip = 0;
    if (key.rfind("error.", 0) == 0) target = &errors, skip = 6;
    if (key.rfind("p.", 0) == 0) target = &ps, skip = 2;
    if (key.rfind("q.", 0) == 0) target = &qs, skip = 2;
    if (target == nullptr) continue;
    try {
      (*target)[static_cast<std::size_t>(std::stoul(key.substr(skip)))] = item.value().clone();
    } catch (const std::exception&) {
      throw InvalidArgument(str("PowerSGD: malformed key '", key, "' in the saved hook state"));
    }
  }
  auto bytes = rng->contiguous();
  std::istringstream text(std::string(reinterpret_cast<const char*>(bytes.data_ptr<std::uint8_t>()),
                                      static_cast<std::size_t>(bytes.numel())));
  std::mt19937 seeds;
  text >> seeds;
  if (text.fail()) throw InvalidArgument("PowerSGD: the saved random state is malformed");
  iteration_ = iter->item<std::int64_t>();
  seeds_ = seeds;
  errors_ = std::move(errors);
  p_memory_ = std::move(ps);
  q_memory_ = std::move(qs);
}

}  // namespace ddp
