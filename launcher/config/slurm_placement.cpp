#include "launcher/config/slurm_placement.h"

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/error.h"
#include "ddp/base/detail/hostlist.h"

namespace ddp::launcher::config {
namespace {

long long parse_env_integer(const std::string& name, const std::string& text, long long min) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || value < min) {
    throw UsageError(ddp::str("environment variable ", name, "='", text, "' is not an integer >= ",
                              min, "; unset it or fix the job script"));
  }
  return value;
}

}  // namespace

std::optional<SlurmInfo> slurm_info(const EnvironmentSnapshot& env) {
  const auto nodelist = env.get(env::kSlurmJobNodelist);
  const auto nnodes = env.get(env::kSlurmNnodes);
  const auto node_id = env.get(env::kSlurmNodeId);
  if (!nodelist || !nnodes || !node_id) return std::nullopt;
  SlurmInfo info;
  info.nnodes = static_cast<int>(parse_env_integer(env::kSlurmNnodes, *nnodes, 1));
  info.node_id = static_cast<int>(parse_env_integer(env::kSlurmNodeId, *node_id, 0));
  info.hosts = detail::expand_hostlist(*nodelist);
  if (auto job = env.get(env::kSlurmJobId)) info.job_id = parse_env_integer(env::kSlurmJobId, *job, 0);
  info.in_step = env.get(env::kSlurmStepId).has_value();
  if (info.node_id >= info.nnodes) {
    throw UsageError(ddp::str(env::kSlurmNodeId, "=", info.node_id, " is not below ", env::kSlurmNnodes, "=",
                              info.nnodes));
  }
  return info;
}

}  // namespace ddp::launcher::config
