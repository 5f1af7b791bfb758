#include "launcher/config/torchrun_flags.h"

#include <arpa/inet.h>
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstring>

#include "ddp/base/error.h"
#include "launcher/config/config.h"

// Note [torchrun's command line]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A torchrun command line that starts a binary (`torchrun ... --no-python ./train ...`) must run
// unchanged under ddp_launch, so every flag of torchrun 2.13 (torch/distributed/run.py) is either
// taken with torchrun's meaning or refused with one line saying why it cannot apply to a binary
// (exit 2, as argparse's errors). What torchrun's parser accepts besides the names:
// - both spellings of every long flag (--nproc-per-node, --nproc_per_node), `--flag=value`, and
//   a unique prefix of a flag's name (argparse's abbreviations);
// - the short options -r (--redirects), -t (--tee), -m (--module) and -h, also as `-r3` and `-r=3`;
// - PET_<NAME> as the default of the flags whose argparse action is `env` or `check_env` (a switch's
//   variable is an integer: 0 off). A flag on the command line wins over its variable.
// -m, --run_path and a `.py` target run Python as torchrun does (See Note [Python workers] in
// worker_command.cpp); --logs_specs (a Python entry point) is refused;
// flags whose torchrun meaning has no counterpart in ddp_launch yet (an event log handler that
// prints) are refused naming
// what to use instead, never ignored: a job that asked for them would silently behave differently.
// --start_method is accepted with any of torchrun's choices: a binary is always fork()ed and
// exec()ed, which is what every start method amounts to for a binary.

