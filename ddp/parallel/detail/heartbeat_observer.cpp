#include "ddp/parallel/detail/heartbeat_observer.h"

#include <unistd.h>

namespace ddp::detail {

// Note [Heartbeat at forward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The heartbeat goes out when a training forward outside no_sync() starts, saying "entering
// iteration N" with the previous iteration's times. A rank that hangs between two iterations
// (data loading, its own code) then stays at N-1 while the others, blocked in iteration N's
// all-reduce, said N: the watchdog can tell the rank that holds the job up from those waiting.
// Note [Heartbeat steps in a live job]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The launcher knows a worker by the rank it started it with (DDP_AGENT_RANK, else RANK) and its
// pid: a heartbeat that claims another rank is dropped as forged (Note [Agent sender credentials]).
// Under ddp::FaultTolerant the model is built on a group of the process alone and then moved from
// group to group, whose ranks change at every regroup; so the heartbeat says the launcher's rank,
// never the group's. Its step count must mean the same on every rank too, for the hang watchdog
// (which rank is behind) and the straggler report (Note [Stragglers] in
// launcher/observe/straggler.h aligns the ranks' timings by step): counting forwards would not, as
// a joiner starts at 1 while the others are at 500, and a dropped step counts twice on the
// survivors. So FaultTolerant sets the count to the steps applied whenever a group is built
// (DistributedDataParallel::continue_after_steps): every rank, joiner or survivor, then says "entering step
// S + 1" for the same step. The iteration before is not timed (the regroup is no step's time).
void HeartbeatObserver::on_training_forward(std::int64_t now_ns) {
  if (!channel_.active()) return;
  AgentMessage m;
  m.flags = AgentMessage::kHasStep;
  m.rank = rank_;
  m.pid = static_cast<std::int32_t>(::getpid());
  m.step = ++step_;
  m.step_time_s = last_heartbeat_ns_ > 0 ? static_cast<double>(now_ns - last_heartbeat_ns_) / 1e9 : 0.0;
  m.comm_time_s = static_cast<double>(last_comm_ns_) / 1e9;
  m.wait_time_s = static_cast<double>(last_wait_ns_) / 1e9;
  m.timestamp_s = wall_seconds_now();
  last_heartbeat_ns_ = now_ns;
  channel_.send(m);
}

}  // namespace ddp::detail
