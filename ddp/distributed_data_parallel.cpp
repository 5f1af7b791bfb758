// DistributedDataParallel's non-template core: construction (model check, the first broadcast,
// the gradient hooks), forward's side (buffer broadcast, heartbeats), join and statistics. The
// gradient path (buckets, all-reduces, the end of backward) is in reducer.cpp.
#include "ddp/distributed_data_parallel.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <unistd.h>

#include <cstring>
#include <map>

#include "ddp/base/error.h"
#include "ddp/reducer.h"

namespace ddp {
namespace detail {
namespace {

std::string describe(const std::string& kind, const std::string& name, const torch::Tensor& t) {
  return str(kind, " '", name, "' shape ", t.sizes(), " dtype ", t.scalar_type());
}

// Note [Gradient hooks]
// ~~~~~~~~~~~~~~~~~~~~~
// A post hook on a parameter's gradient accumulator runs right after autograd has accumulated the
// gradient into param.grad, which is the moment the gradient is final for this backward (no_sync
// accumulation included). The accumulator node is kept alive by DdpCore, because the parameter
// only holds it weakly.
struct GradReadyHook : torch::autograd::FunctionPostHook {
  GradReadyHook(DdpCore* core, std::size_t index) : core_(core), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    core_->on_gradient_ready(index_);
    return outputs;
  }
  DdpCore* core_;
  std::size_t index_;
};

}  // namespace

std::vector<FlatGroup> make_flat_groups(const std::vector<torch::Tensor>& tensors) {
  std::map<std::pair<int, std::string>, FlatGroup> groups;
  std::map<std::pair<int, std::string>, std::int64_t> numels;
  for (const auto& t : tensors) numels[{static_cast<int>(t.scalar_type()), t.device().str()}] += t.numel();
  for (const auto& t : tensors) {
    const std::pair<int, std::string> key{static_cast<int>(t.scalar_type()), t.device().str()};
    FlatGroup& group = groups[key];
    if (!group.flat.defined()) group.flat = torch::empty({numels[key]}, t.options());
    std::int64_t offset = 0;
    for (const auto& v : group.views) offset += v.numel();
    group.tensors.push_back(t);
    group.views.push_back(group.flat.narrow(0, offset, t.numel()).view(t.sizes()));
  }
  std::vector<FlatGroup> out;
  for (auto& entry : groups) out.push_back(std::move(entry.second));
  return out;
}

// Note [Model check]
// ~~~~~~~~~~~~~~~~~~
// Every rank all-gathers its parameter count and one hash per parameter/buffer (name, shape,
// dtype). All ranks then compute the same first difference from the same data, all-gather the
// description of that entry, and all throw the same MismatchError: no rank is left waiting.
void Reducer::verify_same_model(const DdpCore::NamedTensors& named_params, const DdpCore::NamedTensors& named_buffers) {
  std::vector<std::string> descriptions;
  for (const auto& [name, t] : named_params) descriptions.push_back(describe("parameter", name, t));
  for (const auto& [name, t] : named_buffers) descriptions.push_back(describe("buffer", name, t));
  const auto long_options = torch::TensorOptions().dtype(torch::kLong).device(group->device());
  auto count = torch::tensor({static_cast<std::int64_t>(descriptions.size())}, long_options);
  auto counts = group->allgather(count, "model check all-gather");
  std::vector<std::int64_t> n(world);
  std::int64_t max_n = 0;
  for (int r = 0; r < world; ++r) {
    n[r] = counts[r].cpu().item<std::int64_t>();
    max_n = std::max(max_n, n[r]);
  }
  auto hashes = torch::zeros({max_n + 1}, torch::kLong);
  for (std::size_t i = 0; i < descriptions.size(); ++i) {
    hashes[static_cast<std::int64_t>(i)] =
        static_cast<std::int64_t>(std::hash<std::string>{}(descriptions[i]) >> 1);
  }
  auto gathered = group->allgather(hashes.to(group->device()), "model check all-gather");
  std::vector<torch::Tensor> all;
  for (auto& g : gathered) all.push_back(g.cpu());
  // First (index, rank) whose entry differs from rank 0's.
  std::int64_t bad_index = -1;
  int bad_rank = -1;
  for (std::int64_t i = 0; i <= max_n && bad_index < 0; ++i) {
    for (int r = 1; r < world; ++r) {
      const bool present0 = i < n[0], present = i < n[r];
      if (present0 != present || (present && all[r][i].item<std::int64_t>() != all[0][i].item<std::int64_t>())) {
        bad_index = i;
        bad_rank = r;
        break;
      }
    }
  }
  if (bad_index < 0) return;
  constexpr std::int64_t kWidth = 512;
  std::string mine = bad_index < static_cast<std::int64_t>(descriptions.size())
                         ? descriptions[bad_index]
                         : str("nothing (it has only ", descriptions.size(), " parameters and buffers)");
  mine.resize(kWidth - 1, '\0');
  auto text = torch::zeros({kWidth}, torch::kByte);
  std::memcpy(text.data_ptr<std::uint8_t>(), mine.data(), mine.size());
  auto texts = group->allgather(text.to(group->device()), "model check all-gather");
  const auto read = [&](int r) {
    auto t = texts[r].cpu();
    return std::string(reinterpret_cast<const char*>(t.data_ptr<std::uint8_t>()));
  };
  throw MismatchError(str("DistributedDataParallel: the model differs between ranks: entry #", bad_index,
                          " is ", read(bad_rank), " on rank ", bad_rank, " but ", read(0),
                          " on rank 0 (rank 0 has ", n[0], " parameters and buffers, rank ", bad_rank,
                          " has ", n[bad_rank], "); every rank must build the same model"));
}

void Reducer::broadcast_from(int src, const std::vector<torch::Tensor>& tensors) {
  if (tensors.empty()) return;
  torch::NoGradGuard no_grad;
  for (auto& g : make_flat_groups(tensors)) {
    if (group->rank() == src) {
      for (std::size_t i = 0; i < g.tensors.size(); ++i) g.views[i].copy_(g.tensors[i]);
    }
    group->broadcast(g.flat, src, "parameter broadcast");
    if (group->rank() != src) {
      for (std::size_t i = 0; i < g.tensors.size(); ++i) g.tensors[i].copy_(g.views[i]);
    }
  }
}

void Reducer::broadcast_buffers() {
  torch::NoGradGuard no_grad;
  for (auto& g : buffer_groups) {
    if (group->rank() == 0) {
      for (std::size_t i = 0; i < g.tensors.size(); ++i) g.views[i].copy_(g.tensors[i]);
    }
    group->broadcast(g.flat, 0, "buffer broadcast");
    if (group->rank() != 0) {
      for (std::size_t i = 0; i < g.tensors.size(); ++i) g.tensors[i].copy_(g.views[i]);
    }
  }
}


// Note [Heartbeat at forward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The heartbeat goes out when a training forward outside no_sync() starts, saying "entering
// iteration N" with the previous iteration's times. A rank that hangs between two iterations
// (data loading, its own code) then stays at N-1 while the others, blocked in iteration N's
// all-reduce, said N: the watchdog can tell the rank that holds the job up from those waiting.
void Reducer::send_heartbeat(std::int64_t now) {
  AgentMessage m;
  m.flags = AgentMessage::kHasStep;
  m.rank = group->rank();
  m.pid = static_cast<std::int32_t>(::getpid());
  m.step = ++heartbeat_step;
  m.step_time_s = last_heartbeat_ns > 0 ? static_cast<double>(now - last_heartbeat_ns) / 1e9 : 0.0;
  m.comm_time_s = static_cast<double>(last_comm_ns) / 1e9;
  m.timestamp_s = wall_seconds_now();
  last_heartbeat_ns = now;
  agent.send(m);
}

// Join: the collectives a rank that has run out of data issues for one iteration of the others.
void Reducer::shadow_iteration(bool others_sync) {
  if (!others_sync) return;
  if (synced_backwards > 0 && rebuild_wanted()) rebuild_buckets();
  if (options.broadcast_buffers && !buffer_groups.empty()) broadcast_buffers();
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    Bucket& b = buckets[i];
    (b.wire.defined() ? b.wire : b.flat).zero_();
    b.work = group->allreduce_async(b.wire.defined() ? b.wire : b.flat, "gradient all-reduce (joined rank)",
                                    static_cast<int>(i));
  }
  for (auto& b : buckets) group->wait(b.work, "gradient all-reduce (joined rank)");
  if (options.find_unused_parameters) {
    used_counts.zero_();
    group->allreduce(used_counts, c10d::ReduceOp::SUM, "unused-parameter all-reduce");
  }
  ++synced_backwards;
}