namespace ddp::launcher::config {
namespace {

// torchrun's flags whose default comes from PET_<NAME> (argparse actions env and check_env in
// run.py): every flag but --logs_specs and --numa_binding.
constexpr const char* kEnvFlags[] = {
    "nnodes",           "nproc_per_node",     "rdzv_backend",      "rdzv_endpoint",
    "rdzv_id",          "rdzv_conf",          "standalone",        "max_restarts",
    "monitor_interval", "start_method",       "event_log_handler", "role",
    "module",           "no_python",          "run_path",          "log_dir",
    "redirects",        "tee",                "local_ranks_filter", "duplicate_stdout_filters",
    "duplicate_stderr_filters", "node_rank",  "master_addr",       "master_port",
    "local_addr",       "signals_to_handle",  "shutdown_timeout",  "virtual_local_rank",
};

struct NamedSignal {
  const char* name;
  int number;
};

constexpr NamedSignal kSignals[] = {
    {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT}, {"SIGTERM", SIGTERM},
    {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGALRM", SIGALRM}, {"SIGXCPU", SIGXCPU},
    {"SIGVTALRM", SIGVTALRM}, {"SIGPROF", SIGPROF}, {"SIGPWR", SIGPWR}, {"SIGCONT", SIGCONT},
    {"SIGKILL", SIGKILL}, {"SIGSTOP", SIGSTOP}, {"SIGCHLD", SIGCHLD}, {"SIGPIPE", SIGPIPE},
};

double conf_seconds(const std::string& key, const std::string& value) {
  size_t used = 0;
  double seconds = -1;
  try {
    seconds = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size() || !std::isfinite(seconds) || seconds <= 0) {
    throw UsageError(ddp::str("--rdzv_conf ", key, "=", value, ": expected a number of seconds > 0"));
  }
  return seconds;
}

}  // namespace

const char* torchrun_short_option(char letter) {
  switch (letter) {
    case 'r': return "redirects";
    case 't': return "tee";
    case 'm': return "module";
    case 'h': return "help";
    default: return nullptr;
  }
}

std::optional<std::string> torchrun_env_name(const std::string& name) {
  for (const char* flag : kEnvFlags) {
    if (name != flag) continue;
    std::string variable = "PET_";
    for (char c : name) variable += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return variable;
  }
  return std::nullopt;
}

std::optional<std::string> torchrun_env_alias(const std::string& name) {
  if (name == "nproc_per_node") return std::string("PET_N_PROC_PER_NODE");
  return std::nullopt;
}

bool is_numeric_address(const std::string& text) {
  unsigned char address[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, text.c_str(), address) == 1 || ::inet_pton(AF_INET6, text.c_str(), address) == 1;
}

// A host name as resolvers take it (RFC 1123 labels, '_' as /etc/hosts allows), or an address.
// "-m" or "a b" would never resolve: refused at once rather than retried until the rendezvous
// timeout, which is what a valid name that does not resolve yet gets (a pod's service name).
void check_host(const std::string& flag, const std::string& host) {
  if (is_numeric_address(host)) return;
  const std::string name = !host.empty() && host.back() == '.' ? host.substr(0, host.size() - 1) : host;
  const auto valid_label = [](const std::string& label) {
    return !label.empty() && label.size() <= 63 && label.front() != '-' && label.back() != '-' &&
           std::all_of(label.begin(), label.end(), [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '_'; });
  };
  const std::vector<std::string> labels = split_list(name, '.');
  if (name.empty() || name.size() > 253 || !std::all_of(labels.begin(), labels.end(), valid_label)) {
    throw UsageError(ddp::str(flag, " '", host, "' is not a host name or an IP address (e.g. node1, 10.0.0.1)"));
  }
}

Endpoint parse_rdzv_endpoint(const std::string& flag, const std::string& text) {
  Endpoint endpoint;
  std::string port_text;
  if (!text.empty() && text[0] == '[') {  // [v6] or [v6]:port
    const auto close = text.find(']');
    if (close == std::string::npos || (close + 1 < text.size() && text[close + 1] != ':')) {
      throw UsageError(ddp::str(flag, " '", text, "' is not HOST[:PORT] (an IPv6 address as [ADDR]:PORT)"));
    }
    endpoint.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) port_text = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    endpoint.host = text.substr(0, colon);
    if (colon != std::string::npos) port_text = text.substr(colon + 1);
    if (colon != std::string::npos && text.find(':') != colon) {
      throw UsageError(ddp::str(flag, " '", text, "': write an IPv6 address as [ADDR]:PORT"));
    }
  }
  if (endpoint.host.empty()) throw UsageError(ddp::str(flag, " '", text, "' has no host (e.g. node1:29400)"));
  check_host(flag, endpoint.host);
  if (!port_text.empty() || text.back() == ':') endpoint.port = parse_int_flag(flag + " port", port_text, 0, 65535);
  return endpoint;
}

bool parse_env_switch(const std::string& variable, const std::string& value) {
  return parse_int_flag(variable + " (0: off, other integers: on, as torchrun reads it)", value, INT_MIN, INT_MAX) != 0;
}

// Note [Rendezvous timeouts from --rdzv_conf]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torchrun's c10d rendezvous reads join_timeout (how long a node waits for the others: ddp_launch's
// --rdzv_timeout, honoured), last_call_timeout (how long an elastic round waits for more than
// min nodes: honoured with --nnodes MIN:MAX, default 3 s, See Note [Elastic rounds]), keep_alive_interval and
// keep_alive_max_attempt (honoured with --recovery live: See Note [Lost hosts in a live job]), close_timeout and heartbeat,
// read_timeout and timeout (the store's per-request timeout) and use_libuv. With a fixed node count
// ddp_launch's rendezvous closes as soon as N nodes joined (no last call); membership liveness is
// the job channel's (Note [Coordinated restarts]), and every store request is bounded by the join
// timeout. Those keys are checked (a bad value is an error, as in torchrun) and have nothing else to
// do; is_host (which node serves the store) is refused: the node whose address is the endpoint
// serves it. Any other key is refused, where torchrun would pass it on unread.
RendezvousConf parse_rdzv_conf(const std::string& text) {
  RendezvousConf conf;
  for (const std::string& raw : split_list(text, ',')) {
    const std::string item = trim_blanks(raw);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      throw UsageError(ddp::str("--rdzv_conf '", text, "': '", item, "' is not KEY=VALUE (e.g. join_timeout=900)"));
    }
    const std::string key = trim_blanks(item.substr(0, eq));
    const std::string value = trim_blanks(item.substr(eq + 1));
    if (key == "join_timeout") {
      conf.join_timeout_s = conf_seconds(key, value);
    } else if (key == "last_call_timeout") {
      conf.last_call_timeout_s = conf_seconds(key, value);
    } else if (key == "keep_alive_interval") {
      conf.keep_alive_interval_s = conf_seconds(key, value);
    } else if (key == "close_timeout" || key == "read_timeout" ||
               key == "heartbeat" || key == "timeout") {
      // See Note [Rendezvous timeouts from --rdzv_conf].
      conf_seconds(key, value);
    } else if (key == "keep_alive_max_attempt") {
      if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos || value == "0") {
        throw UsageError(ddp::str("--rdzv_conf keep_alive_max_attempt=", value, ": expected an integer >= 1"));
      }
      if (value.size() > 6) {
        throw UsageError(ddp::str("--rdzv_conf keep_alive_max_attempt=", value, ": expected an integer up to 999999"));
      }
      conf.keep_alive_max_attempt = std::stoi(value);
    } else if (key == "use_libuv") {
      if (value != "0" && value != "1" && value != "true" && value != "false" && value != "True" && value != "False") {
        throw UsageError(ddp::str("--rdzv_conf use_libuv=", value, ": expected 0, 1, true or false"));
      }
    } else if (key == "is_host") {
      throw UsageError(
          "--rdzv_conf is_host: ddp_launch serves the rendezvous store on the node whose address is the "
          "--rdzv_endpoint host; drop is_host");
    } else {
      throw UsageError(ddp::str("--rdzv_conf: unknown key '", key,
                                "' (known: join_timeout, last_call_timeout, close_timeout, read_timeout, timeout, "
                                "heartbeat, keep_alive_interval, keep_alive_max_attempt, use_libuv)"));
    }
  }
  return conf;
}

