#pragma once
// An environment made of the given variables and nothing else, as a worker or a launcher reads it.
#include <map>
#include <string>
#include <utility>

#include "ddp/base/worker_variables.h"

namespace ddp::testing {

inline EnvLookup env_of(std::map<std::string, std::string> vars) {
  return EnvironmentSnapshot::from_map(std::move(vars)).lookup();
}

}  // namespace ddp::testing
