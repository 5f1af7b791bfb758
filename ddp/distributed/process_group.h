#pragma once
// Process groups over LibTorch's c10d: init_process_group, the rank/world queries, barrier,
// blocking collectives with timeouts, main_process_first and destroy.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/distributed/collective_record.h"
#include "ddp/distributed/topology.h"
#include "ddp/runtime/log.h"

namespace ddp {

class HierarchicalCollectives;  // ddp/distributed/hierarchical_collectives.h
namespace detail {
enum class WaitMode;  // ddp/distributed/detail/collective_log.h
}  // namespace detail

// The default all-reduce slice: 1 MiB (measured, see Note [Sliced all-reduce] in
// ddp/distributed/detail/sliced_allreduce.cpp), for groups whose ranks are on several hosts
// (kAllreduceSliceAuto); 0 turns slicing off.
inline constexpr std::int64_t kDefaultAllreduceSliceBytes = std::int64_t{1} << 20;
inline constexpr std::int64_t kAllreduceSliceAuto = -1;

// How to create the default process group (c10d's init_process_group arguments). A plain struct:
//   ddp::InitOptions options;
//   options.backend = "gloo";
//   options.timeout = std::chrono::seconds(60);
struct InitOptions {
  // "auto" (NCCL when LibTorch has it and CUDA is available, else Gloo), "gloo" or "nccl".
  std::string backend = "auto";
  // "env://" (RANK, WORLD_SIZE, MASTER_ADDR, ... from the launcher), "tcp://host:port" or
  // "file:///absolute/path" (the last two need rank and world_size).
  std::string init_method = "env://";
  // -1: from the environment. Explicit values win over the environment.
  int rank = -1;
  int world_size = -1;
  // Bound of every blocking wait: rendezvous, collectives, barriers. PyTorch's default.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  // Bound of joining (reaching the master, waiting for every rank); unset: DDP_JOIN_TIMEOUT
  // (seconds, which ddp_launch sets from --rdzv_conf join_timeout), else 600 s. While waiting, a
  // rank prints a line every wait_notice_interval. See Note [Waiting is never silent].
  std::optional<std::chrono::milliseconds> join_timeout;
  std::chrono::milliseconds wait_notice_interval = std::chrono::seconds(10);
  // All-reduces of CPU tensors over Gloo larger than this many bytes run as slices of about this
  // size, several in flight (Note [Sliced all-reduce] in ddp/distributed/detail/sliced_allreduce.cpp); 0: never sliced;
  // kAllreduceSliceAuto: 1 MiB when the group has ranks on other hosts, else unsliced. Unset:
  // DDP_ALLREDUCE_SLICE_BYTES (bytes or "auto"), else auto. Every rank must agree.
  std::optional<std::int64_t> allreduce_slice_bytes;
};

// A group of processes that run collectives together (one c10d backend plus its store).
class ProcessGroup {
 public:
  struct Info {
    int rank = 0;
    int size = 1;
    int local_rank = 0;
    int local_size = 1;
    std::string backend_name;
    torch::Device device = torch::kCPU;
    std::chrono::milliseconds timeout = std::chrono::minutes(30);
    // Where a rank writes its last collectives on a timeout or communication error ("": nowhere);
    // see diagnostics_dir() in ddp/environment.h.
    std::string log_dir;
    std::size_t collective_log_size = 64;  // See Note [Collective ring buffer]
    // The name of this host, shared by the ranks on it ("": this_host_identity(), asked only when
    // local_size is not the world size). See Note [Host topology].
    std::string host_identity;
    // A sub-group of another group (see Note [Hierarchical collectives]): its name for errors
    // ("host 1 (ranks 2, 3)") and the global rank of each of its ranks ("" and empty: the world).
    std::string group_name;
    std::vector<int> global_ranks;
    // See InitOptions::allreduce_slice_bytes (0: off, kAllreduceSliceAuto: by spans_hosts). Sub-groups inherit it.
    std::int64_t allreduce_slice_bytes = kAllreduceSliceAuto;
    // Whether some ranks of the group are on other hosts than this rank (the auto slice size's choice).
    bool spans_hosts = false;
  };
  ProcessGroup(Info info, c10::intrusive_ptr<c10d::Store> store,
               c10::intrusive_ptr<c10d::Backend> backend);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  int local_rank() const;
  int local_size() const;
  bool is_main_process() const { return rank() == 0; }
  const std::string& backend_name() const;
  // The device this rank computes on: CPU with Gloo, cuda:<local_rank> with NCCL.
  torch::Device device() const;
  std::chrono::milliseconds timeout() const;
  const Logger& logger() const;

