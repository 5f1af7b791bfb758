#pragma once
// Process groups over LibTorch's c10d: init_process_group, the rank/world queries, barrier,
// blocking collectives with timeouts, main_process_first and destroy.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/collective_log.h"
#include "ddp/log.h"

namespace ddp {

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
  };
  ProcessGroup(Info info, c10::intrusive_ptr<c10d::Store> store,
               c10::intrusive_ptr<c10d::Backend> backend);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return info_.rank; }
  int size() const { return info_.size; }
  int local_rank() const { return info_.local_rank; }
  int local_size() const { return info_.local_size; }
  bool is_main_process() const { return info_.rank == 0; }
  const std::string& backend_name() const { return info_.backend_name; }
  // The device this rank computes on: CPU with Gloo, cuda:<local_rank> with NCCL.
  torch::Device device() const { return info_.device; }
  std::chrono::milliseconds timeout() const { return info_.timeout; }
  const Logger& logger() const { return logger_; }

  // Blocks until every rank has arrived; throws ddp::TimeoutError after `timeout` (default: the
  // group's timeout).
  void barrier(std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  // Blocking collectives, in place, bounded by the group's timeout. Errors become
  // ddp::TimeoutError / ddp::CommunicationError naming the operation and its sequence number; a
  // timeout also names the ranks that did not arrive (see Note [Naming the ranks that did not arrive]).
  // `what` (a string literal) says what the collective is for, in errors and recent_collectives().
  void allreduce(torch::Tensor& tensor, c10d::ReduceOp op = c10d::ReduceOp::SUM, const char* what = "allreduce");
  void broadcast(torch::Tensor& tensor, int src = 0, const char* what = "broadcast");
  // Returns one tensor per rank (same shape as `tensor` on every rank).
  std::vector<torch::Tensor> allgather(const torch::Tensor& tensor, const char* what = "allgather");
  // Rank src's bytes reach every rank (two broadcasts: the length, then the bytes; each with the
  // group's timeout and diagnostics). For state of any size, e.g. ZeroRedundancyOptimizer's
  // consolidate_state_dict. Bytes travel on the group's device.
  void broadcast_bytes(std::string& bytes, int src, const char* what = "broadcast bytes");

  // Asynchronous all-reduce (sum) of one tensor; finish it with wait(). `bucket`: the DDP bucket
  // index, for diagnostics (-1: none).
  c10::intrusive_ptr<c10d::Work> allreduce_async(torch::Tensor& tensor, const char* what = "allreduce",
                                                 int bucket = -1);
  // Waits for `work` at most the group's timeout; `what` names the operation in errors.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const;

  // This rank's last collectives (at most Info::collective_log_size), oldest first; every
  // collective of the group has a sequence number, the same on every rank. See
  // Note [Collective ring buffer].
  std::vector<CollectiveRecord> recent_collectives() const { return collectives_.snapshot(); }
  // The sequence number of the last collective started (0: none yet).
  std::int64_t last_collective_seq() const { return collectives_.last_seq(); }
  const std::string& log_dir() const { return info_.log_dir; }

  // The underlying c10d objects, for anything these helpers do not cover.
  const c10::intrusive_ptr<c10d::Backend>& backend() const;
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  // Releases the backend and the store (idempotent). Using the group afterwards throws.
  void destroy();
  bool destroyed() const { return !backend_; }

  // Implementation of main_process_first (non-template): rank 0 runs f and publishes whether it
  // succeeded; the others wait for that (bounded by the timeout), then run f. If rank 0's f
  // throws, the others throw ddp::CommunicationError with its message instead of waiting forever.
  void run_main_process_first(const std::function<void()>& f);

 private:
  std::int64_t begin_collective(const char* op, const char* what, int bucket, const torch::Tensor* tensor) const;
  template <class Start>
  c10::intrusive_ptr<c10d::Work> start_collective(std::int64_t seq, const char* what, Start&& start) const;
  void wait_collective(std::int64_t seq, const c10::intrusive_ptr<c10d::Work>& work, const char* what,
                       std::chrono::milliseconds timeout) const;
  // Records the failure, names the missing ranks (timeouts), writes the ring buffer file, throws.
  [[noreturn]] void fail_collective(std::int64_t seq, const char* what, std::chrono::milliseconds timeout,
                                    const std::exception* error) const;

  Info info_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  Logger logger_;
  int main_first_calls_ = 0;
  mutable CollectiveLog collectives_;
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
