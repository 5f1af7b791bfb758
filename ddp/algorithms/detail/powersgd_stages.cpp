#include "ddp/algorithms/detail/powersgd_stages.h"

#include <ATen/Parallel.h>
#include <ATen/core/ivalue.h>

#include <exception>
#include <utility>

#include "ddp/base/str.h"

namespace ddp::detail {

// Note [PowerSGD stages]
// ~~~~~~~~~~~~~~~~~~~~~~
// PowerSGD's later stages (orthogonalise P, Q = M^T P, all-reduce Q, M = P Q^T) can start only when
// the bucket's P all-reduce has ended. PyTorch chains them with Future::then, so they run as soon
// as it ends, while backward still computes. Waiting for them in the reducer's wait at the end of
// backward (Note [Hook work]) would serialise every bucket's Q all-reduce after the last gradient.
// Here each bucket's stages are queued, at the bucket's launch, to one stage thread per hook that
// runs them in launch order. Two things keep that correct:
//  - The Q all-reduces go over a group of their own: the same ranks over the parent's store under
//    a prefix of their own (ProcessGroup::new_group_of_same_ranks). On the parent, the Q
//    all-reduce of bucket k would interleave with the P all-reduce of bucket k + 1 in an order
//    that differs between ranks (it depends on when each rank's thread gets there), and Gloo
//    matches collectives by their order. On the stage group every rank issues them in bucket
//    order, from one thread, so they match. The prefix carries the parent's collective sequence
//    number at the first compressed bucket, the same on every rank and different for every hook
//    built over that parent, so a later hook never meets an earlier one's rendezvous keys.
//  - The stages touch only tensors captured at the launch (the bucket, its P, Q and error
//    buffers), never the hook's maps, which stay the hook thread's; the iteration count and the
//    maps change in the reducer's wait, after the stages of that bucket have ended.
// The numerics are those of the inline stages (same ops, same order per bucket). The group is
// created by the stage thread at the first compressed bucket (a rendezvous every rank reaches
// there), so backward goes on meanwhile. Each wait of a stage is bounded by the group's timeout,
// and the reducer's wait for the stages by the parent's. NCCL groups keep the inline stages:
// their continuation only queues work on a stream.

namespace {

// Completes when a bucket's stages have ended; its future at the same moment (HookWork takes the
// end of the bucket's communication from the future's callback, see Note [Hook work]).
class StageWork : public c10d::Work {
 public:
  StageWork() : future_(c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get())) {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  void complete(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue());
    }
    finish(error);
  }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

struct PowerSgdStages::Job {
  ProcessGroup* parent = nullptr;
  std::string prefix;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  const char* what = "";
  Stages stages;
  c10::intrusive_ptr<StageWork> done;
};

PowerSgdStages::PowerSgdStages() = default;

PowerSgdStages::~PowerSgdStages() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool PowerSgdStages::supported(const ProcessGroup& parent) { return parent.backend_name() == "gloo"; }

c10::intrusive_ptr<c10d::Work> PowerSgdStages::submit(ProcessGroup& parent,
                                                      std::vector<c10::intrusive_ptr<c10d::Work>> works,
                                                      const char* what, Stages stages) {
  if (submitted_parent_ != &parent) {
    submitted_parent_ = &parent;
    submitted_prefix_ = str("ddp/powersgd_stages/", parent.last_collective_seq());
  }
  auto job = std::make_unique<Job>();
  job->parent = &parent;
  job->prefix = submitted_prefix_;
  job->works = std::move(works);
  job->what = what;
  job->stages = std::move(stages);
  job->done = c10::make_intrusive<StageWork>();
  c10::intrusive_ptr<c10d::Work> done = job->done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  wake_.notify_one();
  return done;
}

ProcessGroup& PowerSgdStages::group_for(const Job& job) {
  if (!group_ || group_prefix_ != job.prefix) {
    group_.reset();
    group_prefix_ = job.prefix;
    group_ = job.parent->new_group_of_same_ranks("PowerSGD stages", job.prefix);
  }
  return *group_;
}

void PowerSgdStages::loop() {
  at::init_num_threads();  // the intra-op threads the hook's own thread computes with
  while (true) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Idle until a bucket is launched; the destructor wakes it. Each job's waits are bounded.
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    std::exception_ptr error;
    try {
      for (const auto& work : job->works) job->parent->wait(work, job->what);
      job->stages(group_for(*job));
    } catch (...) {
      error = std::current_exception();
    }
    job->done->complete(error);
  }
}

}  // namespace ddp::detail
