#include "examples/stop_signal.h"

#include <signal.h>

#include <atomic>
#include <torch/torch.h>

#include "ddp/base/error.h"
#include "ddp/distributed/process_group.h"

// Note [Checkpoint on a signal]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A batch scheduler warns a job before it ends it (Slurm: `#SBATCH --signal=USR1@60`, or
// `scancel --signal=USR1`); a job that then checkpoints and exits can be requeued and resume
// (scripts/ddp_sbatch_example.sh). The signal reaches each rank at a different step, so the handler
// only sets a flag and the ranks agree, after every optimizer step, whether any of them got it (one
// MAX all-reduce of one number: the cost of the option, paid only when it is on): they then stop at
// the same step, which is what a checkpoint needs. The flag is the one piece of global state here,
// because a signal handler can reach nothing else (a lock-free atomic, async-signal-safe).

namespace ddp::examples {
namespace {

std::atomic<bool> g_signalled{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void on_signal(int) { g_signalled.store(true); }

int signal_number(const std::string& name) {
  const std::string bare = name.rfind("SIG", 0) == 0 ? name.substr(3) : name;
  if (bare == "USR1") return SIGUSR1;
  if (bare == "USR2") return SIGUSR2;
  if (bare == "TERM") return SIGTERM;
  if (bare == "INT") return SIGINT;
  if (bare == "HUP") return SIGHUP;
  throw UsageError(str("--checkpoint-on-signal ", name, ": choose USR1, USR2, TERM, INT or HUP"));
}

}  // namespace

StopSignal::StopSignal(const std::string& signal_name) : name_(signal_name), signal_(signal_number(signal_name)) {
  g_signalled.store(false);
  struct sigaction action {};
  action.sa_handler = on_signal;
  ::sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(signal_, &action, nullptr);
}

StopSignal::~StopSignal() { ::signal(signal_, SIG_DFL); }

bool StopSignal::requested(ProcessGroup* group) const {
  const bool here = g_signalled.load();
  if (group == nullptr) return here;
  torch::Tensor flag = torch::full({1}, here ? 1.0F : 0.0F);
  group->allreduce(flag, c10d::ReduceOp::MAX, "stop signal");
  return flag.item<float>() > 0;
}

}  // namespace ddp::examples
