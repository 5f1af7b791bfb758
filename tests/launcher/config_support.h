#pragma once
// Parsing a command line in the launcher's unit tests: an environment with PATH and nothing else
// unless given, and the configuration or the UsageError's message.
#include <map>
#include <string>
#include <vector>

#include "ddp/base/worker_variables.h"
#include "ddp/base/error.h"
#include "launcher/config/config.h"

namespace ddp::launcher::testing {

inline EnvironmentSnapshot plain_env(std::map<std::string, std::string> extra = {}) {
  extra.emplace("PATH", "/usr/bin:/bin");
  return EnvironmentSnapshot::from_map(std::move(extra));
}

inline config::LaunchConfig parse(std::vector<std::string> args, const EnvironmentSnapshot& env = plain_env()) {
  std::vector<const char*> argv{"ddp_launch"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return config::parse_launch_args(static_cast<int>(argv.size()), argv.data(), env).config;
}

inline std::string usage_error(std::vector<std::string> args, const EnvironmentSnapshot& env = plain_env()) {
  try {
    parse(std::move(args), env);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace ddp::launcher::testing
