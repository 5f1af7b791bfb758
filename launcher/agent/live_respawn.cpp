#include "launcher/agent/live_respawn.h"

#include <sys/stat.h>

#include "ddp/base/error.h"
#include "ddp/base/str.h"
#include "launcher/process/log_layout.h"

namespace ddp::launcher::agent {

LiveRespawnPolicy::LiveRespawnPolicy(int nproc, int max_restarts, int first_restart_count)
    : max_restarts_(max_restarts), first_(first_restart_count), restarts_(static_cast<std::size_t>(nproc), 0) {}

bool LiveRespawnPolicy::in_first_round(int local_rank) const {
  return first_ == 0 && restarts_.at(static_cast<std::size_t>(local_rank)) == 0;
}

std::optional<int> LiveRespawnPolicy::next(int local_rank) {
  int& restarts = restarts_.at(static_cast<std::size_t>(local_rank));
  if (used_ >= max_restarts_) return std::nullopt;
  ++used_;
  ++restarts;
  return first_ + restarts;
}

process::WorkerLaunch prepare_worker(const config::LaunchConfig& config, const rendezvous::NodeAssignment& node, const LocalWorkers& local,
                            const RunContext& run, int restart_count, int local_rank) {
  std::vector<process::WorkerLaunch> group = plan_workers(config, node, local, run, restart_count, /*respawn=*/true);
  if (local_rank < 0 || local_rank >= static_cast<int>(group.size())) {
    throw ddp::InvalidArgument(ddp::str("prepare_worker: local rank ", local_rank, " of ", group.size()));
  }
  const std::string dir = process::attempt_dir(run.run_folder, restart_count);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) process::make_new_dir(dir);  // else a node-mate's restart made it
  process::WorkerLaunch& w = group[static_cast<std::size_t>(local_rank)];
  process::make_new_dir(w.dir);
  return std::move(w);
}

}  // namespace ddp::launcher::agent
