#pragma once
// What ProcessGroup::recent_collectives() returns: one collective of one rank, as the ring buffer
// holds it (see Note [Collective ring buffer] in ddp/distributed/detail/collective_log.h).
#include <cstdint>

namespace ddp {

enum class CollectiveState { kStarted, kCompleted, kFailed };
const char* to_string(CollectiveState state);

// One collective of one rank. The strings are static (literals, c10::toString of a dtype): recording
// a collective allocates nothing.
struct CollectiveRecord {
  std::int64_t seq = 0;             // per-process-group sequence number, from 1, the same on every rank
  const char* op = "";              // the c10d operation: allreduce, broadcast, allgather, barrier
  const char* what = "";            // what it was for: "gradient all-reduce", "buffer broadcast", ...
  int bucket = -1;                  // DDP bucket index, -1 when not a gradient bucket
  std::int64_t numel = 0;
  const char* dtype = "";
  std::int64_t bytes = 0;
  std::int64_t start_unix_us = 0;   // wall clock (comparable between the ranks of one host)
  std::int64_t end_unix_us = 0;     // 0 while started
  CollectiveState state = CollectiveState::kStarted;
  const void* work = nullptr;       // identity of the backend's work object (never dereferenced)
  const char* algorithm = "flat";   // "flat" or "hierarchical" (see Note [Hierarchical collectives])
  // How the caller waits: "blocking" (the host, bounded by the timeout) or "stream-ordered" (only
  // the CUDA stream; see Note [Which waits block the host] in ddp/runtime/detail/cuda_support.h).
  const char* wait = "blocking";
};

}  // namespace ddp