DdpCore::DdpCore(NamedTensors parameters, NamedTensors buffers, std::shared_ptr<ProcessGroup> group,
                 DdpOptions options)
    : impl_(std::make_unique<Reducer>()) {
  Reducer& m = *impl_;
  if (!group) throw InvalidArgument("DistributedDataParallel: the process group is null");
  m.group = std::move(group);
  m.group->set_collective_algorithm(options.algorithm);
  m.options = options;
  m.world = m.group->size();
  if (options.bucket_cap_bytes == 0 || options.first_bucket_cap_bytes == 0) {
    throw InvalidArgument("DistributedDataParallel: bucket caps must be positive");
  }
  NamedTensors trainable;
  for (auto& entry : parameters) {
    if (entry.second.requires_grad()) trainable.push_back(entry);
  }
  if (trainable.empty()) {
    throw InvalidArgument("DistributedDataParallel: the module has no parameter that requires a gradient");
  }
  if (m.world > 1) m.verify_same_model(trainable, buffers);

  std::vector<torch::Tensor> state;
  for (auto& [name, t] : parameters) state.push_back(t);
  for (auto& [name, t] : buffers) {
    m.buffers.push_back(t);
    state.push_back(t);
  }
  if (m.world > 1) m.broadcast_from(0, state);
  for (auto& [name, t] : trainable) {
    Reducer::Param p;
    p.name = name;
    p.tensor = t;
    m.params.push_back(std::move(p));
  }
  m.build_buckets();
  if (options.broadcast_buffers && m.world > 1) m.buffer_groups = make_flat_groups(m.buffers);
  const std::size_t n = m.params.size();
  m.ready.assign(n, 0);
  m.used_locally.assign(n, 0);
  m.grad_was_undefined.assign(n, 0);
  m.used_counts = torch::zeros({static_cast<std::int64_t>(n)},
                               torch::TensorOptions().dtype(torch::kInt).device(m.group->device()));
  for (std::size_t i = 0; i < n; ++i) {
    auto& p = m.params[i];
    p.accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
    DDP_CHECK(p.accumulator, "parameter '", p.name, "' has no gradient accumulator (is it a leaf?)");
    p.hook_key = p.accumulator->add_post_hook(std::make_unique<GradReadyHook>(this, i));
  }
  m.reset_iteration();
  m.group->logger().debug(str("DistributedDataParallel: ", n, " parameters in ", m.buckets.size(),
                              " buckets (", ddp::join(m.sums.bucket_bytes, ", "), " bytes)"));
}

