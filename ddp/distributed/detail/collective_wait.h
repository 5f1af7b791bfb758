#pragma once
// How ProcessGroup waits for a collective and reads c10d's failures (internal, not installed): the
// wait in slices that abort() can end, and the words that mean "timed out" or "the peer is gone".
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <string>

namespace ddp::detail {

bool mentions_timeout(const std::string& text);
// Gloo's words for a peer that went away: "Connection closed by peer", "Connection reset by peer",
// "Broken pipe" (a write to a closed socket).
bool mentions_peer_loss(const std::string& text);

enum class WaitOutcome { kCompleted, kTimedOut, kAborted };
// Waits for `work` at most `timeout`, in slices of `slice`, so that `aborted` (set by another thread)
// ends the wait (unless the work already completed without error); a completed work returns from its
// slice at once. The work's own failure is thrown
// as c10d throws it.
WaitOutcome wait_abortable(const c10::intrusive_ptr<c10d::Work>& work, std::chrono::milliseconds timeout,
                           std::chrono::milliseconds slice, const std::atomic<bool>& aborted);

}  // namespace ddp::detail
