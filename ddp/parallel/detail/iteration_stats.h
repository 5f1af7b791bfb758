#pragma once
// DistributedDataParallel's timing statistics (internal; the public figures are ddp/parallel/ddp_stats.h,
// see Note [Timing statistics] there): the marks of one iteration and their running sums.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/distributed/detail/collective_log.h"
#include "ddp/parallel/ddp_stats.h"

namespace ddp::detail {

class IterationStats {
 public:
  struct BucketTimes {
    std::int64_t launch_ns = 0;
    std::int64_t done_ns = 0;  // 0: unknown (taken as the end of backward)
  };
  // The current iteration's marks (now_ns()): the forward's start and end, the last gradient ready.
  std::int64_t forward_start_ns = 0, forward_end_ns = 0, last_ready_ns = 0;
  void set_bucket_bytes(std::vector<std::size_t> bytes) { sums_.bucket_bytes = std::move(bytes); }
  const std::vector<std::size_t>& bucket_bytes() const { return sums_.bucket_bytes; }

  // One synchronized iteration's communication: first launch to last end, and the part of it that
  // backward waited for after its compute (the exposed wait).
  struct Communication {
    std::int64_t total_ns = 0;
    std::int64_t exposed_wait_ns = 0;
  };
  // Adds one synchronized iteration whose backward computed until `compute_end_ns` and waited for
  // the buckets from `wait_start_ns`.
  Communication add_iteration(const std::vector<BucketTimes>& buckets, std::int64_t compute_end_ns,
                             std::int64_t wait_start_ns);
  // Averages over the iterations so far.
  DdpStats averages() const;

 private:
  DdpStats sums_;
};

}  // namespace ddp::detail
