#pragma once
// --recovery live: restarting one dead worker alone. See Note [Restarting one live worker].
#include <optional>
#include <vector>

#include "launcher/agent/plan.h"

namespace ddp::launcher::agent {

// Note [Restarting one live worker]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In a live job (See Note [Live recovery with ddp_launch] in launcher/agent/live_recovery.cpp) the training
// state lives in the running workers, so a worker that dies must not take its node-mates with it:
// the supervisor (SupervisorOptions::respawn_worker, used by launcher/agent/attempt.cpp instead of stopping
// the group) starts a new process for that local rank alone, while the others keep running:
//   - its restart count K (TORCHELASTIC_RESTART_COUNT, "attempt_<K>/" folders, member id
//     "<node key>/local<L>/attempt<K>") is the round the node joined plus that local rank's own
//     restarts: K > 0, so it joins the training as a joiner and heals from a peer, and its member
//     id is new in the job.
//   - --max_restarts bounds the restarts of the node, all local ranks together (as torchrun counts
//     the restarts of its worker group): a node whose workers keep dying stops, whichever dies.
//     When they are used up, the failure stops the group as without live recovery, and the launcher
//     exits non-zero with the usual summary; the group is never restarted whole.
//   - before the new process starts, the launcher marks the dead one gone in the training's
//     membership by its worker key "<node key>/local<L>" (See Note [Marking a lost node gone] in
//     ddp/elastic/detail/membership_keys.h): claimed per member and round, so that the liveness channel's mark of
//     the whole node later (its host dies too) never counts it twice.
//   - the node succeeds when every local rank's last process exited 0: a restarted worker's failure
//     is logged, not the node's result.
// LiveRespawnPolicy is the pure decision; the launcher (live_launch.cpp) adds the mark and the plan.
class LiveRespawnPolicy {
 public:
  // `first_restart_count`: the round this node joined (its workers' first restart count).
  LiveRespawnPolicy(int nproc, int max_restarts, int first_restart_count);

  // Whether local_rank's current process is one of the training's first round (attempt 0 of a node
  // of the first rendezvous round): then it is marked gone before any round closed.
  bool in_first_round(int local_rank) const;
  // The restart count of local_rank's next process, or nothing when the node's restarts are used up.
  std::optional<int> next(int local_rank);
  int restarts_used() const { return used_; }

 private:
  int max_restarts_;
  int first_;
  int used_ = 0;
  std::vector<int> restarts_;  // per local rank
};

// Plans local_rank's process of restart count `restart_count` and makes its folders (the attempt's
// when no other worker of that count made it before).
process::WorkerLaunch prepare_worker(const config::LaunchConfig& config, const rendezvous::NodeAssignment& node, const LocalWorkers& local,
                            const RunContext& run, int restart_count, int local_rank);

}  // namespace ddp::launcher::agent
