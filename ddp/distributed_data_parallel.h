#pragma once
// DistributedDataParallel: wraps a torch::nn module so that loss.backward() leaves gradients
// averaged over all ranks, with the all-reduces overlapped with backward.
// The template is a thin shell; the logic is in detail::DdpCore (distributed_data_parallel.cpp) and its
// reducer (ddp/reducer.h: buckets, all-reduces, the end of backward).
#include <torch/torch.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm_hook.h"
#include "ddp/comm_hooks.h"
#include "ddp/ddp_stats.h"
#include "ddp/process_group.h"

namespace ddp {

// DistributedDataParallel's options: a plain struct (c10d's style), e.g.
//   ddp::DdpOptions options;
//   options.find_unused_parameters = true;
struct DdpOptions {
  // See Note [Bucket assignment] in ddp/bucket.h.
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;
  // Find, after each forward, the parameters backward will not reach and treat them as ready.
  bool find_unused_parameters = false;
  // Broadcast buffers (BatchNorm statistics) from rank 0 at the start of each forward.
  bool broadcast_buffers = true;
  // param.grad becomes a view into the bucket: no copies in or out, less memory.
  bool gradient_as_bucket_view = false;
  CommHook comm_hook = CommHook::kAllreduce;
  // Rebuild the buckets once, in the order gradients became ready in the first synchronized
  // backward (see Note [Bucket rebuild] in ddp/bucket.h). Ignored with find_unused_parameters.
  bool rebuild_buckets = true;
};

// PyTorch's bucket_cap_mb in bytes: DdpOptions o; o.bucket_cap_bytes = mebibytes(2.5);
inline std::size_t mebibytes(double mb) { return static_cast<std::size_t>(mb * (1 << 20)); }

// Options of join() (PyTorch's Join / DDP.join arguments).
struct JoinOptions {
  // true: gradients are divided by the full world size even when some ranks have joined (they
  // contribute zeros), PyTorch's default. false: divided by the number of ranks still training.
  bool divide_by_initial_world_size = true;
};

namespace detail {

struct Reducer;  // ddp/reducer.h (internal)

// The non-template core: buckets, autograd hooks, collectives, statistics.
class DdpCore {
 public:
  using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;
  DdpCore(NamedTensors parameters, NamedTensors buffers, std::shared_ptr<ProcessGroup> group,
          DdpOptions options);
  ~DdpCore();
  DdpCore(const DdpCore&) = delete;
  DdpCore& operator=(const DdpCore&) = delete;

  void before_forward();
  void after_forward(const std::vector<torch::Tensor>& outputs);
  // Called by the autograd hook of parameter `index` once its gradient is accumulated.
  void on_gradient_ready(std::size_t index);

  bool set_sync(bool enabled);  // returns the previous value
  void join(const std::function<void()>& loop, const JoinOptions& options);
  DdpStats stats() const;
  // The parameter names of each bucket, in launch order.
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  const ProcessGroup& group() const;
  // See Note [Registering a hook] in distributed_data_parallel.cpp.
  void register_comm_hook(std::shared_ptr<CommHookInterface> hook);
  CommHookInterface& comm_hook() const;

 private:
  std::unique_ptr<Reducer> impl_;
};

// The tensors of a forward's output that autograd can start from (for find_unused_parameters).
inline void collect_output_tensors(const torch::Tensor& t, std::vector<torch::Tensor>& out) { out.push_back(t); }
inline void collect_output_tensors(const std::vector<torch::Tensor>& v, std::vector<torch::Tensor>& out) {
  out.insert(out.end(), v.begin(), v.end());
}
template <class... T>
void collect_output_tensors(const std::tuple<T...>& t, std::vector<torch::Tensor>& out) {
  std::apply([&](const auto&... item) { (collect_output_tensors(item, out), ...); }, t);
}
template <class A, class B>
void collect_output_tensors(const std::pair<A, B>& p, std::vector<torch::Tensor>& out) {
  collect_output_tensors(p.first, out);
  collect_output_tensors(p.second, out);
}
template <class T>
void collect_output_tensors(const T&, std::vector<torch::Tensor>&) {}  // not a tensor: nothing to traverse

}  // namespace detail

// RAII guard of no_sync(): while it lives, backward accumulates gradients locally without
// communicating; the next synchronized backward all-reduces the accumulated gradients.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(detail::DdpCore& core) : core_(&core), previous_(core.set_sync(false)) {}
  NoSyncGuard(NoSyncGuard&& other) noexcept : core_(std::exchange(other.core_, nullptr)), previous_(other.previous_) {}
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  ~NoSyncGuard() {
    if (core_ != nullptr) core_->set_sync(previous_);
  }