  // Blocks until every rank has arrived; throws ddp::TimeoutError after `timeout` (default: the
  // group's timeout).
  void barrier(std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  // Blocking collectives, in place, bounded by the group's timeout. Errors become
  // ddp::TimeoutError / ddp::PeerLostError (a peer closed or reset its connection, or abort()) /
  // ddp::CommunicationError naming the operation and its sequence number; a
  // timeout also names the ranks that did not arrive (see Note [Naming the ranks that did not arrive]).
  // `what` (a string literal) says what the collective is for, in errors and recent_collectives().
  void allreduce(torch::Tensor& tensor, c10d::ReduceOp op = c10d::ReduceOp::SUM, const char* what = "allreduce");
  void broadcast(torch::Tensor& tensor, int src = 0, const char* what = "broadcast");
  // Returns one tensor per rank (same shape as `tensor` on every rank).
  std::vector<torch::Tensor> allgather(const torch::Tensor& tensor, const char* what = "allgather");
  // c10d's reduce_scatter_tensor and all_gather_into_tensor: `input`/`output` hold size() equal
  // contiguous blocks, one per rank; flat algorithm always.
  void reduce_scatter_tensor(torch::Tensor& output, const torch::Tensor& input, c10d::ReduceOp op,
                             const char* what = "reduce-scatter");
  void allgather_into_tensor(torch::Tensor& output, const torch::Tensor& input, const char* what = "allgather");
  // Asynchronous forms of the above (finish them with wait()); the flat algorithm always.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_async(torch::Tensor& output, const torch::Tensor& input,
                                                             c10d::ReduceOp op, const char* what = "reduce-scatter");
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_async(torch::Tensor& output, const torch::Tensor& input,
                                                             const char* what = "allgather");
  c10::intrusive_ptr<c10d::Work> allreduce_async(torch::Tensor& tensor, c10d::ReduceOp op, const char* what);

  // The algorithm of all-reduce, broadcast and all-gather over CPU tensors (default kAuto): see
  // Note [Hierarchical collectives] in ddp/distributed/hierarchical_collectives.h. Every rank must set the same.
  void set_collective_algorithm(CollectiveAlgorithm algorithm);
  CollectiveAlgorithm collective_algorithm() const;
  // See InitOptions::allreduce_slice_bytes; every rank must set the same (0: off, kAllreduceSliceAuto).
  void set_allreduce_slice_bytes(std::int64_t bytes);
  // The slice size in use (0: unsliced), auto resolved.
  std::int64_t allreduce_slice_bytes() const;
  // The hierarchical collectives of this group, set up on first use (a collective: every rank
  // calls it, as the first collective over CPU tensors does), or null where the topology makes the
  // flat algorithm the choice or the algorithm is kFlat. The choice is logged once.
  HierarchicalCollectives* hierarchy();
  // Why the group uses the algorithm it uses ("" until hierarchy() ran).
  std::string algorithm_choice() const;
  // A new Gloo group of the same ranks over this group's store under `store_prefix`, flat algorithm,
  // on this group's transport devices; `name` names it in errors. A collective: every rank calls it
  // with the same prefix, one no group has used. For collectives issued from a thread of their own
  // that must not interleave with this group's (Note [PowerSGD stages] in ddp/algorithms/detail/powersgd_stages.cpp).
  std::shared_ptr<ProcessGroup> new_group_of_same_ranks(const std::string& name, const std::string& store_prefix);

