#pragma once
// PowerSGD's later stages on a thread and a process group of their own (internal, not installed):
// see Note [PowerSGD stages] in powersgd_stages.cpp.
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/distributed/process_group.h"

namespace ddp::detail {

class PowerSgdStages {
 public:
  using Stages = std::function<void(ProcessGroup& stage_group)>;
  PowerSgdStages();
  // Joins the thread once the submitted stages have ended (each of their waits is bounded).
  ~PowerSgdStages();
  PowerSgdStages(const PowerSgdStages&) = delete;
  PowerSgdStages& operator=(const PowerSgdStages&) = delete;

  // Whether `parent` can have its stages here (Gloo; other backends run them in the reducer's wait).
  static bool supported(const ProcessGroup& parent);

  // Called on the thread that runs the hook, in bucket order, the same on every rank: once `works`
  // (collectives of `parent`, `what` names them) are done, runs `stages` on the stage thread with
  // the stage group. Returns the work that completes when `stages` has ended (or failed: its
  // wait() rethrows the error); its future completes at the same moment.
  c10::intrusive_ptr<c10d::Work> submit(ProcessGroup& parent, std::vector<c10::intrusive_ptr<c10d::Work>> works,
                                        const char* what, Stages stages);

 private:
  struct Job;
  void loop();
  ProcessGroup& group_for(const Job& job);

  // Set by submit (the hook's thread): which parent the stage group belongs to, and its store prefix.
  const ProcessGroup* submitted_parent_ = nullptr;
  std::string submitted_prefix_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Job>> jobs_;
  bool stopping_ = false;
  std::thread thread_;

  // The stage thread's own.
  std::shared_ptr<ProcessGroup> group_;
  std::string group_prefix_;
};

}  // namespace ddp::detail
