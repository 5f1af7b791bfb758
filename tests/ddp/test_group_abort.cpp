// ProcessGroup::abort() on the backend: an NCCL group's communicators are aborted through c10d's
// Backend::abort(), a Gloo group's backend is left alone (its waits poll the flag). See Note
// [Aborting a group] in ddp/distributed/process_group.cpp. A recording backend stands in for ProcessGroupNCCL,
// which needs a GPU; the CUDA build compiles the same call against it. And the group's wait
// (wait_abortable) for a work that completes as a poll slice of its wait runs out.
#include <catch2/catch.hpp>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddp/distributed/detail/collective_wait.h"
#include "ddp/distributed/detail/sliced_allreduce.h"
#include "ddp/distributed/process_group.h"

namespace {

class RecordingBackend : public c10d::Backend {
 public:
  RecordingBackend() : c10d::Backend(0, 1) {}
  void abort() override { ++aborts; }
  const std::string getBackendName() const override { return "recording"; }
  int aborts = 0;
};

// A work whose wait runs out (after sleeping its timeout) `waits_before_done` times, and then once
// more at the moment the work completes: the race of Note [A work that completes as its wait gives
// up] (ddp/distributed/detail/collective_wait.cpp), every time. `failure`: the work's own error.
class CompletesAsWaitGivesUp : public c10d::Work {
 public:
  CompletesAsWaitGivesUp(int waits_before_done, std::exception_ptr failure)
      : c10d::Work(-1, c10d::OpType::ALLREDUCE), waits_left_(waits_before_done), failure_(std::move(failure)) {}
  bool wait(std::chrono::milliseconds timeout) override {
    if (isCompleted()) return c10d::Work::wait(timeout);  // returns, or throws the work's error
    ++waits;
    std::this_thread::sleep_for(timeout);
    if (waits_left_-- == 0) finish(failure_);
    TORCH_CHECK(false, "Operation timed out!");  // as c10d's Work::wait when it ran out
  }
  int waits = 0;

 private:
  int waits_left_;
  std::exception_ptr failure_;
};

int aborts_after_two_aborts(const std::string& backend_name) {
  auto backend = c10::make_intrusive<RecordingBackend>();
  ddp::ProcessGroup::Info info;
  info.backend_name = backend_name;
  ddp::ProcessGroup group(info, c10::make_intrusive<c10d::HashStore>(), backend);
  CHECK_FALSE(group.aborted());
  group.abort();
  group.abort();
  CHECK(group.aborted());
  return backend->aborts;
}

}  // namespace

TEST_CASE("abort() aborts an NCCL group's communicators once and leaves a Gloo backend alone", "[group_abort]") {
  CHECK(aborts_after_two_aborts("nccl") == 1);
  CHECK(aborts_after_two_aborts("gloo") == 0);
}

TEST_CASE("a work that completes as its wait's slice runs out is completed, not timed out", "[group_abort]") {
  using namespace std::chrono_literals;
  const std::atomic<bool> not_aborted{false};
  for (const int waits_before_done : {0, 3}) {
    CAPTURE(waits_before_done);
    auto work = c10::make_intrusive<CompletesAsWaitGivesUp>(waits_before_done, nullptr);
    CHECK(ddp::detail::wait_abortable(work, 10s, 100ms, not_aborted) == ddp::detail::WaitOutcome::kCompleted);
    CHECK(work->waits == waits_before_done + 1);
    // A sliced all-reduce whose last slice completes so: the same.
    std::vector<c10::intrusive_ptr<c10d::Work>> slices{c10::make_intrusive<CompletesAsWaitGivesUp>(0, nullptr),
                                                       c10::make_intrusive<CompletesAsWaitGivesUp>(waits_before_done, nullptr)};
    auto sliced = c10::make_intrusive<ddp::detail::SlicedWork>(slices, torch::ones({2}));
    CHECK(ddp::detail::wait_abortable(sliced, 10s, 100ms, not_aborted) == ddp::detail::WaitOutcome::kCompleted);
  }
  // Completed with its own error: that error, not a timeout.
  auto failing = c10::make_intrusive<CompletesAsWaitGivesUp>(
      1, std::make_exception_ptr(std::runtime_error("Connection closed by peer [10.0.0.2]:1234")));
  CHECK_THROWS_WITH(ddp::detail::wait_abortable(failing, 10s, 100ms, not_aborted),
                    Catch::Contains("Connection closed by peer"));
  // A work that never completes still times out after the whole timeout.
  auto never = c10::make_intrusive<CompletesAsWaitGivesUp>(1 << 30, nullptr);
  CHECK(ddp::detail::wait_abortable(never, 300ms, 100ms, not_aborted) == ddp::detail::WaitOutcome::kTimedOut);
}
