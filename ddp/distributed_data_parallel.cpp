#include "ddp/distributed_data_parallel.h"

#include <ATen/ScalarOps.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_set>

#include "ddp/agent_channel.h"
#include "ddp/bucket.h"
#include "ddp/base/error.h"

namespace ddp {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;
std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
double ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

std::string describe(const std::string& kind, const std::string& name, const torch::Tensor& t) {
  return str(kind, " '", name, "' shape ", t.sizes(), " dtype ", t.scalar_type());
}

// Note [Gradient hooks]
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

// Tensors of one dtype and device packed into one flat tensor, for broadcasts.
struct FlatGroup {
  torch::Tensor flat;
  std::vector<torch::Tensor> tensors;
  std::vector<torch::Tensor> views;
};

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

}  // namespace

struct DdpCore::Impl {
  struct Param {
    std::string name;
    torch::Tensor tensor;
    c10::intrusive_ptr<torch::autograd::Node> accumulator;
    std::uintptr_t hook_key = 0;
    std::size_t bucket = 0;
    torch::Tensor view;  // this parameter's slice of its bucket, shaped like the parameter
  };
  struct Bucket {
    torch::Tensor flat;
    torch::Tensor wire;  // compressed copy sent by fp16/bf16 hooks; undefined for allreduce
    std::vector<std::size_t> params;
    std::size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;
    std::int64_t launch_ns = 0;
    std::shared_ptr<std::atomic<std::int64_t>> done_ns = std::make_shared<std::atomic<std::int64_t>>(0);
  };

  DdpCore* self;
  std::shared_ptr<ProcessGroup> group;
  DdpOptions options;
  std::vector<Param> params;
  std::vector<torch::Tensor> buffers;
  std::vector<Bucket> buckets;
  std::vector<FlatGroup> buffer_groups;
  int world = 1;

  // Per-iteration state; see Note [Iteration protocol].
  std::mutex mutex;
  bool sync_enabled = true;
  bool armed = false;      // this forward's backward all-reduces
  bool started = false;    // a gradient hook has fired in this backward
  std::vector<char> ready;
  std::vector<char> used_locally;
  std::vector<std::size_t> unused;  // found after forward (find_unused_parameters)
  std::vector<char> grad_was_undefined;
  std::size_t next_launch = 0;
  double divisor = 1;
  torch::Tensor reciprocal;  // wrapped scalar 1 / reciprocal_of (Note [Dividing on the copy])
  double reciprocal_of = 0;
  torch::Tensor used_counts;  // find_unused_parameters: how many ranks used each parameter

  // Bucket rebuild; see Note [Bucket rebuild] in ddp/bucket.h.
  std::vector<std::size_t> ready_order;  // parameters in the order the first synced backward readied them
  std::int64_t synced_backwards = 0;     // completed synchronized backwards (join's shadow ones included)
  bool buckets_rebuilt = false;

  // Join state.
  bool joining = false;
  bool divide_by_initial_world_size = true;
  std::int64_t join_iterations = 0;

  // Timing.
  std::int64_t forward_start_ns = 0, forward_end_ns = 0, last_ready_ns = 0;
  DdpStats sums;

  // Heartbeats to ddp_launch (Note [Agent channel] in ddp/base/agent_message.h): one send per iteration.
  AgentChannel agent = AgentChannel::from_environment(process_environment());
  std::int64_t last_heartbeat_ns = 0;
  std::int64_t last_comm_ns = 0;
  std::int64_t heartbeat_step = 0;

  // --- construction ---------------------------------------------------------------------------

