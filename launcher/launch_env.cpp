#include "launcher/launch_env.h"

#include <cstdlib>
#include <cstring>

#include "launcher/hostlist.h"
#include "ddp/base/error.h"

extern char** environ;

namespace ddp::launcher {
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

LaunchEnvironment LaunchEnvironment::from_process() {
  LaunchEnvironment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    env.vars.emplace(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  return env;
}

LaunchEnvironment LaunchEnvironment::from_map(std::map<std::string, std::string> vars) {
  LaunchEnvironment env;
  env.vars = std::move(vars);
  return env;
}

std::optional<std::string> LaunchEnvironment::get(const std::string& name) const {
  auto it = vars.find(name);
  if (it == vars.end()) return std::nullopt;
  return it->second;
}

std::optional<SlurmInfo> LaunchEnvironment::slurm() const {
  const auto nodelist = get("SLURM_JOB_NODELIST");
  const auto nnodes = get("SLURM_NNODES");
  const auto node_id = get("SLURM_NODEID");
  if (!nodelist || !nnodes || !node_id) return std::nullopt;
  SlurmInfo info;
  info.nnodes = static_cast<int>(parse_env_integer("SLURM_NNODES", *nnodes, 1));
  info.node_id = static_cast<int>(parse_env_integer("SLURM_NODEID", *node_id, 0));
  info.hosts = expand_hostlist(*nodelist);
  if (auto job = get("SLURM_JOB_ID")) info.job_id = parse_env_integer("SLURM_JOB_ID", *job, 0);
  if (info.node_id >= info.nnodes) {
    throw UsageError(ddp::str("SLURM_NODEID=", info.node_id, " is not below SLURM_NNODES=",
                              info.nnodes));
  }
  return info;
}

int slurm_default_port(long long job_id) { return static_cast<int>(10000 + job_id % 50000); }

}  // namespace ddp::launcher
