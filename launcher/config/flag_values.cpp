#include "launcher/config/flag_values.h"

#include <algorithm>

#include "ddp/base/error.h"
#include "launcher/config/torchrun_flags.h"

// Note [PET variables]
// ~~~~~~~~~~~~~~~~~~~~
// torchrun reads every flag (but --logs_specs and --numa_binding) from PET_<FLAG> when the flag is
// not on the command line (its argparse `env` action), and Kubeflow's PyTorchJob and Trainer start
// pods with nothing but these (PET_NNODES, PET_NPROC_PER_NODE, PET_MASTER_ADDR, ...), so ddp_launch
// does the same: the flag wins, an empty variable is the default (torchrun's falsy default), and a
// switch's variable is an integer (0 off). Older operators spell PET_N_PROC_PER_NODE; both are read,
// and both set to different values is an error. A malformed value is reported naming the variable
// (the user never typed the flag): parsing is shared with the flags, and the flag's error is
// rethrown with the variable's name and value in front.

namespace ddp::launcher::config {

FlagValues::FlagValues(std::function<bool(const char*)> on_command_line,
                       std::function<std::string(const char*)> command_line_value, const EnvironmentSnapshot& env)
    : on_command_line_(std::move(on_command_line)), command_line_value_(std::move(command_line_value)), env_(env) {}

std::optional<FlagValues::FromEnvironment> FlagValues::from_env(const char* name) {
  if (on_command_line_(name)) return std::nullopt;
  std::optional<FromEnvironment> found;
  for (const auto& variable : {torchrun_env_name(name), torchrun_env_alias(name)}) {
    if (!variable) continue;
    const auto value = env_.get(*variable);
    if (!value || value->empty()) continue;  // set but empty: the default, as torchrun's falsy default
    if (found && found->value != *value) {
      throw UsageError(ddp::str(found->variable, "='", found->value, "' and ", *variable, "='", *value,
                                "' disagree: they are one setting (--", name, "); unset one"));
    }
    if (!found) found = FromEnvironment{name, *variable, *value};
  }
  if (found && std::none_of(used_.begin(), used_.end(), [&](const auto& u) { return u.flag == found->flag; })) {
    used_.push_back(*found);
  }
  return found;
}

bool FlagValues::given(const char* name) { return on_command_line_(name) || from_env(name).has_value(); }

std::string FlagValues::text(const char* name) {
  const auto value = from_env(name);
  return value ? value->value : command_line_value_(name);
}

bool FlagValues::on(const char* name) {
  if (on_command_line_(name)) return true;
  const auto value = from_env(name);
  return value && parse_env_switch(value->variable, value->value);
}

void FlagValues::naming_variables(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const UsageError& error) {
    const std::string what = error.what();
    // The variable whose flag the message names first (a message may name two flags).
    const FromEnvironment* culprit = nullptr;
    std::size_t first = std::string::npos;
    for (const auto& u : used_) {
      if (what.find(u.variable) != std::string::npos) throw;  // already named
      const std::size_t at = what.find("--" + u.flag);
      if (at != std::string::npos && (first == std::string::npos || at < first)) {
        first = at;
        culprit = &u;
      }
    }
    if (culprit == nullptr) throw;
    throw UsageError(ddp::str(culprit->variable, "='", culprit->value, "' (torchrun's variable for --", culprit->flag,
                              "): ", what));
  }
}

}  // namespace ddp::launcher::config
