#pragma once
// This process's peak memory, from /proc/self: the one home of these readings for the examples'
// metrics and the benchmarks. Torch-free.
#include <cstdint>

namespace ddp::detail {

// Peak resident set size of this process (VmHWM in /proc/self/status) in bytes; 0 when unknown.
std::int64_t peak_rss_bytes();

// Starts a new peak for peak_rss_bytes (writes 5 to /proc/self/clear_refs); false when the kernel
// does not allow it (the peak is then the process's since it started).
bool reset_peak_rss();

}  // namespace ddp::detail
