#pragma once
// The launcher's view of its own environment, read once and validated in one place.
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

// What Slurm tells a job step about itself (only the variables ddp_launch uses).
struct SlurmInfo {
  int nnodes = 1;
  int node_id = 0;
  std::vector<std::string> hosts;  // SLURM_JOB_NODELIST, expanded
  std::optional<long long> job_id;
};

// A snapshot of the environment. Everything the launcher reads from the environment comes from here
// (so tests pass a fake one) and everything the workers inherit is `vars`.
struct LaunchEnvironment {
  std::map<std::string, std::string> vars;

  static LaunchEnvironment from_process();  // reads environ
  static LaunchEnvironment from_map(std::map<std::string, std::string> vars);

  std::optional<std::string> get(const std::string& name) const;
  // Slurm's variables, when SLURM_JOB_NODELIST / SLURM_NNODES / SLURM_NODEID are all present.
  // Throws UsageError when they are present but malformed.
  std::optional<SlurmInfo> slurm() const;
};

// Note [Slurm default port]
// Under Slurm, without --master_port, every node of a job must agree on a port without talking to
// each other, and two jobs sharing a node should not collide: port = 10000 + SLURM_JOB_ID % 50000
// (always in 10000..59999, below the usual ephemeral range 32768.. only in part; collisions need two
// jobs whose ids differ by a multiple of 50000 on the same first node).
int slurm_default_port(long long job_id);

}  // namespace ddp::launcher
