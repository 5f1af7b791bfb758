#pragma once
// DistributedDataParallel: wraps a torch::nn module so that loss.backward() leaves gradients
// averaged over all ranks, with the all-reduces overlapped with backward.
// The template is a thin shell; the logic is in detail::DdpCore (distributed_data_parallel.cpp) and its
// reducer (ddp/parallel/detail/reducer.h: buckets, all-reduces, the end of backward).
#include <torch/nn/module.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/algorithms/comm.h"
#include "ddp/algorithms/default_comm_hooks.h"
#include "ddp/parallel/ddp_stats.h"
#include "ddp/distributed/process_group.h"

namespace ddp {

// DistributedDataParallel's options: a plain struct (c10d's style), e.g.
//   ddp::DdpOptions options;
//   options.find_unused_parameters = true;
struct DdpOptions {
  // See Note [Bucket assignment] in ddp/parallel/detail/bucket.h.
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
  // backward (see Note [Bucket rebuild] in ddp/parallel/detail/bucket.h). Ignored with find_unused_parameters.
  bool rebuild_buckets = true;
  // The algorithm of the group's collectives over CPU tensors, set on the group by the constructor
  // (see Note [Hierarchical collectives] in ddp/distributed/hierarchical_collectives.h).
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::kAuto;
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

struct Reducer;  // ddp/parallel/detail/reducer.h (internal)

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
  // See Note [Rebinding DDP to a new group] in ddp/parallel/detail/reducer.cpp.
  void reset_process_group(std::shared_ptr<ProcessGroup> group);
  // Drops the synchronized backward in flight (its works), e.g. after one of its collectives failed.
  void abandon_iteration();
  void continue_after_steps(std::int64_t steps);
  void count_wait(std::int64_t wait_ns);
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

// Note [Module forms]
// ~~~~~~~~~~~~~~~~~~~
// LibTorch programs hold their modules in three ways, and a port should not have to change which:
//   Net model;                       a module object (a plain `struct Net : torch::nn::Module`)
//   auto model = std::make_shared<Net>();
//   Linear model(4, 2);              a TORCH_MODULE holder (a shared handle to LinearImpl)
// DistributedDataParallel<M> takes each as it is; class template argument deduction picks M from
// the argument, so `ddp::DistributedDataParallel ddp_model(model, pg);` works for all three:
//   M = Net                 a reference: the wrapper points at the caller's object and does not own
//                           it (the object must outlive the wrapper, as a local in main does); an
//                           rvalue (`DistributedDataParallel<Net> m(Net(), pg)`) is moved into a
//                           wrapper-owned object instead, so no temporary dangles;
//   M = std::shared_ptr<Net>  shares ownership;
//   M = Linear              copies the holder (which shares the module, as holders do).
// Functions that took `Net&` take `DistributedDataParallel<Net>&`: the wrapper is module-like
// (forward, operator(), operator-> to the module, train/eval, parameters, to, zero_grad), so their
// bodies stay as they were. Anything else (a raw pointer, a non-module) stops at one static_assert
// that names the accepted forms, instead of errors from deep inside the template. The form is a
// compile-time property: there is no virtual call and no extra indirection on forward beyond the
// one pointer every form keeps (benchmarks/ddp_bench measures the wrapper at world size 1).
enum class ModuleForm { kReference, kSharedPtr, kHolder, kUnsupported };

namespace detail {

template <class T>
struct IsSharedPtr : std::false_type {};
template <class T>
struct IsSharedPtr<std::shared_ptr<T>> : std::true_type {};

template <class M>
constexpr ModuleForm module_form() {
  if constexpr (IsSharedPtr<M>::value) {
    return std::is_base_of_v<torch::nn::Module, typename M::element_type> ? ModuleForm::kSharedPtr
                                                                         : ModuleForm::kUnsupported;
  } else if constexpr (std::is_base_of_v<torch::detail::ModuleHolderIndicator, M>) {
    return ModuleForm::kHolder;
  } else if constexpr (std::is_class_v<M> && std::is_base_of_v<torch::nn::Module, M>) {
    return ModuleForm::kReference;
  } else {
    return ModuleForm::kUnsupported;
  }
}

// Where a DistributedDataParallel<M> keeps its module: `get()` is the module itself (what
// operator-> returns), `held()` is M as the caller holds it (what module() returns).
template <class M, ModuleForm F = module_form<M>()>
class ModuleSlot {
 public:
  // Stands in for the module so that the wrapper's members compile: only the assert speaks.
  struct Module : torch::nn::Module {
    template <class... Args>
    torch::Tensor forward(Args&&...) {
      return {};
    }
  };
  static_assert(F != ModuleForm::kUnsupported,
                "ddp::DistributedDataParallel wraps a torch::nn::Module in one of three forms: a module object "
                "by reference (Net model; ddp::DistributedDataParallel ddp_model(model, pg);), a "
                "std::shared_ptr<Net>, or a TORCH_MODULE holder (e.g. torch::nn::Linear). See Note [Module forms] "
                "in ddp/parallel/distributed_data_parallel.h");
  template <class A>
  explicit ModuleSlot(A&&) {}
  Module* get() const { return nullptr; }
  M& held();
};

template <class M>
class ModuleSlot<M, ModuleForm::kReference> {
 public:
  using Module = M;
  explicit ModuleSlot(M& module) : module_(&module) {}
  explicit ModuleSlot(M&& module) : owned_(std::make_shared<M>(std::move(module))), module_(owned_.get()) {}
  M* get() const { return module_; }
  M& held() { return *module_; }
  const M& held() const { return *module_; }

