#pragma once
// torchrun's flags that ddp_launch takes with torchrun's meaning, and those it refuses because they
// cannot apply to a binary. See Note [torchrun's command line] in torchrun_flags.cpp; the table of
// every flag is in docs/launcher.md.
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher::config {

// The short options torchrun has ("-r" is --redirects); nullptr for any other letter.
const char* torchrun_short_option(char letter);

// PET_<NAME>: the variable torchrun reads as the default of flag `name` (underscore spelling), when
// torchrun reads one for that flag (its argparse actions `env` and `check_env`); nullopt otherwise.
std::optional<std::string> torchrun_env_name(const std::string& name);

// Older spellings torchrun's users still set: PET_N_PROC_PER_NODE (Kubeflow's older operators) for
// --nproc_per_node; nullopt for every other flag.
std::optional<std::string> torchrun_env_alias(const std::string& name);

// A switch's value from its PET_ variable ("0" off, any other integer on), as torchrun's check_env.
// Throws UsageError when the variable is not an integer.
bool parse_env_switch(const std::string& variable, const std::string& value);

// The --rdzv_conf keys (KEY=VALUE,...). Throws UsageError for an unknown key, a key ddp_launch
// cannot honour (is_host) or a bad value.
struct RendezvousConf {
  std::optional<double> join_timeout_s;  // --rdzv_timeout's torchrun spelling
  std::optional<double> last_call_timeout_s;  // elastic rounds (--nnodes MIN:MAX): See Note [Elastic rounds]
  // --recovery live: the liveness channel's ping interval and how many missed pings lose a node
  // (See Note [Lost hosts in a live job] in launcher/channel/live_watch.cpp).
  std::optional<double> keep_alive_interval_s;
  std::optional<int> keep_alive_max_attempt;
};
RendezvousConf parse_rdzv_conf(const std::string& text);

// --rdzv_endpoint HOST[:PORT] (IPv6 as [ADDR]:PORT): the port defaults to torchrun's 29400; 0 is
// "a free port" (one node only, checked by the caller). Throws UsageError naming `flag`.
struct Endpoint {
  std::string host;
  int port = 29400;
};
Endpoint parse_rdzv_endpoint(const std::string& flag, const std::string& text);

// An IPv4 or IPv6 address (not a name).
bool is_numeric_address(const std::string& text);
// Throws UsageError naming `flag` when `host` is neither an IP address nor a valid host name.
void check_host(const std::string& flag, const std::string& host);

// --signals_to_handle "SIGTERM,SIGINT,SIGUSR1": signal numbers, in order, without repeats. Throws
// UsageError naming an unknown signal or one that cannot be handled (SIGKILL, SIGSTOP, SIGCHLD).
std::vector<int> parse_signals_to_handle(const std::string& text);

// --duplicate_stdout_filters "apple,or,,ange": the needles {"apple", "or,ange"} (",," is a comma, as
// torchrun's); empty needles are dropped (torchrun's would match every line).
std::vector<std::string> parse_duplicate_filters(const std::string& text);

// torchrun's default --signals_to_handle.
inline constexpr char kDefaultSignalsToHandle[] = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";

// Throws UsageError (one line saying why) for a torchrun flag or value that cannot apply to a
// binary. `value` is the flag's text ("1" for a switch that is on).
void refuse_torchrun_only(const std::string& name, const std::string& value);

}  // namespace ddp::launcher::config
