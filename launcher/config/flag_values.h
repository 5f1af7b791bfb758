#pragma once
// Where each flag's value comes from: the command line, else torchrun's PET_<FLAG> variable, else
// the flag's default. See Note [PET variables] in flag_values.cpp.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddp/base/worker_variables.h"

namespace ddp::launcher::config {

class FlagValues {
 public:
  // on_command_line(name): whether the flag was given; command_line_value(name): its value (or its
  // default when not given).
  FlagValues(std::function<bool(const char*)> on_command_line,
             std::function<std::string(const char*)> command_line_value, const EnvironmentSnapshot& env);

  // The flag was given, on the command line or by a non-empty PET_ variable.
  bool given(const char* name);
  // Its value: the command line's, else the variable's, else the default.
  std::string text(const char* name);
  // A switch: on the command line, or its variable an integer other than 0.
  bool on(const char* name);

  // Runs `parse` (all of the configuration's validation); a UsageError about a flag whose value came
  // from a PET_ variable is rethrown naming the variable and its value.
  void naming_variables(const std::function<void()>& parse);

 private:
  struct FromEnvironment {
    std::string flag;
    std::string variable;
    std::string value;
  };
  std::optional<FromEnvironment> from_env(const char* name);

  std::function<bool(const char*)> on_command_line_;
  std::function<std::string(const char*)> command_line_value_;
  const EnvironmentSnapshot& env_;
  std::vector<FromEnvironment> used_;  // every variable read, for naming_variables()
};

}  // namespace ddp::launcher::config