std::vector<int> parse_signals_to_handle(const std::string& text) {
  std::vector<int> signals;
  for (const std::string& raw : split_list(text, ',')) {
    const std::string name = trim_blanks(raw);
    if (name.empty()) continue;
    const NamedSignal* found = nullptr;
    for (const auto& s : kSignals) {
      if (name == s.name) found = &s;
    }
    if (found == nullptr) {
      throw UsageError(ddp::str("--signals_to_handle: unknown signal '", name,
                                "' (names like SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2)"));
    }
    if (found->number == SIGKILL || found->number == SIGSTOP || found->number == SIGCHLD || found->number == SIGPIPE) {
      throw UsageError(ddp::str("--signals_to_handle: ", name,
                                " cannot be forwarded (it cannot be caught, or the launcher needs it itself)"));
    }
    if (std::find(signals.begin(), signals.end(), found->number) == signals.end()) signals.push_back(found->number);
  }
  return signals;
}

std::vector<std::string> parse_duplicate_filters(const std::string& text) {
  std::vector<std::string> needles;
  std::string needle;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i + 1 < text.size() && text[i] == ',' && text[i + 1] == ',') {
      needle += ',';
      ++i;
    } else if (i == text.size() || text[i] == ',') {
      if (!needle.empty()) needles.push_back(needle);
      needle.clear();
    } else {
      needle += text[i];
    }
  }
  return needles;
}

void refuse_torchrun_only(const std::string& name, const std::string& value) {
  if (name == "logs_specs") {
    throw UsageError(ddp::str("--logs_specs ", value,
                              ": names a Python entry point (torchrun.logs_specs); ddp_launch's logs are set by "
                              "--log_dir, --redirects and --tee"));
  }
  if (name == "event_log_handler") {
    throw UsageError(ddp::str("--event_log_handler ", value,
                              ": ddp_launch has no torchelastic event log (null is accepted); its events are its "
                              "console lines and --metrics_port"));
  }
  if (name == "start_method") {
    throw UsageError(ddp::str("--start_method: invalid choice '", value, "' (choose from spawn, fork, forkserver)"));
  }
}

}  // namespace ddp::launcher::config