DdpCore::~DdpCore() {
  for (auto& p : impl_->params) {
    if (p.accumulator) p.accumulator->del_post_hook(p.hook_key);
  }
}

void DdpCore::before_forward() {
  Reducer& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);
  if (m.started) m.reset_iteration();  // the previous backward failed before its end
  m.forward_start_ns = now_ns();
  const bool will_sync = m.world > 1 && m.sync_enabled && torch::GradMode::is_enabled();
  // A training step (at world size 1 too, where nothing is all-reduced) sends its heartbeat.
  if (m.sync_enabled && torch::GradMode::is_enabled() && m.agent.active()) m.send_heartbeat(m.forward_start_ns);
  m.divisor = m.world;
  if (m.joining) {
    auto flags = torch::tensor({1, will_sync ? 1 : 0},
                               torch::TensorOptions().dtype(torch::kInt).device(m.group->device()));
    m.group->allreduce(flags, c10d::ReduceOp::SUM, "join all-reduce");
    const int active = flags[0].item<int>();
    if (!m.divide_by_initial_world_size) m.divisor = active;
    ++m.join_iterations;
  }
  if (will_sync && m.synced_backwards > 0 && m.rebuild_wanted()) m.rebuild_buckets();
  // Only forwards whose backward syncs broadcast (as PyTorch): a forward under NoGradGuard or
  // no_sync() issues no collective, so evaluating on rank 0 alone cannot hang.
  if (will_sync && m.options.broadcast_buffers && !m.buffer_groups.empty()) m.broadcast_buffers();
  m.armed = will_sync;
}

