#pragma once
// The hierarchical all-reduce, broadcast and all-gather over CPU tensors for ranks that share
// hosts (see Note [Hierarchical collectives]); ddp::ProcessGroup routes its collectives here when
// the topology calls for it (ProcessGroup::hierarchy()).
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/types.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/distributed/topology.h"

namespace ddp {

class ProcessGroup;

// Note [Hierarchical collectives]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A flat ring all-reduce over n ranks sends 2(n-1)/n of the buffer over every edge of the ring, and
// with the ranks of a host next to each other the ring crosses each host link once per direction:
// 1.5x the buffer with 2 hosts x 2 ranks, 1.875x with 2 x 8, where reducing inside the host first
// needs 2(H-1)/H (1x with 2 hosts). So, with L ranks on each of H hosts (the same L everywhere):
//   1. reduce-scatter inside the host: local rank l ends with shard l (1/L of the buffer, padded
//      to a multiple of L) reduced over its host;
//   2. all-reduce of shard l across hosts among the ranks with local rank l: every local rank
//      uses its own connections and the host link carries each byte of the buffer once;
//   3. all-gather of the shards inside the host.
// Broadcast: the ranks with the root's local rank broadcast across hosts, then each host's copy is
// broadcast inside the host (H-1 copies cross hosts instead of up to n-L). All-gather: the ranks with
// local rank l gather across hosts, then each host gathers those blocks inside (n-L copies leave a
// host instead of n-1). Results equal the flat algorithm's up to the order of the float additions.
// The sub-groups are ddp::ProcessGroups of their own (Gloo over the parent's devices, see Note
// [Sub-groups share the devices]), so their collectives have timeouts, sequence numbers and the
// diagnosis that names the ranks that did not arrive, in global ranks and with the sub-group's name.
// The stages run on one worker thread per group in submission order: every rank issues the
// sub-groups' collectives in the same order even while gradient buckets are in flight, and the
// caller's thread is free as with Gloo's own asynchronous work (the overlap of DDP's backward).
// Tensors below kAutoMinBytes stay flat under `auto`: three latency-bound steps cost more than the
// bytes they save.
class HierarchicalCollectives {
 public:
  static constexpr std::int64_t kAutoMinBytes = std::int64_t{64} << 10;
  // Note [Pipelined stages]
  // ~~~~~~~~~~~~~~~~~~~~~~~
  // The all-reduce goes in chunks of about this many bytes: while chunk c crosses the hosts, chunk
  // c+1 is reduce-scattered and chunk c-1 gathered inside the host, so the host-local copies (CPU
  // work that competes with the ranks' compute) hide behind the transfer instead of adding to it.
  // Every rank issues each sub-group's collectives in the same order, which is all Gloo needs.
  static constexpr std::int64_t kPipelineChunkBytes = std::int64_t{4} << 20;

  // intra: this host's ranks (sub-rank = local rank); inter: the ranks with this rank's local rank
  // (sub-rank = host index). `timeout` bounds each stage.
  HierarchicalCollectives(Topology topology, int rank, std::shared_ptr<ProcessGroup> intra,
                          std::shared_ptr<ProcessGroup> inter, std::chrono::milliseconds timeout);
  ~HierarchicalCollectives();
  HierarchicalCollectives(const HierarchicalCollectives&) = delete;
  HierarchicalCollectives& operator=(const HierarchicalCollectives&) = delete;

  const Topology& topology() const { return topology_; }

  // Each queues its stages on the worker and returns a work whose wait() rethrows a stage's
  // ddp::Error prefixed with `context` (e.g. "gradient all-reduce #12 (25.0 MiB)").
  c10::intrusive_ptr<c10d::Work> allreduce(torch::Tensor tensor, c10d::ReduceOp op, std::string context);
  c10::intrusive_ptr<c10d::Work> broadcast(torch::Tensor tensor, int src, std::string context);
  // Fills outputs[r] (preallocated, one per global rank) with rank r's tensor.
  c10::intrusive_ptr<c10d::Work> allgather(torch::Tensor tensor, std::vector<torch::Tensor> outputs,
                                           std::string context);

 private:
  c10::intrusive_ptr<c10d::Work> submit(std::function<void()> stages, std::string context);
  void run_worker();
  void allreduce_stages(torch::Tensor& tensor, c10d::ReduceOp op);
  void broadcast_stages(torch::Tensor& tensor, int src);
  void allgather_stages(const torch::Tensor& tensor, std::vector<torch::Tensor>& outputs);

  Topology topology_;
  int rank_;
  int local_rank_;
  std::shared_ptr<ProcessGroup> intra_;
  std::shared_ptr<ProcessGroup> inter_;
  std::chrono::milliseconds timeout_;

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace ddp