 private:
  std::shared_ptr<M> owned_;  // only for an rvalue argument
  M* module_;
};

template <class M>
class ModuleSlot<M, ModuleForm::kSharedPtr> {
 public:
  using Module = typename M::element_type;
  explicit ModuleSlot(M module) : module_(std::move(module)) {
    if (!module_) {
      throw InvalidArgument("DistributedDataParallel: the module pointer is null; pass std::make_shared<Net>(...)");
    }
  }
  Module* get() const { return module_.get(); }
  M& held() { return module_; }
  const M& held() const { return module_; }

 private:
  M module_;
};

template <class M>
class ModuleSlot<M, ModuleForm::kHolder> {
 public:
  using Module = typename M::ContainedType;
  explicit ModuleSlot(M module) : module_(std::move(module)) {
    if (module_.is_empty()) {
      throw InvalidArgument(
          "DistributedDataParallel: the module holder is empty (constructed with nullptr); pass a constructed module");
    }
  }
  Module* get() const { return module_.ptr().get(); }
  M& held() { return module_; }
  const M& held() const { return module_; }

 private:
  M module_;
};

// Throws when `to()` would move the parameters away from where the buckets were laid out.
void check_same_placement(const std::vector<torch::Tensor>& parameters, const torch::Device* device,
                          const torch::Dtype* dtype);

}  // namespace detail

// Usage (see Note [Module forms]):
//   auto pg = ddp::init_process_group();
//   Net model;
//   ddp::DistributedDataParallel ddp_model(model, pg);
//   auto loss = torch::mse_loss(ddp_model(x), y);
//   loss.backward();          // gradients are averaged over the world when this returns
//   optimizer.step();
template <class M>
class DistributedDataParallel {
  using Slot = detail::ModuleSlot<M>;

 public:
  // The module type itself (Net for all of Net, std::shared_ptr<Net> and a holder of Net).
  using ModuleType = typename Slot::Module;

  template <class Arg>
  DistributedDataParallel(Arg&& module, std::shared_ptr<ProcessGroup> group, DdpOptions options = {})
      : slot_(std::forward<Arg>(module)),
        core_(slot_.get() == nullptr
                  ? nullptr
                  : std::make_unique<detail::DdpCore>(named(slot_.get()->named_parameters(true)),
                                                      named(slot_.get()->named_buffers(true)), std::move(group),
                                                      options)) {}

  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    core_->before_forward();
    auto output = slot_.get()->forward(std::forward<Args>(args)...);
    std::vector<torch::Tensor> roots;
    detail::collect_output_tensors(output, roots);
    core_->after_forward(roots);
    return output;
  }
  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // The wrapped module: `ddp_model->fc1` as `model->fc1` or `model.fc1`.
  ModuleType* operator->() { return slot_.get(); }
  const ModuleType* operator->() const { return slot_.get(); }
  // The module as it was given: Net&, std::shared_ptr<Net>& or the holder.
  M& module() { return slot_.held(); }
  const M& module() const { return slot_.held(); }

