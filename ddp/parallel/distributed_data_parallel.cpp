// DistributedDataParallel's non-template core: construction (the gradient hooks on the
// accumulators), forward's side (buffer broadcast, observers), hook registration and join. The
// gradient path (buckets, the communication hook, the end of backward) is in reducer.cpp, the model
// check and broadcasts in model_sync.cpp, statistics in iteration_stats.cpp, the launcher's
// heartbeat in heartbeat_observer.cpp.
#include "ddp/parallel/distributed_data_parallel.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "ddp/base/error.h"
#include "ddp/parallel/detail/heartbeat_observer.h"
#include "ddp/parallel/detail/reducer.h"

namespace ddp {
namespace detail {
namespace {

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

DdpCore::DdpCore(NamedTensors parameters, NamedTensors buffers, std::shared_ptr<ProcessGroup> group,
                 DdpOptions options)
    : impl_(std::make_unique<Reducer>()) {
  Reducer& m = *impl_;
  if (!group) throw InvalidArgument("DistributedDataParallel: the process group is null");
  m.group = std::move(group);
  m.group->set_collective_algorithm(options.algorithm);
  m.options = options;
  m.hook = make_comm_hook(options.comm_hook);
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
  if (m.world > 1) verify_same_model(*m.group, trainable, buffers);

  std::vector<torch::Tensor> state;
  for (auto& [name, t] : parameters) state.push_back(t);
  for (auto& [name, t] : buffers) {
    m.buffers.push_back(t);
    state.push_back(t);
  }
  if (m.world > 1) broadcast_coalesced(*m.group, 0, state);
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
  // The launcher's rank for this process, not the group's: See Note [Heartbeat steps in a live job].
  if (const auto agent = parse_agent_environment(process_environment())) {
    m.observers.push_back(std::make_unique<HeartbeatObserver>(AgentChannel(agent->socket_path), agent->rank));
  }
  m.group->logger().debug(str("DistributedDataParallel: ", n, " parameters in ", m.buckets.size(),
                              " buckets (", ddp::join(m.stats.bucket_bytes(), ", "), " bytes)"));
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
  m.stats.forward_start_ns = now_ns();
  const bool will_sync = m.world > 1 && m.sync_enabled && torch::GradMode::is_enabled();
  // A training step (at world size 1 too, where nothing is all-reduced) is observed.
  if (m.sync_enabled && torch::GradMode::is_enabled()) {
    for (auto& observer : m.observers) observer->on_training_forward(m.stats.forward_start_ns);
  }
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
  if (will_sync && m.options.broadcast_buffers && !m.buffer_groups.empty()) {
    broadcast_flat_groups(*m.group, 0, m.buffer_groups, "buffer broadcast");
  }
  m.armed = will_sync;
}

void DdpCore::after_forward(const std::vector<torch::Tensor>& outputs) {
  Reducer& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);
  if (m.armed && m.options.find_unused_parameters && !outputs.empty()) m.find_unused(outputs);
  m.stats.forward_end_ns = now_ns();
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
  broadcast_coalesced(*m.group, source, state);
}

const ProcessGroup& DdpCore::group() const { return *impl_->group; }

void DdpCore::reset_process_group(std::shared_ptr<ProcessGroup> group) {
  if (!group) throw InvalidArgument("DistributedDataParallel::reset_process_group: the process group is null");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->joining) throw InvalidArgument("DistributedDataParallel::reset_process_group: not inside join()");
  impl_->reset_group(std::move(group));
}

void DdpCore::abandon_iteration() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->reset_iteration();
}

void DdpCore::continue_after_steps(std::int64_t steps) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (auto& observer : impl_->observers) observer->on_steps_set(steps);
}

void DdpCore::count_wait(std::int64_t wait_ns) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (auto& observer : impl_->observers) observer->on_wait_outside(wait_ns);
}

std::vector<std::vector<std::string>> DdpCore::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : impl_->buckets) {
    out.emplace_back();
    for (auto i : b.params) out.back().push_back(impl_->params[i].name);
  }
  return out;
}

DdpStats DdpCore::stats() const { return impl_->stats.averages(); }

// Note [Registering a hook]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// As PyTorch's register_comm_hook: once per module, before the first synchronized backward (the
// buckets' averaging on the copy is chosen per hook, and a hook's state starts with its first
// bucket). Every rank must register the same hook.
void DdpCore::register_comm_hook(std::shared_ptr<CommHookInterface> hook) {
  Reducer& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);
  if (!hook) throw InvalidArgument("DistributedDataParallel::register_comm_hook: the hook is null");
  if (m.user_hook) {
    throw InvalidArgument(str("DistributedDataParallel::register_comm_hook: a hook ('", m.hook->name(),
                              "') is already registered; register one hook, once"));
  }
  if (m.synced_backwards > 0 || m.started) {
    throw InvalidArgument("DistributedDataParallel::register_comm_hook: register the hook before the first "
                          "synchronized backward");
  }
  m.hook = std::move(hook);
  m.user_hook = true;
  for (auto& b : m.buckets) b.averaged_on_copy = m.hook->reducer_averages(b.flat.scalar_type());
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

CommHookInterface& DdpCore::comm_hook() const { return *impl_->hook; }

}  // namespace detail
}  // namespace ddp