  // Note [Model check]
  // Every rank all-gathers its parameter count and one hash per parameter/buffer (name, shape,
  // dtype). All ranks then compute the same first difference from the same data, all-gather the
  // description of that entry, and all throw the same MismatchError: no rank is left waiting.
  void verify_same_model(const NamedTensors& named_params, const NamedTensors& named_buffers) {
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

  void broadcast_from(int src, const std::vector<torch::Tensor>& tensors) {
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

  void build_buckets(const std::vector<std::size_t>& order = {}) {
    std::vector<std::size_t> sizes;
    std::vector<c10::ScalarType> dtypes;
    std::vector<c10::Device> devices;
    for (const auto& p : params) {
      sizes.push_back(static_cast<std::size_t>(p.tensor.numel()) * p.tensor.element_size());
      dtypes.push_back(p.tensor.scalar_type());
      devices.push_back(p.tensor.device());
    }
    const auto assignment = compute_bucket_assignment(
        sizes, dtypes, devices, BucketCaps{options.first_bucket_cap_bytes, options.bucket_cap_bytes}, order);
    torch::NoGradGuard no_grad;
    for (const auto& indices : assignment) {
      Bucket bucket;
      std::int64_t numel = 0;
      for (auto i : indices) numel += params[i].tensor.numel();
      const auto& first = params[indices.front()].tensor;
      bucket.flat = torch::zeros({numel}, first.options());
      if (auto wire = wire_dtype(options.comm_hook, first.scalar_type())) {
        bucket.wire = torch::zeros({numel}, first.options().dtype(*wire));
      }
      std::int64_t offset = 0;
      for (auto i : indices) {
        Param& p = params[i];
        p.bucket = buckets.size();
        // A tensor sharing the bucket's storage but not an autograd view of it: optimizers call
        // detach_() on gradients, which autograd refuses for views.
        p.view = torch::empty({0}, first.options()).set_(bucket.flat.storage(), offset, p.tensor.sizes(),
                                                         c10::contiguous_strides(p.tensor.sizes()));
        offset += p.tensor.numel();
        if (options.gradient_as_bucket_view && p.tensor.grad().defined()) {
          p.view.copy_(p.tensor.grad());
          p.tensor.mutable_grad() = p.view;
        }
      }
      bucket.params = indices;
      sums.bucket_bytes.push_back(static_cast<std::size_t>(numel) * first.element_size());
      buckets.push_back(std::move(bucket));
    }
  }

  bool rebuild_wanted() const {
    return options.rebuild_buckets && !options.find_unused_parameters && world > 1 && !buckets_rebuilt;
  }

  // Called at a synchronized forward (or its shadow in join) on every rank at the same point, once a
  // synchronized backward has completed: broadcasts rank 0's ready order and rebuilds the buckets in
  // it. Rank 0 sends the current layout's order when it has no complete recorded order.
  void rebuild_buckets() {
    const std::size_t n = params.size();
    std::vector<std::int64_t> order;
    std::vector<char> seen(n, 0);
    for (auto i : ready_order) {
      if (i < n && !seen[i]) order.push_back(static_cast<std::int64_t>(i));
      if (i < n) seen[i] = 1;
    }
    if (order.size() != n) {
      order.clear();
      for (const auto& b : buckets) order.insert(order.end(), b.params.begin(), b.params.end());
    }
    auto wire = torch::tensor(order, torch::TensorOptions().dtype(torch::kLong)).to(group->device());
    group->broadcast(wire, 0);
    wire = wire.cpu();
    std::vector<std::size_t> agreed(n);
    for (std::size_t k = 0; k < n; ++k) agreed[k] = static_cast<std::size_t>(wire[static_cast<std::int64_t>(k)].item<std::int64_t>());
    // gradient_as_bucket_view: param.grad keeps the old bucket's storage alive; build_buckets copies
    // it into the new bucket and points param.grad there.
    buckets.clear();
    sums.bucket_bytes.clear();
    build_buckets(agreed);
    buckets_rebuilt = true;
    ready_order.clear();
    ready_order.shrink_to_fit();
    reset_iteration();
    group->logger().debug(str("DistributedDataParallel: buckets rebuilt in gradient-ready order: ", buckets.size(),
                              " buckets (", ddp::join(sums.bucket_bytes, ", "), " bytes)"));
  }

  // --- iteration --------------------------------------------------------------------------------

  // Note [Iteration protocol]
  // before_forward: (join) agree on who still trains; broadcast buffers; arm if this backward syncs.
  // after_forward: (find_unused_parameters) walk the graph from the outputs to find unused params.
  // First gradient hook: queue the end-of-backward callback, mark unused params ready.
  // Each hook: copy the gradient into its bucket; when a bucket is complete, launch it and every
  // complete bucket after it, strictly in bucket order, so all ranks issue the same collectives.
  // End of backward (engine callback): check that every bucket was launched (else name the
  // parameters that got no gradient), wait, copy averaged gradients back into param.grad.

  void reset_iteration() {
    armed = false;
    started = false;
    std::fill(ready.begin(), ready.end(), 0);
    std::fill(used_locally.begin(), used_locally.end(), 0);
    unused.clear();
    next_launch = 0;
    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.work.reset();
      b.launch_ns = 0;
      b.done_ns->store(0);
    }
  }

  void broadcast_buffers() {
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

  void find_unused(const std::vector<torch::Tensor>& outputs) {
    std::unordered_set<const torch::autograd::Node*> seen;
    std::vector<torch::autograd::Node*> stack;
    for (const auto& out : outputs) {
      if (!out.defined() || !out.requires_grad()) continue;
      auto node = out.grad_fn() ? out.grad_fn() : torch::autograd::impl::try_get_grad_accumulator(out);
      if (node && seen.insert(node.get()).second) stack.push_back(node.get());
    }
    while (!stack.empty()) {
      auto* node = stack.back();
      stack.pop_back();
      for (const auto& edge : node->next_edges()) {
        auto* next = edge.function.get();
        if (next != nullptr && seen.insert(next).second) stack.push_back(next);
      }
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!seen.count(params[i].accumulator.get())) unused.push_back(i);
    }
  }

  // Note [Dividing on the copy]
  // The average is taken before the all-reduce, per gradient, exactly as PyTorch's reducer does it
  // (bit for bit: x * (1 / n) and x / n differ in the last bit of about a third of the elements when
  // n is not a power of two): a gradient copied into its bucket is multiplied by a wrapped scalar
  // 1 / divisor on the way (one pass, no separate division of the bucket), a gradient already in
  // its bucket (gradient_as_bucket_view after the first step) is divided in place. With a
  // compression hook the bucket is copied as it is and the hook divides in its wire dtype (launch),
  // as PyTorch's fp16/bf16 hooks do.
  void mark_ready(std::size_t i, bool has_gradient) {
    // Under create_graph=True backward runs in grad mode and gradients require grad; the bucket is
    // plain data (the all-reduce is not differentiated, as in PyTorch), and out= ops refuse autograd.
    torch::NoGradGuard no_grad;
    Param& p = params[i];
    ready[i] = 1;
    if (synced_backwards == 0 && rebuild_wanted()) ready_order.push_back(i);
    used_locally[i] = has_gradient ? 1 : 0;
    torch::Tensor& grad = p.tensor.mutable_grad();
    grad_was_undefined[i] = grad.defined() ? 0 : 1;
    const bool divide_here = divisor != 1 && !buckets[p.bucket].wire.defined();
    if (!grad.defined()) {
      p.view.zero_();
      if (options.gradient_as_bucket_view && has_gradient) grad = p.view;
    } else if (options.gradient_as_bucket_view && grad.data_ptr() == p.view.data_ptr()) {
      if (divide_here) p.view.div_(divisor);  // already in the bucket (a view since an earlier step)
    } else {
      if (divide_here) {
        if (reciprocal_of != divisor) {
          reciprocal = at::native::wrapped_scalar_tensor(c10::Scalar(1.0 / divisor));
          reciprocal_of = divisor;
        }
        at::mul_out(p.view, grad, reciprocal);
      } else {
        p.view.copy_(grad);
      }
      if (options.gradient_as_bucket_view) grad = p.view;
    }
    Bucket& bucket = buckets[p.bucket];
    if (--bucket.pending == 0) launch_complete_buckets();
  }

  void launch_complete_buckets() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(next_launch++);
  }

