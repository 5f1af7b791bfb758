// The gradient path of DistributedDataParallel: buckets (and their rebuild), the ready marks of the
// gradient hooks, the communication hook's launches, and the end of backward. See ddp/parallel/detail/reducer.h.
#include "ddp/parallel/detail/reducer.h"

#include <ATen/ScalarOps.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "ddp/base/error.h"
#include "ddp/parallel/detail/bucket.h"

namespace ddp::detail {

void Reducer::build_buckets(const std::vector<std::size_t>& order) {
  std::vector<std::size_t> sizes;
  std::vector<c10::ScalarType> dtypes;
  std::vector<c10::Device> devices;
  for (const auto& p : params) {
    sizes.push_back(static_cast<std::size_t>(p.tensor.numel()) * p.tensor.element_size());
    dtypes.push_back(p.tensor.scalar_type());
    devices.push_back(p.tensor.device());
  }
  lay_out_buckets(detail::compute_bucket_assignment(
      sizes, dtypes, devices, detail::BucketCaps{options.first_bucket_cap_bytes, options.bucket_cap_bytes}, order));
}

void Reducer::lay_out_buckets(const std::vector<std::vector<std::size_t>>& assignment) {
  buckets.clear();
  torch::NoGradGuard no_grad;
  std::vector<std::size_t> bucket_bytes;
  for (const auto& indices : assignment) {
    Bucket bucket;
    std::int64_t numel = 0;
    for (auto i : indices) numel += params[i].tensor.numel();
    const auto& first = params[indices.front()].tensor;
    bucket.flat = torch::zeros({numel}, first.options());
    bucket.averaged_on_copy = hook->reducer_averages(first.scalar_type());
    bucket.grad_bucket.index = buckets.size();
    bucket.grad_bucket.buffer = bucket.flat;
    std::int64_t offset = 0;
    for (auto i : indices) {
      Param& p = params[i];
      p.bucket = buckets.size();
      // A tensor sharing the bucket's storage but not an autograd view of it: optimizers call
      // detach_() on gradients, which autograd refuses for views.
      p.view = torch::empty({0}, first.options()).set_(bucket.flat.storage(), offset, p.tensor.sizes(),
                                                       c10::contiguous_strides(p.tensor.sizes()));
      bucket.grad_bucket.parameters.push_back(p.tensor);
      bucket.grad_bucket.gradients.push_back(p.view);
      bucket.grad_bucket.offsets.push_back(offset);
      offset += p.tensor.numel();
      if (options.gradient_as_bucket_view && p.tensor.grad().defined()) {
        p.view.copy_(p.tensor.grad());
        p.tensor.mutable_grad() = p.view;
      }
    }
    bucket.params = indices;
    bucket_bytes.push_back(static_cast<std::size_t>(numel) * first.element_size());
    buckets.push_back(std::move(bucket));
  }
  if (!buckets.empty()) buckets.back().grad_bucket.last = true;
  stats.set_bucket_bytes(std::move(bucket_bytes));
}

bool Reducer::rebuild_wanted() const {
  return options.rebuild_buckets && !options.find_unused_parameters && world > 1 && !buckets_rebuilt;
}

// Called at a synchronized forward (or its shadow in join) on every rank at the same point, once a
// synchronized backward has completed: broadcasts rank 0's ready order and rebuilds the buckets in
// it. Rank 0 sends the current layout's order when it has no complete recorded order.
void Reducer::rebuild_buckets() {
  const std::size_t n = params.size();
  std::vector<std::int64_t> order;
  std::vector<char> seen(n, 0);
  for (auto i : ready_order) {
    if (i < n && !std::exchange(seen[i], 1)) order.push_back(static_cast<std::int64_t>(i));
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
  build_buckets(agreed);
  buckets_rebuilt = true;
  ready_order.clear();
  ready_order.shrink_to_fit();
  reset_iteration();
  group->logger().debug(str("DistributedDataParallel: buckets rebuilt in gradient-ready order: ", buckets.size(),
                            " buckets (", ddp::join(stats.bucket_bytes(), ", "), " bytes)"));
}

// Note [Rebinding DDP to a new group]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// After a lost peer (See Note [Live recovery] in ddp/elastic/fault_tolerant.h) every member of the new group
// calls reset_group at the same point. The backward in flight is dropped (its works released, so
// that the old group's Gloo pairs can close). The bucket layout must be the same on every rank, and
// a joiner has the initial layout while the survivors may have rebuilt theirs: rank 0 (a survivor,
// Note [Membership seam] in ddp/elastic/membership.h) broadcasts its exact layout and rebuild state, and the
// others lay their buckets out so. Rank 0's buckets stay as they are, and with them the per-bucket
// state of its communication hook (PowerSGD's P and Q), which a joiner then receives.
void Reducer::reset_group(std::shared_ptr<ProcessGroup> new_group) {
  reset_iteration();
  group = std::move(new_group);
  group->set_collective_algorithm(options.algorithm);
  world = group->size();
  const std::size_t n = params.size();
  if (world > 1) {
    // [buckets_rebuilt, synced_backwards, parameter order (n), bucket of each position (n)]
    std::vector<std::int64_t> layout(2 + 2 * n, 0);
    layout[0] = buckets_rebuilt ? 1 : 0;
    layout[1] = synced_backwards;
    std::size_t position = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      for (auto i : buckets[b].params) {
        layout[2 + position] = static_cast<std::int64_t>(i);
        layout[2 + n + position] = static_cast<std::int64_t>(b);
        ++position;
      }
    }
    auto wire = torch::tensor(layout, torch::TensorOptions().dtype(torch::kLong)).to(group->device());
    group->broadcast(wire, 0, "bucket layout");
    wire = wire.cpu();
    const auto* agreed = wire.data_ptr<std::int64_t>();
    std::vector<std::vector<std::size_t>> assignment;
    for (std::size_t k = 0; k < n; ++k) {
      const auto bucket = static_cast<std::size_t>(agreed[2 + n + k]);
      if (assignment.size() <= bucket) assignment.resize(bucket + 1);
      assignment[bucket].push_back(static_cast<std::size_t>(agreed[2 + k]));
    }
    std::vector<std::vector<std::size_t>> current;
    for (const auto& b : buckets) current.push_back(b.params);
    if (assignment != current) lay_out_buckets(assignment);
    buckets_rebuilt = agreed[0] != 0;
    synced_backwards = agreed[1];
    ready_order.clear();
    if (options.broadcast_buffers && buffer_groups.empty()) buffer_groups = make_flat_groups(buffers);
  }
  reset_iteration();
  group->logger().debug(str("DistributedDataParallel: rebound to a group of ", world, " ranks (", buckets.size(),
                            " buckets)"));
}

// Note [Iteration protocol]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// before_forward: (join) agree on who still trains; broadcast buffers; arm if this backward syncs.
// after_forward: (find_unused_parameters) walk the graph from the outputs to find unused params.
// First gradient hook: queue the end-of-backward callback, mark unused params ready.
// Each hook: copy the gradient into its bucket; when a bucket is complete, launch it and every
// complete bucket after it, strictly in bucket order, so all ranks issue the same collectives.
// End of backward (engine callback): check that every bucket was launched (else name the
// parameters that got no gradient), wait, copy averaged gradients back into param.grad.

void Reducer::reset_iteration() {
  armed = false;
  started = false;
  std::fill(ready.begin(), ready.end(), 0);
  std::fill(used_locally.begin(), used_locally.end(), 0);
  unused.clear();
  next_launch = 0;
  for (auto& b : buckets) {
    b.pending = b.params.size();
    b.work = HookWork();
    b.launch_ns = 0;
  }
}


void Reducer::find_unused(const std::vector<torch::Tensor>& outputs) {
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
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The average is taken before the all-reduce, per gradient, exactly as PyTorch's reducer does it
// (bit for bit: x * (1 / n) and x / n differ in the last bit of about a third of the elements when
// n is not a power of two): a gradient copied into its bucket is multiplied by a wrapped scalar
// 1 / divisor on the way (one pass, no separate division of the bucket), a gradient already in
// its bucket (gradient_as_bucket_view after the first step) is divided in place. This is the
// built-in allreduce hook's choice (CommHookInterface::reducer_averages); every other hook gets
// the bucket as it is and divides itself (the fp16/bf16 hooks in their wire dtype), as PyTorch's
// reducer leaves the division to a registered hook.
void Reducer::mark_ready(std::size_t i, bool has_gradient) {
  // Under create_graph=True backward runs in grad mode and gradients require grad; the bucket is
  // plain data (the all-reduce is not differentiated, as in PyTorch), and out= ops refuse autograd.
  torch::NoGradGuard no_grad;
  Param& p = params[i];
  ready[i] = 1;
  if (synced_backwards == 0 && rebuild_wanted()) ready_order.push_back(i);
  used_locally[i] = has_gradient ? 1 : 0;
  torch::Tensor& grad = p.tensor.mutable_grad();
  grad_was_undefined[i] = grad.defined() ? 0 : 1;
  const bool divide_here = divisor != 1 && buckets[p.bucket].averaged_on_copy;
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

void Reducer::launch_complete_buckets() {
  while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(next_launch++);
}

void Reducer::launch(std::size_t index) {
  Bucket& b = buckets[index];
  b.launch_ns = now_ns();
  b.grad_bucket.divisor = divisor;
  b.work = hook->run(*group, b.grad_bucket);
  DDP_CHECK(b.work.valid(), "communication hook '", hook->name(), "' returned no work for bucket ", index);
}

// Note [CUDA streams in DDP]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// (Waited for in HookWork::wait, ddp/algorithms/comm.cpp.) The gradient hooks run on autograd's thread for the parameter's device, whose current stream
// is the one backward computed the gradient on; mark_ready copies into the bucket there.
// ProcessGroupNCCL's allreduce makes its own stream wait for the current stream before the
// all-reduce kernel runs, so NCCL reads the finished copy, and NCCL runs on its stream while
// backward goes on (the overlap). The end-of-backward callback runs on the stream of the thread
// that called backward (the engine synchronises the leaf streams with it first). There, for NCCL,
// Work::wait() without a timeout makes that current stream wait for the all-reduce's end event
// without blocking the host; the copies into param.grad and then optimizer.step() are queued on
// the same stream after it, so they see the averaged gradients, and the CPU can queue the step
// while the GPU still reduces. Timeouts of these collectives are the NCCL watchdog's (Note
// [NCCL error handling] in ddp/runtime/detail/cuda_support.cpp). Gloo with CUDA buckets: ProcessGroupGloo
// stages through host memory; its wait() blocks the host, bounded by the group's timeout, and
// then orders the current stream after the copy back.
std::string Reducer::names_of(const std::vector<std::size_t>& indices) const {
  std::vector<std::string> names;
  for (auto i : indices) names.push_back(params[i].name);
  return ddp::join(names, ", ");
}

void Reducer::on_gradient_ready(std::size_t index) {
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
  stats.last_ready_ns = now_ns();
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex);
  struct Reset {
    Reducer* impl;
    ~Reset() { impl->reset_iteration(); }
  } reset{this};
  const std::int64_t compute_end_ns = stats.last_ready_ns;
  const std::int64_t wait_start_ns = now_ns();
  if (next_launch < buckets.size()) {
    std::vector<std::size_t> missing;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!ready[i]) missing.push_back(i);
    }
    // Note [Failing without a hang]
    // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    // Other ranks may have used these parameters and launched every bucket. Launch the rest
    // here too (zeros for the missing gradients) and wait, so that their collectives complete;
    // then fail. Their next collective fails fast once this rank has exited.
    for (auto i : missing) mark_ready(i, false);
    for (auto& b : buckets) {
      try {
        if (b.work.valid()) b.work.wait();
      } catch (const std::exception&) {
      }
    }
    throw Error(str(
        "DistributedDataParallel: backward finished on rank ", group->rank(), " but ", missing.size(),
        " parameter(s) got no gradient: ", names_of(missing),
        ". Set DdpOptions::find_unused_parameters = true if the model does not use every "
        "parameter in every iteration, or make every output take part in the loss"));
  }
  std::vector<IterationStats::BucketTimes> times;
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    Bucket& b = buckets[k];
    const torch::Tensor result = b.work.wait();
    times.push_back({b.launch_ns, b.work.done_ns()});
    if (!result.defined() || result.numel() != b.flat.numel()) {
      throw Error(str("DistributedDataParallel: communication hook '", hook->name(), "' returned ",
                      result.defined() ? str(result.numel(), " elements") : std::string("no tensor"),
                      " for bucket ", k, " of ", b.flat.numel(), "; a hook's work must give the bucket's averaged gradient"));
    }
    if (result.data_ptr() != b.flat.data_ptr() || result.scalar_type() != b.flat.scalar_type()) {
      b.flat.copy_(result.reshape({-1}));
    }
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
  const auto communication = stats.add_iteration(times, compute_end_ns, wait_start_ns);
  for (auto& observer : observers) {
    observer->on_synchronized_backward(communication.total_ns, communication.exposed_wait_ns);
  }
  ++synced_backwards;
}

// Join: a rank out of data runs the hook on zero buckets, so that it issues the collectives the
// others issue (PyTorch's join hook does the same with the registered comm hook).
void Reducer::shadow_iteration(bool others_sync) {
  if (!others_sync) return;
  if (synced_backwards > 0 && rebuild_wanted()) rebuild_buckets();
  if (options.broadcast_buffers && !buffer_groups.empty()) broadcast_flat_groups(*group, 0, buffer_groups, "buffer broadcast");
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    buckets[i].flat.zero_();
    launch(i);
  }
  for (auto& b : buckets) b.work.wait();
  reset_iteration();
  if (options.find_unused_parameters) {
    used_counts.zero_();
    group->allreduce(used_counts, c10d::ReduceOp::SUM, "unused-parameter all-reduce");
  }
  ++synced_backwards;
}

}  // namespace ddp::detail
