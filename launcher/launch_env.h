#pragma once
// What the launcher makes of its own environment (read once into a ddp::EnvironmentSnapshot):
// Slurm's placement of this node, and the port that follows from it.
#include <optional>
#include <string>
#include <vector>

#include "ddp/base/environment.h"

namespace ddp::launcher {

// What Slurm tells a job step about itself (only the variables ddp_launch uses).
struct SlurmInfo {
  int nnodes = 1;
  int node_id = 0;
  std::vector<std::string> hosts;  // SLURM_JOB_NODELIST, expanded
  std::optional<long long> job_id;
};

// Slurm's variables, when SLURM_JOB_NODELIST / SLURM_NNODES / SLURM_NODEID are all present.
// Throws UsageError when they are present but malformed. Everything the launcher reads from the
// environment comes from its one EnvironmentSnapshot (ddp/base/environment.h), so tests pass a fake.
std::optional<SlurmInfo> slurm_info(const EnvironmentSnapshot& env);

// Note [Slurm default port]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Under Slurm, without --master_port, every node of a job must agree on a port without talking to
// each other, and two jobs sharing a node should not collide: port = 10000 + SLURM_JOB_ID % 50000
// (always in 10000..59999, below the usual ephemeral range 32768.. only in part; collisions need two
// jobs whose ids differ by a multiple of 50000 on the same first node).
int slurm_default_port(long long job_id);

}  // namespace ddp::launcher