  void launch(std::size_t index) {
    Bucket& b = buckets[index];
    b.launch_ns = now_ns();
    torch::Tensor* send = &b.flat;
    if (b.wire.defined()) {
      b.wire.copy_(b.flat);
      send = &b.wire;
    }
    if (divisor != 1 && b.wire.defined()) send->div_(divisor);  // see Note [Dividing on the copy]
    b.work = group->allreduce_async(*send, "gradient all-reduce", static_cast<int>(index));
    auto done = b.done_ns;
    try {
      b.work->getFuture()->addCallback([done](c10::ivalue::Future&) { done->store(now_ns()); });
    } catch (const std::exception&) {
      // No future on this backend: completion is taken when wait() returns.
    }
  }

  // Note [CUDA streams in DDP]
  // The gradient hooks run on autograd's thread for the parameter's device, whose current stream
  // is the one backward computed the gradient on; mark_ready copies into the bucket there.
  // ProcessGroupNCCL's allreduce makes its own stream wait for the current stream before the
  // all-reduce kernel runs, so NCCL reads the finished copy, and NCCL runs on its stream while
  // backward goes on (the overlap). The end-of-backward callback runs on the stream of the thread
  // that called backward (the engine synchronises the leaf streams with it first). There, for NCCL,
  // Work::wait() without a timeout makes that current stream wait for the all-reduce's end event
  // without blocking the host; the copies into param.grad and then optimizer.step() are queued on
  // the same stream after it, so they see the averaged gradients, and the CPU can queue the step
  // while the GPU still reduces. Timeouts of these collectives are the NCCL watchdog's (Note
  // [NCCL error handling] in ddp/cuda_support.cpp). Gloo with CUDA buckets: ProcessGroupGloo
  // stages through host memory; its wait() blocks the host, bounded by the group's timeout, and
  // then orders the current stream after the copy back.
  void wait_bucket(Bucket& b) {
    if (b.flat.is_cuda() && group->backend_name() == "nccl") {
      try {
        b.work->wait();
      } catch (const std::exception& error) {
        const std::string what = error.what();
        throw CommunicationError(str("gradient all-reduce failed on rank ", group->rank(), ": ",
                                     what.substr(0, what.find('\n'))));
      }
      return;
    }
    group->wait(b.work, "gradient all-reduce");
  }