void DdpCore::after_forward(const std::vector<torch::Tensor>& outputs) {
  Reducer& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);
  if (m.armed && m.options.find_unused_parameters && !outputs.empty()) m.find_unused(outputs);
  m.forward_end_ns = now_ns();
}

void DdpCore::on_gradient_ready(std::size_t index) { impl_->on_gradient_ready(index); }

bool DdpCore::set_sync(bool enabled) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return std::exchange(impl_->sync_enabled, enabled);
}

void DdpCore::join(const std::function<void()>& loop, const JoinOptions& options) {
  Reducer& m = *impl_;
  if (m.world == 1) {
    loop();
    return;
  }
  m.joining = true;
  m.divide_by_initial_world_size = options.divide_by_initial_world_size;
  m.join_iterations = 0;
  try {
    loop();
  } catch (...) {
    m.joining = false;
    throw;
  }
  m.joining = false;
  const auto int_options = torch::TensorOptions().dtype(torch::kInt).device(m.group->device());
  while (true) {
    auto flags = torch::zeros({2}, int_options);
    m.group->allreduce(flags, c10d::ReduceOp::SUM, "join all-reduce");
    if (flags[0].item<int>() == 0) break;
    m.shadow_iteration(flags[1].item<int>() > 0);
  }
  // The rank that ran the most iterations (the lowest such rank) has the final model.
  auto key = torch::tensor({m.join_iterations * m.world + (m.world - 1 - m.group->rank())},
                           int_options.dtype(torch::kLong));
  m.group->allreduce(key, c10d::ReduceOp::MAX, "join all-reduce");
  const int source = m.world - 1 - static_cast<int>(key.item<std::int64_t>() % m.world);
  std::vector<torch::Tensor> state;
  for (auto& p : m.params) state.push_back(p.tensor);
  for (auto& b : m.buffers) state.push_back(b);
  m.broadcast_from(source, state);
}

const ProcessGroup& DdpCore::group() const { return *impl_->group; }

std::vector<std::vector<std::string>> DdpCore::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : impl_->buckets) {
    out.emplace_back();
    for (auto i : b.params) out.back().push_back(impl_->params[i].name);
  }
  return out;
}

DdpStats DdpCore::stats() const {
  const Reducer& m = *impl_;
  DdpStats out = m.sums;
  if (out.iterations > 0) {
    const double n = static_cast<double>(out.iterations);
    out.forward_ms /= n;
    out.backward_compute_ms /= n;
    out.communication_ms /= n;
    out.hidden_communication_ms /= n;
    out.exposed_wait_ms /= n;
  }
  return out;
}

void check_same_placement(const std::vector<torch::Tensor>& parameters, const torch::Device* device,
                          const torch::Dtype* dtype) {
  for (const auto& p : parameters) {
    if (device != nullptr && p.device() != *device) {
      throw InvalidArgument(str("DistributedDataParallel::to(", device->str(), "): the parameters are on ",
                                p.device().str(), " and their gradient buckets were laid out there; move the "
                                "module before wrapping it (model.to(device), then DistributedDataParallel)"));
    }
    if (dtype != nullptr && p.scalar_type() != *dtype) {
      throw InvalidArgument(str("DistributedDataParallel::to(", *dtype, "): the parameters are ", p.scalar_type(),
                                " and their gradient buckets were laid out so; convert the module before "
                                "wrapping it"));
    }
  }
}

}  // namespace detail
}  // namespace ddp
