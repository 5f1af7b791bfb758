#include "ddp/algorithms/diloco.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <utility>

#include "ddp/algorithms/detail/diloco_plan.h"
#include "ddp/base/error.h"

namespace ddp {

// Note [DiLoCo]
// ~~~~~~~~~~~~~
// DiLoCo (Douillard et al., 2023) and streaming DiLoCo (2025), as torchft runs them. Every rank keeps
// the global parameters g (on the parameters' device) beside its local ones x, which only the inner
// optimizer moves. When fragment f is due (detail::diloco_sends_at), each rank sends its outer
// gradient d = g - x over the fragment's parameters (the paper's sign: an outer SGD step with lr 1
// and no momentum lands on the ranks' mean x); the mean of d over the ranks then goes through
// PyTorch's SGD rule on g (momentum buffer b = mu b + d, b = d at first; Nesterov d + mu b, else b;
// g -= outer_lr times that), and x becomes alpha x + (1 - alpha) g. With tau > 0 the exchange
// overlaps the next tau inner steps (Gloo runs it on its own thread); those steps' change to the
// fragment is kept in x only as alpha allows (alpha 0, torchft's only choice: dropped), as in the paper.
// With H = 1, F = 1, outer lr 1 and no momentum this is DDP with an all-reduce of the updates each
// step (tests/ddp/test_diloco.cpp checks it against DDP).
// Fragments are contiguous runs of the parameter list of about equal size, one exchange each, sent at
// staggered steps so that the link carries 1 / F of the model at a time.

// Note [Outer gradients in int8]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A sum of int8 values overflows, so int8 payloads are all-gathered (each rank's quantised values and
// block scales) and every rank decodes and averages them in float: each rank receives (N - 1) / 4 of
// the fp32 bytes, against the ring all-reduce's 2 (N - 1) / N: 8 / N times fewer bytes, a gain up to
// 7 ranks (bf16 and fp16, all-reduced in that type, halve the bytes at any N). The error of a value
// is at most its block's max |d| / 254 per rank; the published method sends low-precision outer
// gradients without error feedback, and so does this one. bf16 and fp16 sums round at each of the
// ring's N - 1 additions.

// Note [DiLoCo under FaultTolerant]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// FaultTolerant's apply() must not communicate (a failure there cannot be recovered), so the inner
// step goes there and synchronize() at the start of the next compute(), before the forward: the
// same order as step(). synchronize() runs the events of the current inner step once (synced_step),
// but always first restarts the exchanges that a new group dropped (reset_process_group), in
// fragment order: every rank of a round calls it at the same point, so the collectives match. A
// rank whose outer step completed while a peer's failed is ahead by outer_steps(): FaultTolerant's
// state agreement ranks (steps, outer steps), so that rank's state, the global parameters and
// momentum with it, goes to the others. The state carries the schedule (last send, pending, the
// step synchronised) so a joiner continues it.

namespace detail {

std::vector<int> diloco_fragments(const std::vector<std::int64_t>& numels, std::int64_t fragments) {
  const auto count = static_cast<std::int64_t>(numels.size());
  if (fragments < 1 || fragments > count) {
    throw InvalidArgument(str("DiLoCo: ", fragments, " fragments for ", count,
                              " parameters; use 1 to ", count, " fragments"));
  }
  std::int64_t total = 0;
  for (auto n : numels) total += n;
  std::vector<int> out(numels.size());
  std::int64_t seen = 0;
  int fragment = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    // Move on once this fragment's share is reached, keeping a parameter for each fragment left.
    const bool share_reached = seen * fragments >= total * (fragment + 1);
    if (fragment + 1 < fragments && i > 0 && out[i - 1] == fragment && (share_reached || count - i == fragments - fragment - 1)) {
      ++fragment;
    }
    out[static_cast<std::size_t>(i)] = fragment;
    seen += numels[static_cast<std::size_t>(i)];
  }
  return out;
}

std::int64_t diloco_send_offset(std::int64_t sync_every, std::int64_t fragments, std::int64_t fragment) {
  return sync_every * (fragment + 1) / fragments;
}

bool diloco_sends_at(std::int64_t sync_every, std::int64_t fragments, std::int64_t fragment, std::int64_t step) {
  const std::int64_t offset = diloco_send_offset(sync_every, fragments, fragment);
  return step >= offset && (step - offset) % sync_every == 0;
}

torch::Tensor encode_int8(const torch::Tensor& values, std::int64_t block) {
  const auto flat = values.reshape(-1).to(torch::kFloat32);
  const std::int64_t n = flat.numel();
  const std::int64_t blocks = (n + block - 1) / block;
  const auto padded = torch::constant_pad_nd(flat, {0, blocks * block - n}).view({blocks, block});
  const auto scales = padded.abs().amax(1) / 127.0;
  const auto safe = torch::where(scales > 0, scales, torch::ones_like(scales));
  const auto q = (padded / safe.unsqueeze(1)).round().clamp(-127, 127).to(torch::kInt8).reshape(-1).narrow(0, 0, n);
  return torch::cat({q, scales.contiguous().view(torch::kInt8)});
}

torch::Tensor decode_int8_mean(const torch::Tensor& gathered, int ranks, std::int64_t numel, std::int64_t block) {
  const std::int64_t blocks = (numel + block - 1) / block;
  const auto per_rank = gathered.view({ranks, numel + 4 * blocks});
  auto sum = torch::zeros({blocks * block}, gathered.options().dtype(torch::kFloat32));
  for (int r = 0; r < ranks; ++r) {
    const auto row = per_rank[r];
    const auto q = torch::constant_pad_nd(row.narrow(0, 0, numel).to(torch::kFloat32), {0, blocks * block - numel});
    // clone(): a float view needs a storage offset that is a multiple of 4.
    const auto scales = row.narrow(0, numel, 4 * blocks).clone().view(torch::kFloat32);
    sum += (q.view({blocks, block}) * scales.unsqueeze(1)).reshape(-1);
  }
  return sum.narrow(0, 0, numel) / ranks;
}

}  // namespace detail