  std::string names_of(const std::vector<std::size_t>& indices) const {
    std::vector<std::string> names;
    for (auto i : indices) names.push_back(params[i].name);
    return ddp::join(names, ", ");
  }

  void on_gradient_ready(std::size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!armed) return;
    if (!started) {
      started = true;
      torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
      for (auto i : unused) mark_ready(i, false);
    }
    if (ready[index]) {
      throw Error(str("DistributedDataParallel: parameter '", params[index].name,
                      "' got a gradient twice in one backward (rank ", group->rank(),
                      "); a parameter that find_unused_parameters reported as unused must not receive a "
                      "gradient, and backward may run only once per forward"));
    }
    mark_ready(index, true);
    last_ready_ns = now_ns();
  }

  void finalize_backward() {
    std::lock_guard<std::mutex> lock(mutex);
    struct Reset {
      Impl* impl;
      ~Reset() { impl->reset_iteration(); }
    } reset{this};
    const std::int64_t compute_end_ns = last_ready_ns;
    const std::int64_t wait_start_ns = now_ns();
    if (next_launch < buckets.size()) {
      std::vector<std::size_t> missing;
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (!ready[i]) missing.push_back(i);
      }
      // Note [Failing without a hang]
      // Other ranks may have used these parameters and launched every bucket. Launch the rest
      // here too (zeros for the missing gradients) and wait, so that their collectives complete;
      // then fail. Their next collective fails fast once this rank has exited.
      for (auto i : missing) mark_ready(i, false);
      for (auto& b : buckets) {
        try {
          if (b.work) group->wait(b.work, "gradient all-reduce");
        } catch (const std::exception&) {
        }
      }
      throw Error(str(
          "DistributedDataParallel: backward finished on rank ", group->rank(), " but ", missing.size(),
          " parameter(s) got no gradient: ", names_of(missing),
          ". Pass DdpOptions().set_find_unused_parameters(true) if the model does not use every "
          "parameter in every iteration, or make every output take part in the loss"));
    }
    for (auto& b : buckets) {
      wait_bucket(b);
      if (b.wire.defined()) b.flat.copy_(b.wire);
    }
    std::vector<char> globally_unused(params.size(), 0);
    if (options.find_unused_parameters) {
      auto counts = used_counts.cpu();
      auto* data = counts.data_ptr<std::int32_t>();
      for (std::size_t i = 0; i < params.size(); ++i) data[i] = used_locally[i];
      used_counts.copy_(counts);
      group->allreduce(used_counts, c10d::ReduceOp::SUM, "unused-parameter all-reduce");
      counts = used_counts.cpu();
      data = counts.data_ptr<std::int32_t>();
      for (std::size_t i = 0; i < params.size(); ++i) globally_unused[i] = data[i] == 0 ? 1 : 0;
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      Param& p = params[i];
      torch::Tensor& grad = p.tensor.mutable_grad();
      // A parameter no rank used keeps the gradient it had (none stays none), as in PyTorch.
      if (globally_unused[i]) {
        if (grad_was_undefined[i]) grad = torch::Tensor();
        continue;
      }
      if (options.gradient_as_bucket_view) {
        if (!grad.defined() || grad.data_ptr() != p.view.data_ptr()) grad = p.view;
      } else if (grad.defined()) {
        grad.copy_(p.view);
      } else {
        grad = p.view.clone();
      }
    }
    record_timing(compute_end_ns, wait_start_ns);
    ++synced_backwards;
  }

  void record_timing(std::int64_t compute_end_ns, std::int64_t wait_start_ns) {
    const std::int64_t end_ns = now_ns();
    std::int64_t first_launch = buckets.front().launch_ns, last_done = 0;
    for (const auto& b : buckets) {
      first_launch = std::min(first_launch, b.launch_ns);
      const std::int64_t done = b.done_ns->load();
      last_done = std::max(last_done, done > 0 ? done : end_ns);
    }
    sums.iterations += 1;
    sums.forward_ms += ms(forward_end_ns - forward_start_ns);
    sums.backward_compute_ms += ms(compute_end_ns - forward_end_ns);
    sums.communication_ms += ms(last_done - first_launch);
    sums.hidden_communication_ms += ms(std::max<std::int64_t>(0, std::min(last_done, compute_end_ns) - first_launch));
    sums.exposed_wait_ms += ms(end_ns - wait_start_ns);
    last_comm_ns = last_done - first_launch;
  }

  // Note [Heartbeat at forward]
  // The heartbeat goes out when a training forward outside no_sync() starts, saying "entering
  // iteration N" with the previous iteration's times. A rank that hangs between two iterations
  // (data loading, its own code) then stays at N-1 while the others, blocked in iteration N's
  // all-reduce, said N: the watchdog can tell the rank that holds the job up from those waiting.
  void send_heartbeat(std::int64_t now) {
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
  void shadow_iteration(bool others_sync) {
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
};

DdpCore::DdpCore(NamedTensors parameters, NamedTensors buffers, std::shared_ptr<ProcessGroup> group,
                 DdpOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.self = this;
  if (!group) throw InvalidArgument("DistributedDataParallel: the process group is null");
  m.group = std::move(group);
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
    Impl::Param p;
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
  Impl& m = *impl_;
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
  Impl& m = *impl_;
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
  Impl& m = *impl_;
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
  const Impl& m = *impl_;
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

}  // namespace detail
}  // namespace ddp
