#include "ddp/parallel/detail/iteration_stats.h"

#include <algorithm>

namespace ddp::detail {
namespace {

double ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

}  // namespace

IterationStats::Communication IterationStats::add_iteration(const std::vector<BucketTimes>& buckets, std::int64_t compute_end_ns,
                                           std::int64_t wait_start_ns) {
  const std::int64_t end_ns = now_ns();
  std::int64_t first_launch = buckets.empty() ? end_ns : buckets.front().launch_ns, last_done = 0;
  for (const auto& b : buckets) {
    first_launch = std::min(first_launch, b.launch_ns);
    last_done = std::max(last_done, b.done_ns > 0 ? b.done_ns : end_ns);
  }
  sums_.iterations += 1;
  sums_.forward_ms += ms(forward_end_ns - forward_start_ns);
  sums_.backward_compute_ms += ms(compute_end_ns - forward_end_ns);
  sums_.communication_ms += ms(last_done - first_launch);
  sums_.hidden_communication_ms += ms(std::max<std::int64_t>(0, std::min(last_done, compute_end_ns) - first_launch));
  sums_.exposed_wait_ms += ms(end_ns - wait_start_ns);
  return {last_done - first_launch, end_ns - wait_start_ns};
}

DdpStats IterationStats::averages() const {
  DdpStats out = sums_;
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

}  // namespace ddp::detail