OuterDtype parse_outer_dtype(const std::string& name) {
  if (name == "fp32") return OuterDtype::kFloat32;
  if (name == "bf16") return OuterDtype::kBFloat16;
  if (name == "fp16") return OuterDtype::kFloat16;
  if (name == "int8") return OuterDtype::kInt8;
  throw UsageError(str("outer dtype '", name, "' is not fp32, bf16, fp16 or int8"));
}

const char* outer_dtype_name(OuterDtype dtype) {
  switch (dtype) {
    case OuterDtype::kFloat32: return "fp32";
    case OuterDtype::kBFloat16: return "bf16";
    case OuterDtype::kFloat16: return "fp16";
    case OuterDtype::kInt8: return "int8";
  }
  return "?";
}

namespace {

struct Fragment {
  std::vector<std::size_t> params;
  std::int64_t numel = 0;
  std::int64_t last_send = 0;  // the inner step whose exchange was last started (0: none)
  bool pending = false;        // started, its outer step not applied yet
  torch::Tensor payload;       // what this rank sends
  torch::Tensor received;      // the all-reduce's result (the payload itself) or the all-gather's output
  c10::intrusive_ptr<c10d::Work> work;  // null while pending: dropped by a new group, sent again
};

}  // namespace

struct DiLoCo::Impl {
  std::shared_ptr<ProcessGroup> group;
  torch::optim::Optimizer* inner = nullptr;
  DiLoCoOptions options;
  std::vector<torch::Tensor> params;    // x: the inner optimizer's parameters
  std::vector<torch::Tensor> global;    // g
  std::vector<torch::Tensor> momentum;  // b (undefined until the first outer step of its fragment)
  std::vector<int> fragment_of;
  std::vector<Fragment> fragments;
  std::int64_t inner_steps = 0;
  std::int64_t outer_steps = 0;
  std::int64_t synced_step = 0;  // the inner step whose events synchronize() ran
  std::int64_t bytes_sent = 0;

  void start(Fragment& f) {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> deltas;
    for (auto i : f.params) deltas.push_back((global[i] - params[i]).reshape(-1).to(torch::kFloat32));
    const auto flat = torch::cat(deltas);
    const int ranks = group->size();
    if (options.outer_dtype == OuterDtype::kInt8) {
      f.payload = detail::encode_int8(flat, kOuterInt8Block);
      f.received = torch::empty({ranks * f.payload.numel()}, f.payload.options());
      f.work = group->allgather_into_tensor_async(f.received, f.payload, "DiLoCo outer gradient (int8)");
    } else {
      const auto half = options.outer_dtype == OuterDtype::kBFloat16 ? torch::kBFloat16 : torch::kFloat16;
      f.payload = options.outer_dtype == OuterDtype::kFloat32 ? flat : flat.to(half);
      f.received = f.payload;
      f.work = group->allreduce_async(f.received, c10d::ReduceOp::SUM, "DiLoCo outer gradient");
    }
    bytes_sent += f.payload.numel() * static_cast<std::int64_t>(f.payload.element_size());
    f.pending = true;
  }

