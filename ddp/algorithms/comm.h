#pragma once
// The communication-hook interface of DistributedDataParallel (c10d's CommHookInterface, GradBucket
// and the future a hook returns): what is sent for a gradient bucket, and how the bucket's average
// is formed from what comes back. Users implement CommHookInterface and register it with
// DistributedDataParallel::register_comm_hook; the built-ins are in ddp/algorithms/default_comm_hooks.h, PowerSGD in
// ddp/algorithms/powersgd.h, post-local SGD in ddp/algorithms/model_averaging.h.
#include <torch/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/checkpoint/checkpoint.h"
#include "ddp/distributed/process_group.h"

namespace ddp {

// One bucket of gradients handed to a hook (PyTorch's GradBucket). `buffer` is the flat tensor of
// the bucket; `gradients[i]` is parameter i's slice of it, shaped like `parameters[i]`, starting at
// element `offsets[i]`. The buffer holds this rank's gradients, not divided by anything unless the
// hook asked the reducer to (CommHookInterface::reducer_averages).
struct GradBucket {
  std::size_t index = 0;
  torch::Tensor buffer;
  std::vector<torch::Tensor> parameters;
  std::vector<torch::Tensor> gradients;
  std::vector<std::int64_t> offsets;
  // The last bucket launched in this backward (PowerSGD counts iterations on it).
  bool last = false;
  // What the average divides by: the world size, or under join() with
  // divide_by_initial_world_size = false the number of ranks still training.
  double divisor = 1;
};

// Note [Hook work]
// ~~~~~~~~~~~~~~~~
// A hook returns a HookWork instead of a c10::ivalue::Future: the collectives it started (waited
// for with the process group's timeout, so no wait is unbounded and a failure names the
// collective) and a continuation that runs once they are done and returns the bucket's averaged
// gradient (a flat tensor of the bucket's length and dtype, or one it can be copied from). The
// continuation may start and wait for further collectives (PowerSGD's second and third
// all-reduce). The reducer calls wait() at the end of backward in bucket order, so every rank
// issues those later collectives in the same order; the first stage overlaps with backward as
// the built-in all-reduce does. PyTorch chains such stages with Future::then on the
// communication thread; here the order of collectives stays the reducer's. A hook whose later
// stages should start as soon as the first ends runs them on a thread and a group of its own and
// returns, among its works, one that completes when they end (PowerSGD: see Note [PowerSGD
// stages] in ddp/algorithms/detail/powersgd_stages.cpp).
class HookWork {
 public:
  using Continuation = std::function<torch::Tensor()>;
  HookWork() = default;
  // Waits for `works` (each bounded by group's timeout, `what` names them in errors), then runs `then`.
  HookWork(ProcessGroup& group, std::vector<c10::intrusive_ptr<c10d::Work>> works, const char* what,
           Continuation then);
  // Work already done: its result is `result`.
  static HookWork completed(torch::Tensor result);

  // Returns the averaged bucket; at most once.
  torch::Tensor wait();
  bool valid() const { return static_cast<bool>(then_); }
  // Steady-clock nanoseconds when the last communication of this work ended (0 before wait()).
  std::int64_t done_ns() const { return done_ns_; }

 private:
  ProcessGroup* group_ = nullptr;
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  const char* what_ = "";
  Continuation then_;
  std::int64_t done_ns_ = 0;
  std::shared_ptr<std::atomic<std::int64_t>> done_by_callback_ = std::make_shared<std::atomic<std::int64_t>>(0);
};

// What users implement (c10d's CommHookInterface). run() is called once per bucket and
// synchronized backward, in bucket order on every rank, from autograd's thread; it starts the
// bucket's communication and returns. The hook owns the division by GradBucket::divisor.
class CommHookInterface {
 public:
  virtual ~CommHookInterface() = default;
  virtual std::string name() const = 0;
  virtual HookWork run(ProcessGroup& group, GradBucket& bucket) = 0;

  // See Note [Dividing on the copy] in ddp/parallel/detail/reducer.cpp: true asks the reducer to divide each
  // gradient by the divisor as it copies it into a bucket of `bucket_dtype` (PyTorch's reducer
  // without a hook, bit for bit); the hook then sums. Only the built-in all-reduce asks for it.
  virtual bool reducer_averages(c10::ScalarType /*bucket_dtype*/) const { return false; }

  // The hook's state for checkpoints (per rank: PowerSGD's error buffers differ between ranks),
  // tensors by name; load_state restores what state() gave. Stateless hooks keep the defaults.
  virtual StateDict state() const { return StateDict(); }
  virtual void load_state(const StateDict& /*state*/) {}
};

// The plain average: divides the buffer by the divisor and all-reduces it (PyTorch's allreduce_hook).
HookWork allreduce_average(ProcessGroup& group, torch::Tensor& buffer, double divisor,
                           const char* what = "gradient all-reduce", int bucket = -1);

}  // namespace ddp
