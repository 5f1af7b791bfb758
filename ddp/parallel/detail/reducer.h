#pragma once
// The state and the gradient logic of DistributedDataParallel (internal, not installed): buckets,
// the per-iteration protocol (see Note [Iteration protocol]), the communication hook's launches
// and the end of backward. The rest of DistributedDataParallel has a home each: construction,
// forward and join in distributed_data_parallel.cpp; the model check and broadcasts in
// model_sync.*; statistics in iteration_stats.*; the launcher's heartbeat in heartbeat_observer.*
// (an IterationObserver); the hooks behind ddp/algorithms/comm.h.
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/algorithms/comm.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/parallel/detail/iteration_observer.h"
#include "ddp/parallel/detail/iteration_stats.h"
#include "ddp/parallel/detail/model_sync.h"

namespace ddp::detail {

struct Reducer {
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
    std::vector<std::size_t> params;
    GradBucket grad_bucket;        // what the hook sees: flat, parameters, their views and offsets
    bool averaged_on_copy = true;  // CommHookInterface::reducer_averages for this bucket's dtype
    std::size_t pending = 0;
    HookWork work;
    std::int64_t launch_ns = 0;
  };

  std::shared_ptr<ProcessGroup> group;
  DdpOptions options;
  std::shared_ptr<CommHookInterface> hook;  // the built-in of options.comm_hook, or the user's
  bool user_hook = false;
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
  torch::Tensor reciprocal;  // wrapped scalar 1 / reciprocal_of (see Note [Dividing on the copy])
  double reciprocal_of = 0;
  torch::Tensor used_counts;  // find_unused_parameters: how many ranks used each parameter

  // Bucket rebuild; see Note [Bucket rebuild] in ddp/parallel/detail/bucket.h.
  std::vector<std::size_t> ready_order;  // parameters in the order the first synced backward readied them
  std::int64_t synced_backwards = 0;     // completed synchronized backwards (join's shadow ones included)
  bool buckets_rebuilt = false;

  // Join state.
  bool joining = false;
  bool divide_by_initial_world_size = true;
  std::int64_t join_iterations = 0;

  IterationStats stats;
  std::vector<std::unique_ptr<IterationObserver>> observers;

  void build_buckets(const std::vector<std::size_t>& order = {});
  // Lays the buckets out exactly as `assignment` says (each bucket's parameter indices).
  void lay_out_buckets(const std::vector<std::vector<std::size_t>>& assignment);
  // See Note [Rebinding DDP to a new group] in reducer.cpp.
  void reset_group(std::shared_ptr<ProcessGroup> new_group);
  bool rebuild_wanted() const;
  void rebuild_buckets();
  void reset_iteration();
  void find_unused(const std::vector<torch::Tensor>& outputs);
  void mark_ready(std::size_t i, bool has_gradient);
  void launch_complete_buckets();
  void launch(std::size_t index);
  std::string names_of(const std::vector<std::size_t>& indices) const;
  void on_gradient_ready(std::size_t index);
  void finalize_backward();
  // Join: the collectives a rank that has run out of data issues for one iteration of the others.
  void shadow_iteration(bool others_sync);
};

}  // namespace ddp::detail