  void apply(Fragment& f) {
    if (!f.work) start(f);
    group->wait(f.work, "DiLoCo outer gradient");
    f.work.reset();
    const int ranks = group->size();
    const auto mean = options.outer_dtype == OuterDtype::kInt8
                          ? detail::decode_int8_mean(f.received, ranks, f.numel, kOuterInt8Block)
                          : f.received.to(torch::kFloat32) / ranks;
    torch::NoGradGuard no_grad;
    std::int64_t offset = 0;
    const double mu = options.outer_momentum;
    for (auto i : f.params) {
      const auto d = mean.narrow(0, offset, global[i].numel()).view_as(global[i]).to(global[i].scalar_type());
      offset += global[i].numel();
      torch::Tensor direction = d;
      if (mu != 0) {
        if (!momentum[i].defined()) {
          momentum[i] = d.clone();
        } else {
          momentum[i].mul_(mu).add_(d);
        }
        direction = options.nesterov ? d + mu * momentum[i] : momentum[i];
      }
      global[i].sub_(direction, options.outer_lr);
      if (options.update_alpha == 0) {
        params[i].copy_(global[i]);
      } else {
        params[i].mul_(options.update_alpha).add_(global[i], 1 - options.update_alpha);
      }
    }
    f.payload = torch::Tensor();
    f.received = torch::Tensor();
    f.pending = false;
    ++outer_steps;
  }
};

DiLoCo::DiLoCo(std::shared_ptr<ProcessGroup> group, torch::optim::Optimizer& inner, DiLoCoOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (!group) throw InvalidArgument("DiLoCo: the process group is null");
  const auto& o = options;
  if (o.sync_every < 1 || o.fragments < 1 || o.fragments > o.sync_every || o.sync_delay < 0 ||
      o.sync_delay >= std::max<std::int64_t>(1, o.sync_every / o.fragments) || o.update_alpha < 0 ||
      o.update_alpha > 1 || o.outer_lr <= 0 || o.outer_momentum < 0 || o.outer_momentum >= 1) {
    throw InvalidArgument(str("DiLoCo: sync_every ", o.sync_every, ", fragments ", o.fragments, ", sync_delay ",
                              o.sync_delay, ", update_alpha ", o.update_alpha, ", outer_lr ", o.outer_lr,
                              ", outer_momentum ", o.outer_momentum,
                              ": need sync_every >= 1, 1 <= fragments <= sync_every, 0 <= sync_delay < "
                              "sync_every / fragments, alpha in [0, 1], outer_lr > 0, momentum in [0, 1)"));
  }
  impl_->group = std::move(group);
  impl_->inner = &inner;
  impl_->options = options;
  torch::NoGradGuard no_grad;
  std::vector<std::int64_t> numels;
  for (auto& param_group : inner.param_groups()) {
    for (auto& p : param_group.params()) {
      impl_->params.push_back(p);
      impl_->global.push_back(p.detach().clone());
      numels.push_back(p.numel());
    }
  }
  if (impl_->params.empty()) throw InvalidArgument("DiLoCo: the inner optimizer has no parameters");
  impl_->momentum.resize(impl_->params.size());
  impl_->fragment_of = detail::diloco_fragments(numels, options.fragments);
  impl_->fragments.resize(static_cast<std::size_t>(options.fragments));
  for (std::size_t i = 0; i < numels.size(); ++i) {
    auto& f = impl_->fragments[static_cast<std::size_t>(impl_->fragment_of[i])];
    f.params.push_back(i);
    f.numel += numels[i];
  }
}

DiLoCo::~DiLoCo() = default;

void DiLoCo::step() {
  inner_step();
  synchronize();
}

void DiLoCo::inner_step() {
  impl_->inner->step();
  ++impl_->inner_steps;
}

void DiLoCo::synchronize() {
  auto& m = *impl_;
  const std::int64_t s = m.inner_steps;
  // Exchanges a new group dropped go first (See Note [DiLoCo under FaultTolerant]).
  for (auto& f : m.fragments) {
    if (f.pending && !f.work) m.start(f);
  }
  if (m.synced_step == s) return;
  const auto& o = m.options;
  for (std::int64_t i = 0; i < o.fragments; ++i) {
    auto& f = m.fragments[static_cast<std::size_t>(i)];
    if (f.last_send != s && detail::diloco_sends_at(o.sync_every, o.fragments, i, s)) {
      if (f.pending) m.apply(f);  // cannot happen with sync_delay < H / F; kept for loaded states
      f.last_send = s;
      m.start(f);
    }
  }
  for (auto& f : m.fragments) {
    if (f.pending && s >= f.last_send + o.sync_delay) m.apply(f);
  }
  m.synced_step = s;
}