 private:
  detail::DdpCore* core_;
  bool previous_;
};

// Usage:
//   auto pg = ddp::init_process_group();
//   ddp::DistributedDataParallel<Net> model(Net(), pg);
//   auto loss = torch::mse_loss(model(x), y);
//   loss.backward();          // gradients are averaged over the world when this returns
//   optimizer.step();
template <class ModuleHolder>
class DistributedDataParallel {
 public:
  DistributedDataParallel(ModuleHolder module, std::shared_ptr<ProcessGroup> group, DdpOptions options = {})
      : module_(std::move(module)),
        core_(std::make_unique<detail::DdpCore>(named(module_->named_parameters(true)),
                                                named(module_->named_buffers(true)), std::move(group),
                                                options)) {}

  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    core_->before_forward();
    auto output = module_->forward(std::forward<Args>(args)...);
    std::vector<torch::Tensor> roots;
    detail::collect_output_tensors(output, roots);
    core_->after_forward(roots);
    return output;
  }
  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  ModuleHolder& module() { return module_; }
  const ModuleHolder& module() const { return module_; }
  std::vector<torch::Tensor> parameters(bool recurse = true) const { return module_->parameters(recurse); }
  torch::OrderedDict<std::string, torch::Tensor> named_parameters(bool recurse = true) const {
    return module_->named_parameters(recurse);
  }
  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }
  bool is_training() const { return module_->is_training(); }

  // Gradient accumulation: auto guard = model.no_sync(); ... backward() ...
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*core_); }

  // Uneven inputs: runs `loop` (this rank's training loop); a rank that finishes early keeps
  // taking part in the others' collectives with zero gradients until every rank has finished,
  // then all ranks take the parameters and buffers of the rank that trained longest.
  void join(const std::function<void()>& loop, JoinOptions options = {}) { core_->join(loop, options); }

  DdpStats stats() const { return core_->stats(); }
  // The current bucket layout: each bucket's parameter names, in launch order (after the first
  // synchronized iteration, the rebuilt layout: see Note [Bucket rebuild] in ddp/bucket.h).
  std::vector<std::vector<std::string>> bucket_parameter_names() const { return core_->bucket_parameter_names(); }
  const ProcessGroup& process_group() const { return core_->group(); }

  // Replaces DdpOptions::comm_hook's built-in by `hook` (ddp/comm_hook.h; PyTorch's
  // register_comm_hook): once, before the first synchronized backward, the same hook on every rank.
  void register_comm_hook(std::shared_ptr<CommHookInterface> hook) { core_->register_comm_hook(std::move(hook)); }
  // The hook in use (the built-in or the registered one), e.g. for its state() in checkpoints.
  CommHookInterface& comm_hook() const { return core_->comm_hook(); }

 private:
  static detail::DdpCore::NamedTensors named(const torch::OrderedDict<std::string, torch::Tensor>& dict) {
    detail::DdpCore::NamedTensors out;
    out.reserve(dict.size());
    for (const auto& item : dict) out.emplace_back(item.key(), item.value());
    return out;
  }

  ModuleHolder module_;
  std::unique_ptr<detail::DdpCore> core_;
};

}  // namespace ddp
