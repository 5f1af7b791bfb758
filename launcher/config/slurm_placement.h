#pragma once
// What the launcher makes of its own environment (read once into a ddp::EnvironmentSnapshot):
// Slurm's placement of this node, and the port that follows from it.
#include <optional>
#include <string>
#include <vector>

#include "ddp/base/worker_variables.h"

namespace ddp::launcher::config {

// What Slurm tells a job step about itself (only the variables ddp_launch uses).
struct SlurmInfo {
  int nnodes = 1;
  int node_id = 0;
  std::vector<std::string> hosts;  // SLURM_JOB_NODELIST, expanded
  std::optional<long long> job_id;
  bool in_step = true;  // SLURM_STEP_ID set: an srun task (not the batch script itself)
};

// Slurm's variables, when SLURM_JOB_NODELIST / SLURM_NNODES / SLURM_NODEID are all present.
// Throws UsageError when they are present but malformed. Everything the launcher reads from the
// environment comes from its one EnvironmentSnapshot (ddp/base/worker_variables.h), so tests pass a fake.
std::optional<SlurmInfo> slurm_info(const EnvironmentSnapshot& env);

// The port under Slurm without --master_port: ddp::slurm_default_port (See Note [Slurm default port]
// in ddp/base/worker_variables.h), the same as a binary that srun starts directly computes.
using ddp::slurm_default_port;

}  // namespace ddp::launcher::config