void DiLoCo::finish() {
  auto& m = *impl_;
  synchronize();
  for (auto& f : m.fragments) {
    if (!f.pending && f.last_send != m.inner_steps) {
      f.last_send = m.inner_steps;
      m.start(f);
    }
  }
  for (auto& f : m.fragments) {
    if (f.pending) m.apply(f);
  }
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < m.params.size(); ++i) m.params[i].copy_(m.global[i]);
}

std::int64_t DiLoCo::inner_steps() const { return impl_->inner_steps; }
std::int64_t DiLoCo::outer_steps() const { return impl_->outer_steps; }
std::int64_t DiLoCo::bytes_sent() const { return impl_->bytes_sent; }
const DiLoCoOptions& DiLoCo::options() const { return impl_->options; }
const std::vector<int>& DiLoCo::fragment_of_parameter() const { return impl_->fragment_of; }

StateDict DiLoCo::state() const {
  const auto& m = *impl_;
  const auto scalar = [](std::int64_t v) { return torch::tensor({v}, torch::kLong); };
  StateDict out;
  out.insert("sync_every", scalar(m.options.sync_every));
  out.insert("fragments", scalar(m.options.fragments));
  out.insert("inner_steps", scalar(m.inner_steps));
  out.insert("outer_steps", scalar(m.outer_steps));
  out.insert("synced_step", scalar(m.synced_step));
  for (std::size_t f = 0; f < m.fragments.size(); ++f) {
    out.insert(str("last_send.", f), scalar(m.fragments[f].last_send));
    out.insert(str("pending.", f), scalar(m.fragments[f].pending ? 1 : 0));
  }
  for (std::size_t i = 0; i < m.global.size(); ++i) {
    out.insert(str("global.", i), m.global[i]);
    if (m.momentum[i].defined()) out.insert(str("momentum.", i), m.momentum[i]);
  }
  return out;
}

void DiLoCo::load_state(const StateDict& state) {
  auto& m = *impl_;
  const auto get = [&](const std::string& key) -> const torch::Tensor& {
    const auto* t = state.find(key);
    if (t == nullptr) throw InvalidArgument(str("DiLoCo::load_state: the state lacks '", key, "'"));
    return *t;
  };
  const auto integer = [&](const std::string& key) { return get(key).item<std::int64_t>(); };
  if (integer("sync_every") != m.options.sync_every || integer("fragments") != m.options.fragments) {
    throw InvalidArgument(str("DiLoCo::load_state: the state is of sync_every ", integer("sync_every"), " and ",
                              integer("fragments"), " fragments, this DiLoCo of ", m.options.sync_every, " and ",
                              m.options.fragments));
  }
  for (std::size_t i = 0; i < m.global.size(); ++i) {
    const auto& g = get(str("global.", i));
    if (g.sizes() != m.global[i].sizes()) {
      throw InvalidArgument(str("DiLoCo::load_state: global parameter ", i, " is ", g.sizes(), " there, ",
                                m.global[i].sizes(), " here"));
    }
  }
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < m.global.size(); ++i) {
    m.global[i].copy_(get(str("global.", i)));
    const auto* b = state.find(str("momentum.", i));
    m.momentum[i] = b == nullptr ? torch::Tensor() : b->to(m.global[i].options()).clone();
  }
  m.inner_steps = integer("inner_steps");
  m.outer_steps = integer("outer_steps");
  m.synced_step = integer("synced_step");
  for (std::size_t f = 0; f < m.fragments.size(); ++f) {
    auto& fragment = m.fragments[f];
    fragment.last_send = integer(str("last_send.", f));
    fragment.pending = integer(str("pending.", f)) != 0;
    fragment.work.reset();
    fragment.payload = fragment.received = torch::Tensor();
  }
}

void DiLoCo::reset_process_group(std::shared_ptr<ProcessGroup> group) {
  if (!group) throw InvalidArgument("DiLoCo::reset_process_group: the process group is null");
  impl_->group = std::move(group);
  for (auto& f : impl_->fragments) {
    f.work.reset();
    f.payload = f.received = torch::Tensor();
  }
}

}  // namespace ddp