  // Rank src's bytes reach every rank (two broadcasts: the length, then the bytes; each with the
  // group's timeout and diagnostics). For state of any size, e.g. ZeroRedundancyOptimizer's
  // consolidate_state_dict. Bytes travel on the group's device.
  void broadcast_bytes(std::string& bytes, int src, const char* what = "broadcast bytes");

  // Point-to-point transfers between some ranks of the group (not a collective: a rank with none
  // does not call it). Each goes over Gloo's pair between the two ranks (a connection of its own, on
  // the address each rank advertised); all start at once, and they are waited for in order, each
  // within the group's timeout from the one before it (a transfer slower than the timeout in all
  // fails; one that keeps moving does not); a peer gone fails it at once, abort() is seen between
  // two transfers. CPU tensors, contiguous; a (peer, tag) once per call in each direction. See Note
  // [Healing at link speed] in ddp/elastic/fault_tolerant.cpp.
  struct Transfer {
    int peer = 0;
    int tag = 0;
    torch::Tensor tensor;
  };
  void exchange(std::vector<Transfer>& sends, std::vector<Transfer>& receives, const char* what);

  // Asynchronous all-reduce (sum) of one tensor; finish it with wait(). `bucket`: the DDP bucket
  // index, for diagnostics (-1: none).
  c10::intrusive_ptr<c10d::Work> allreduce_async(torch::Tensor& tensor, const char* what = "allreduce",
                                                 int bucket = -1);
  // Waits for `work` at most the group's timeout; `what` names the operation in errors.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const;

  // This rank's last collectives (at most Info::collective_log_size), oldest first; every
  // collective of the group has a sequence number, the same on every rank. See
  // Note [Collective ring buffer].
  std::vector<CollectiveRecord> recent_collectives() const;
  // The sequence number of the last collective started (0: none yet).
  std::int64_t last_collective_seq() const;
  const std::string& log_dir() const;

  // The underlying c10d objects, for anything these helpers do not cover.
  const c10::intrusive_ptr<c10d::Backend>& backend() const;
  const c10::intrusive_ptr<c10d::Store>& store() const;

  // Releases the backend and the store (idempotent). Using the group afterwards throws.
  void destroy();
  // destroy(), except that what the group held is handed to the caller instead of released here:
  // releasing a Gloo backend joins its threads, and one blocked in a collective whose peer is silent
  // returns only at the group's timeout. The caller drops the result where waiting is harmless
  // (FaultTolerant: on a thread of its own; See Note [Releasing an aborted group] in
  // ddp/elastic/fault_tolerant.cpp). Null when already destroyed.
  std::shared_ptr<void> take_resources();
  // Makes every wait of this group, now and later, fail at once with ddp::PeerLostError (thread-
  // safe: another thread may call it while a rank is blocked in a collective, which then returns
  // within kAbortPollInterval). The owner then calls destroy(): Gloo closes its pairs once the
  // backend and the works holding them are released, and the peers' collectives fail with
  // PeerLostError instead of waiting for their timeout. See Note [Live recovery] in ddp/elastic/fault_tolerant.h.
  // An NCCL group's communicators are aborted too (See Note [Aborting a group] in process_group.cpp).
  // `reason` (the first abort's) ends the message of the waits it fails.
  void abort(const std::string& reason = "");
  bool aborted() const;
  // How often a blocked wait looks at abort().
  static constexpr std::chrono::milliseconds kAbortPollInterval{100};
  bool destroyed() const;

  // Implementation of main_process_first (non-template): rank 0 runs f and publishes whether it
  // succeeded; the others wait for that (bounded by the timeout), then run f. If rank 0's f
  // throws, the others throw ddp::CommunicationError with its message instead of waiting forever.
  void run_main_process_first(const std::function<void()>& f);