  std::vector<torch::Tensor> parameters(bool recurse = true) const { return slot_.get()->parameters(recurse); }
  torch::OrderedDict<std::string, torch::Tensor> named_parameters(bool recurse = true) const {
    return slot_.get()->named_parameters(recurse);
  }
  std::vector<torch::Tensor> buffers(bool recurse = true) const { return slot_.get()->buffers(recurse); }
  torch::OrderedDict<std::string, torch::Tensor> named_buffers(bool recurse = true) const {
    return slot_.get()->named_buffers(recurse);
  }
  void train(bool on = true) { slot_.get()->train(on); }
  void eval() { slot_.get()->eval(); }
  bool is_training() const { return slot_.get()->is_training(); }
  void zero_grad(bool set_to_none = true) { slot_.get()->zero_grad(set_to_none); }
  // The gradient buckets live where the parameters were when the wrapper was built, so to() only
  // accepts the current device and dtype (unchanged code calling model.to(device) twice keeps
  // working); move the module before wrapping it. Throws ddp::InvalidArgument otherwise.
  void to(torch::Device device, bool non_blocking = false) {
    detail::check_same_placement(parameters(), &device, nullptr);
    slot_.get()->to(device, non_blocking);
  }
  void to(torch::Dtype dtype, bool non_blocking = false) {
    detail::check_same_placement(parameters(), nullptr, &dtype);
    slot_.get()->to(dtype, non_blocking);
  }
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) {
    detail::check_same_placement(parameters(), &device, &dtype);
    slot_.get()->to(device, dtype, non_blocking);
  }

  // Gradient accumulation: auto guard = model.no_sync(); ... backward() ...
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*core_); }

  // Uneven inputs: runs `loop` (this rank's training loop); a rank that finishes early keeps
  // taking part in the others' collectives with zero gradients until every rank has finished,
  // then all ranks take the parameters and buffers of the rank that trained longest.
  void join(const std::function<void()>& loop, JoinOptions options = {}) { core_->join(loop, options); }

  DdpStats stats() const { return core_->stats(); }
  // The current bucket layout: each bucket's parameter names, in launch order (after the first
  // synchronized iteration, the rebuilt layout: see Note [Bucket rebuild] in ddp/parallel/detail/bucket.h).
  std::vector<std::vector<std::string>> bucket_parameter_names() const { return core_->bucket_parameter_names(); }
  const ProcessGroup& process_group() const { return core_->group(); }
  // Live recovery (See Note [Live recovery] in ddp/elastic/fault_tolerant.h): continues on `group`, a
  // collective of the new group (rank 0's bucket layout reaches every rank). Parameters, buffers,
  // gradients and the hook's state stay as they are; ddp::FaultTolerant calls it.
  void reset_process_group(std::shared_ptr<ProcessGroup> group) { core_->reset_process_group(std::move(group)); }
  // Drops the synchronized backward in flight, e.g. after one of its collectives failed.
  void abandon_iteration() { core_->abandon_iteration(); }
  // The training goes on after `steps` applied steps (a live recovery's new group, a resumed
  // checkpoint): the launcher's heartbeat counts from there, the same step on every rank
  // (See Note [Heartbeat steps in a live job] in ddp/parallel/detail/heartbeat_observer.cpp).
  void continue_after_steps(std::int64_t steps) { core_->continue_after_steps(steps); }
  // This iteration also waited `waited` in a collective of the training loop's own, after the
  // backward (ddp::FaultTolerant's step agreement): the heartbeat counts it with the backward's
  // exposed wait, so that the launcher's straggler report does not take it for this rank's work
  // (See Note [Stragglers] in launcher/observe/straggler.h).
  void count_wait(std::chrono::steady_clock::duration waited) {
    core_->count_wait(std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count());
  }

  // Replaces DdpOptions::comm_hook's built-in by `hook` (ddp/algorithms/comm.h; PyTorch's
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

  Slot slot_;
  std::unique_ptr<detail::DdpCore> core_;
};

// See Note [Module forms]: `DistributedDataParallel ddp_model(model, pg)` deduces M from what
// `model` is (Net, std::shared_ptr<Net> or a holder), for lvalues and rvalues alike.
template <class Arg, class... Rest>
DistributedDataParallel(Arg&&, Rest&&...) -> DistributedDataParallel<std::remove_cv_t<std::remove_reference_t<Arg>>>;

}  // namespace ddp
