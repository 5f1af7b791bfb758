#include "ddp/algorithms/comm.h"

#include <ATen/core/ivalue.h>

#include <atomic>
#include <memory>
#include <utility>

#include "ddp/base/error.h"
#include "ddp/distributed/detail/collective_log.h"

namespace ddp {

HookWork::HookWork(ProcessGroup& group, std::vector<c10::intrusive_ptr<c10d::Work>> works, const char* what,
                   Continuation then)
    : group_(&group), works_(std::move(works)), what_(what), then_(std::move(then)) {
  DDP_CHECK(then_, "HookWork: the continuation is empty");
  // Taken when the collectives end, not when wait() is called: the statistics' overlap.
  auto done = done_by_callback_;
  for (const auto& work : works_) {
    try {
      work->getFuture()->addCallback([done](c10::ivalue::Future&) {
        const std::int64_t now = detail::now_ns();
        std::int64_t seen = done->load();
        while (seen < now && !done->compare_exchange_weak(seen, now)) {
        }
      });
    } catch (const std::exception&) {
      // No future on this backend: completion is taken when wait() returns.
    }
  }
}

HookWork HookWork::completed(torch::Tensor result) {
  HookWork work;
  work.then_ = [result = std::move(result)] { return result; };
  return work;
}

// Note [CUDA streams in DDP] in ddp/parallel/detail/reducer.cpp: with NCCL, Work::wait() without a timeout only
// orders the current stream after the collective (the NCCL watchdog bounds it); every other wait
// is the group's, bounded by its timeout.
torch::Tensor HookWork::wait() {
  DDP_CHECK(then_, "HookWork::wait: no work (waited twice, or never started)");
  const bool nccl = group_ != nullptr && group_->backend_name() == "nccl";
  for (const auto& work : works_) {
    if (!nccl) {
      group_->wait(work, what_);
      continue;
    }
    try {
      work->wait();
    } catch (const std::exception& error) {
      throw CommunicationError(str(what_, " failed on rank ", group_->rank(), ": ", first_line(error.what())));
    }
  }
  const std::int64_t waited_ns = detail::now_ns();
  const std::int64_t seq_before = group_ != nullptr ? group_->last_collective_seq() : 0;
  auto then = std::exchange(then_, Continuation());
  torch::Tensor result = then();
  // A continuation that communicated (PowerSGD's later stages) ends the communication itself.
  if (group_ != nullptr && group_->last_collective_seq() != seq_before) {
    done_ns_ = detail::now_ns();
  } else {
    done_ns_ = done_by_callback_->load() > 0 ? done_by_callback_->load() : (works_.empty() ? 0 : waited_ns);
  }
  works_.clear();
  return result;
}

HookWork allreduce_average(ProcessGroup& group, torch::Tensor& buffer, double divisor, const char* what,
                           int bucket) {
  if (divisor != 1) buffer.div_(divisor);
  auto work = group.allreduce_async(buffer, what, bucket);
  return HookWork(group, {std::move(work)}, what, [buffer] { return buffer; });
}

}  // namespace ddp
