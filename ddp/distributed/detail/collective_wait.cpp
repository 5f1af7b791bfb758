#include "ddp/distributed/detail/collective_wait.h"

#include <algorithm>

namespace ddp::detail {

bool mentions_timeout(const std::string& text) {
  return text.find("imeout") != std::string::npos || text.find("imed out") != std::string::npos;
}

bool mentions_peer_loss(const std::string& text) {
  for (const char* words : {"onnection closed", "onnection reset", "Broken pipe", "closed by peer", "Socket closed"}) {
    if (text.find(words) != std::string::npos) return true;
  }
  return false;
}

WaitOutcome wait_abortable(const c10::intrusive_ptr<c10d::Work>& work, std::chrono::milliseconds timeout,
                           std::chrono::milliseconds slice, const std::atomic<bool>& aborted) {
  using std::chrono::milliseconds;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    // A work that completed before the abort is reported as completed (See Note [Watching the
    // round] in ddp/elastic/fault_tolerant.cpp).
    if (aborted.load()) return work->isCompleted() && !work->exception() ? WaitOutcome::kCompleted : WaitOutcome::kAborted;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return WaitOutcome::kTimedOut;
    try {
      return work->wait(std::min(left, slice)) ? WaitOutcome::kCompleted : WaitOutcome::kTimedOut;
    } catch (const std::exception& error) {
      // A slice that ran out: c10d's "Operation timed out!" while the work is still running.
      if (!work->isCompleted() && mentions_timeout(error.what())) continue;
      throw;
    }
  }
}

}  // namespace ddp::detail
