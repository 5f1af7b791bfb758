#pragma once
// The state and the gradient logic of DistributedDataParallel (internal, not installed): buckets,
// the per-iteration protocol (see Note [Iteration protocol]), the all-reduces and their timing.
// reducer.cpp holds the gradient path (buckets, ready marks, launches, the end of backward);
// distributed_data_parallel.cpp the rest (construction, model check, broadcasts, join, heartbeats).
#include <torch/torch.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/agent_channel.h"
#include "ddp/base/environment.h"
#include "ddp/distributed_data_parallel.h"

namespace ddp::detail {

// Tensors of one dtype and device packed into one flat tensor, for broadcasts.
struct FlatGroup {
  torch::Tensor flat;
  std::vector<torch::Tensor> tensors;
  std::vector<torch::Tensor> views;
};
std::vector<FlatGroup> make_flat_groups(const std::vector<torch::Tensor>& tensors);

std::int64_t now_ns();

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
    torch::Tensor wire;  // compressed copy sent by fp16/bf16 hooks; undefined for allreduce
    std::vector<std::size_t> params;
    std::size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;
    std::int64_t launch_ns = 0;
    std::shared_ptr<std::atomic<std::int64_t>> done_ns = std::make_shared<std::atomic<std::int64_t>>(0);
  };

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
  torch::Tensor reciprocal;  // wrapped scalar 1 / reciprocal_of (see Note [Dividing on the copy])
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

  // Heartbeats to ddp_launch (see Note [Agent channel] in ddp/base/agent_message.h): one send per iteration.
  AgentChannel agent = AgentChannel::from_environment(process_environment());
  std::int64_t last_heartbeat_ns = 0;
  std::int64_t last_comm_ns = 0;
  std::int64_t heartbeat_step = 0;

  // --- construction and state (distributed_data_parallel.cpp) ------------------------------------
  void verify_same_model(const DdpCore::NamedTensors& named_params, const DdpCore::NamedTensors& named_buffers);
  void broadcast_from(int src, const std::vector<torch::Tensor>& tensors);
  void broadcast_buffers();
  void send_heartbeat(std::int64_t now);
  // Join: the collectives a rank that has run out of data issues for one iteration of the others.
  void shadow_iteration(bool others_sync);

  // --- buckets and the gradient path (reducer.cpp) ------------------------------------------------
  void build_buckets(const std::vector<std::size_t>& order = {});
  bool rebuild_wanted() const;
  void rebuild_buckets();
  void reset_iteration();
  void find_unused(const std::vector<torch::Tensor>& outputs);
  void mark_ready(std::size_t i, bool has_gradient);
  void launch_complete_buckets();
  void launch(std::size_t index);
  void wait_bucket(Bucket& b);
  std::string names_of(const std::vector<std::size_t>& indices) const;
  void on_gradient_ready(std::size_t index);
  void finalize_backward();
  void record_timing(std::int64_t compute_end_ns, std::int64_t wait_start_ns);
};

}  // namespace ddp::detail
