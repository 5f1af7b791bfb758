#include "ddp/distributed/detail/sliced_allreduce.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/error.h"
#include "ddp/base/str.h"

namespace ddp::detail {

// Note [Sliced all-reduce]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Gloo's ring all-reduce (gloo/allreduce.cc) cuts the tensor into one chunk per rank and each chunk
// into two segments, and keeps one segment in flight while it reduces the other. On a link that
// is the bottleneck this leaves it idle in the gaps: a rank sends its next segment only once its
// left neighbour's has arrived and been reduced, and any delay goes round the ring. Measured on 4
// namespace hosts with links shaped to 100 Mb/s (scripts/netns-cluster.sh, 1 rank per host), 8 MiB:
// one all-reduce reaches 86.8 Mb/s busbw (PyTorch's `dist.all_reduce` and ours alike); the same
// bytes as 2 / 4 / 8 all-reduces in flight at once 87.9 / 93.1 / 95.3 Mb/s; 64 MiB as 1 / 16 / 64
// all-reduces 89.2 / 89.9 / 95.1 Mb/s; at 1 Gb/s, 4 hosts, 8 MiB as 1 / 4 / 8 / 16: 923 / 951 /
// 949 / 922 Mb/s; 2 hosts 947 / 952 / 955 / 949 Mb/s. So slices of about 1 MiB: c10d's Gloo
// backend runs two of them at once (two worker threads), the next starts as soon as one ends, and
// the link always has data queued.
//
// The slices are views of the one flat tensor, started in slice order on every rank (c10d gives
// each its own Gloo tag, so the two in flight never mix). Each element is still the sum of the same
// ranks' values, but the ring's order of summation follows the slice's chunks: for 3 or more ranks
// an element may differ in its last bits from one unsliced all-reduce (every rank still gets the
// same result); with 2 ranks a + b is exact and nothing changes. Only CPU tensors over Gloo with 2
// or more ranks are sliced (NCCL pipelines by itself); the group's collective log keeps one record
// for the whole all-reduce.
//
// Only where the link is the bottleneck: by default (auto) a group slices when some of its ranks
// are on other hosts. On one host (loopback, 2 ranks on 2 cores) the slices cost more than they
// give: 8 / 16 / 64 MiB took 7.3 / 12.2 / 44 ms unsliced and 10.8 / 19.0 / 58 ms in 1 MiB slices
// (4 Gloo threads busy on 2 cores instead of 2). InitOptions::allreduce_slice_bytes,
// DDP_ALLREDUCE_SLICE_BYTES or ProcessGroup::set_allreduce_slice_bytes choose (0: off).

std::vector<Slice> allreduce_slices(std::int64_t numel, std::int64_t element_size, std::int64_t slice_bytes) {
  if (numel <= 0) return {Slice{0, std::max<std::int64_t>(numel, 0)}};
  const std::int64_t bytes = numel * std::max<std::int64_t>(element_size, 1);
  if (slice_bytes <= 0 || bytes <= slice_bytes) return {Slice{0, numel}};
  const std::int64_t count = std::min((bytes + slice_bytes - 1) / slice_bytes, numel);
  const std::int64_t base = numel / count, larger = numel % count;  // the first `larger` get one more
  std::vector<Slice> slices;
  slices.reserve(static_cast<std::size_t>(count));
  std::int64_t offset = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t size = base + (i < larger ? 1 : 0);
    slices.push_back(Slice{offset, size});
    offset += size;
  }
  return slices;
}

SlicedWork::SlicedWork(std::vector<c10::intrusive_ptr<c10d::Work>> slices, torch::Tensor tensor)
    : c10d::Work(-1, c10d::OpType::ALLREDUCE), slices_(std::move(slices)), tensor_(std::move(tensor)) {}

bool SlicedWork::isCompleted() {
  return std::all_of(slices_.begin(), slices_.end(), [](const auto& work) { return work->isCompleted(); });
}

bool SlicedWork::isSuccess() const {
  return !exception() &&
         std::all_of(slices_.begin(), slices_.end(), [](const auto& work) { return work->isCompleted(); });
}

std::exception_ptr SlicedWork::exception() const {
  for (const auto& work : slices_) {
    if (auto error = work->exception()) return error;
  }
  return nullptr;
}

bool SlicedWork::wait(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  for (const auto& work : slices_) {
    if (timeout == kNoTimeout) {
      work->wait();
      continue;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    // As c10d's Work::wait on a timeout; a zero would mean "no timeout" to the slice.
    TORCH_CHECK(left.count() > 0 || work->isCompleted(), "Operation timed out!");
    work->wait(std::max(left, std::chrono::milliseconds(1)));
  }
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> SlicedWork::getFuture() {
  std::lock_guard<std::mutex> lock(future_mutex_);
  if (future_) return future_;
  // Completed by the last slice's callback (or the first error); the callbacks hold the count and
  // the future, not this work, so a slice that never ends keeps nothing else alive.
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  struct Pending {
    std::atomic<std::size_t> left;
    std::atomic<bool> failed{false};
    c10::intrusive_ptr<c10::ivalue::Future> future;
    std::vector<at::Tensor> result;
  };
  auto pending = std::make_shared<Pending>();
  pending->left = slices_.size();
  pending->future = future_;
  pending->result = {tensor_};
  for (const auto& work : slices_) {
    work->getFuture()->addCallback([pending](c10::ivalue::Future& done) {
      if (done.hasError()) {
        if (!pending->failed.exchange(true)) pending->future->setErrorIfNeeded(done.exception_ptr());
        return;
      }
      if (pending->left.fetch_sub(1) == 1 && !pending->failed.load()) {
        pending->future->markCompleted(c10::IValue(pending->result));
      }
    });
  }
  return future_;
}

std::int64_t allreduce_slice_bytes_from_environment(const EnvLookup& env) {
  const auto text = env(env::kAllreduceSliceBytes);
  if (!text || text->empty() || *text == "auto") return kAllreduceSliceAuto;
  char* end = nullptr;
  errno = 0;
  const long long bytes = std::strtoll(text->c_str(), &end, 10);
  const bool digits_first = std::isdigit(static_cast<unsigned char>(text->front())) != 0;
  if (!digits_first || end == text->c_str() || *end != '\0' || errno != 0 || bytes < 0) {
    throw InvalidArgument(str(env::kAllreduceSliceBytes, "='", *text,
                              "' is not a whole number of bytes >= 0 or auto (the slice size of large all-reduces; 0: off)"));
  }
  return static_cast<std::int64_t>(bytes);
}

}  // namespace ddp::detail
