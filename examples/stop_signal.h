#pragma once
// --checkpoint-on-signal SIG: a training example stops at the next optimizer step after SIG (Slurm's
// `--signal=USR1@N` warning before the time limit, or `scancel --signal=USR1`), every rank at the same
// step, after writing a checkpoint. See Note [Checkpoint on a signal].
#include <memory>
#include <string>

namespace ddp {
class ProcessGroup;
}

namespace ddp::examples {

class StopSignal {
 public:
  // Installs the handler for `signal_name` (USR1, USR2, TERM, ...); throws ddp::UsageError otherwise.
  explicit StopSignal(const std::string& signal_name);
  ~StopSignal();  // restores the previous handler
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  // Whether any rank got the signal (a MAX all-reduce over `group` when there is one). Every rank
  // calls it at the same step, so all of them agree on the step to stop at.
  bool requested(ProcessGroup* group) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  int signal_ = 0;
};

}  // namespace ddp::examples