 private:
  std::int64_t begin_collective(const char* op, const char* what, int bucket, const torch::Tensor* tensor,
                                const char* algorithm = "flat") const;
  template <class Start>
  c10::intrusive_ptr<c10d::Work> start_collective(std::int64_t seq, const char* what, Start&& start) const;
  // mode: kBlocking by default (the enum's first value; only declared here).
  void wait_collective(std::int64_t seq, const c10::intrusive_ptr<c10d::Work>& work, const char* what,
                       std::chrono::milliseconds timeout, detail::WaitMode mode = {}) const;
  // Records the failure, names the missing ranks (timeouts), writes the ring buffer file, throws.
  [[noreturn]] void fail_collective(std::int64_t seq, const char* what, std::chrono::milliseconds timeout,
                                    const std::exception* error) const;
  // Writes the ring buffer file (Info::log_dir) with `reason`; the path, if written.
  std::optional<std::string> write_collectives_dump(const std::string& reason) const;
  int global_rank(int rank) const;
  // The flat all-reduce of one tensor: c10d's, or its slices (Note [Sliced all-reduce]).
  c10::intrusive_ptr<c10d::Work> start_flat_allreduce(torch::Tensor& tensor, const c10d::AllreduceOptions& options);
  // The hierarchical collectives for this tensor (and op), or null: the flat algorithm.
  HierarchicalCollectives* hierarchical_for(const torch::Tensor& tensor,
                                            std::optional<c10d::ReduceOp> op = std::nullopt);
  Topology resolve_topology();
  // spans_hosts: whether the sub-group's ranks are on several hosts (Info::spans_hosts).
  std::shared_ptr<ProcessGroup> make_sub_group(const std::string& name, const std::vector<int>& ranks,
                                               const std::string& store_prefix, bool spans_hosts);

  // What the group holds, in ddp/distributed/detail/process_group_state.h: see Note [A group behind a
  // pointer] there.
  struct State;
  std::unique_ptr<State> state_;
};

// Creates the default process group. Throws ddp::InvalidArgument (bad option or environment),
// ddp::CommunicationError (master unreachable), ddp::TimeoutError (a rank never arrived) or
// ddp::MismatchError (ranks disagree about the world size).
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});

// Note [Groups over an existing store]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// init_process_group does the whole rendezvous (environment, TCP or file store, world size check,
// threads per rank). A caller that already holds a c10d store builds a group on it instead: the
// in-process tests run one thread per rank over one c10d::HashStore (as c10d's and Gloo's own tests
// do), so DistributedDataParallel's logic is tested without starting processes.
struct StoreGroupOptions {
  // Only "gloo": an NCCL group needs a device bound per rank, which init_process_group does.
  std::string backend = "gloo";
  // The address Gloo's transport binds to and announces to the other ranks.
  std::string host = "127.0.0.1";
  // Bound of every blocking wait: the backend's rendezvous through the store, collectives, barriers.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  // Where the rank writes its last collectives on a failure ("": nowhere); ProcessGroup::Info::log_dir.
  std::string log_dir;
  // The name of this rank's host ("": this machine): the in-process tests fake several hosts with
  // it (see Note [Host topology]).
  std::string host_identity;
  // See InitOptions::allreduce_slice_bytes: auto slices when spans_hosts (a group over a store cannot
  // tell by itself whether its ranks are on several hosts; LiveJob::spans_hosts can).
  std::int64_t allreduce_slice_bytes = kAllreduceSliceAuto;
  bool spans_hosts = false;
};
// Creates rank `rank` of a group of `world_size` over `store` (every rank passes the same store or a
// client of it). Throws ddp::InvalidArgument (bad rank, size or backend), ddp::TimeoutError or
// ddp::CommunicationError (the other ranks did not join within the timeout).
std::shared_ptr<ProcessGroup> new_process_group(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                                                const StoreGroupOptions& options = {});

// True when this build of LibTorch has c10d's NCCL backend and a CUDA device is present.
bool nccl_available();

// Rank 0 runs f first (e.g. downloads or prepares data), then the other ranks run it.
template <class F>
void main_process_first(ProcessGroup& group, F&& f) {
  group.run_main_process_first(std::function<void()>(std::forward<F>(f)));
}

}  // namespace ddp
