#include "launcher/config/config.h"

#include "ddp/base/printable.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cxxopts.hpp>
#include <random>
#include <set>
#include <sstream>

#include "launcher/config/flag_values.h"
#include "launcher/config/torchrun_flags.h"
#include "launcher/config/worker_command.h"

namespace ddp::launcher::config {
namespace {

// Every flag once: its (underscore) name, whether it takes a value, its help text and default.
// Both the cxxopts registration and split_launcher_args() read this table.
struct FlagSpec {
  const char* name;
  bool takes_value;
  const char* help;
  const char* default_value;  // nullptr: no default (absence is meaningful)
};

constexpr FlagSpec kFlags[] = {
    {"nnodes", true, "Number of nodes (N, or N:N)", nullptr},
    {"node_rank", true, "Rank of this node, 0..nnodes-1", nullptr},
    {"nproc_per_node", true, "Workers on this node: a number, gpu, cpu or auto", nullptr},
    {"master_addr", true, "Address of the node with rank 0", nullptr},
    {"master_port", true, "Port on the master node (0 or unset on one node: a free port; 29500 across nodes)", nullptr},
    {"standalone", false, "Single node on loopback with a free port (or --master_port)", nullptr},
    {"rdzv_endpoint", true, "HOST[:PORT] of the c10d store for dynamic rendezvous (port 29400; HOST:0 on one node: a free port)", nullptr},
    {"rdzv_id", true, "Id of the job, the same on every node", nullptr},
    {"rdzv_backend", true, "Accepted for torchrun compatibility: c10d (with --rdzv_endpoint) or static", nullptr},
    {"rdzv_timeout", true, "Seconds to wait for every node at rendezvous", "600"},
    {"rdzv_conf", true,
     "torchrun's rendezvous settings KEY=VALUE,...: join_timeout (= --rdzv_timeout); the other timeouts are "
     "checked (see docs/launcher.md)",
     nullptr},
    {"local_addr", true, "This node's address for the other nodes in a dynamic rendezvous (default: the route's)",
     nullptr},
    {"role", true, "ROLE_NAME of the workers", "default"},
    {"max_restarts", true, "Restarts of the local worker group before giving up", "0"},
    {"recovery", true,
     "What a lost host costs the others: restart (stop and restart every worker in a new round) or live "
     "(workers recover in place through ddp::FaultTolerant; needs --nnodes MIN:MAX and --rdzv_endpoint or --hosts/--hostfile)",
     "restart"},
    {"spares", true,
     "With --recovery live: K more workers per node that start, build their model and data and wait; one takes a "
     "lost worker's place at the next step, the world size unchanged (docs/faults.md, \"Hot spares\")",
     "0"},
    {"monitor_interval", true, "Seconds between checks of the workers", "0.1"},
    {"shutdown_grace", true, "Seconds between SIGTERM and SIGKILL when stopping workers", "10"},
    {"shutdown_timeout", true, "torchrun's name of --shutdown_grace", nullptr},
    {"signals_to_handle", true, "Signals forwarded to the workers (which then stop the job), e.g. adding SIGUSR1,SIGUSR2",
     kDefaultSignalsToHandle},
    {"start_method", true, "Accepted for torchrun compatibility: spawn, fork or forkserver (a binary is forked and exec'd)",
     "spawn"},
    {"event_log_handler", true, "Accepted for torchrun compatibility: null", "null"},
    {"hang_timeout", true,
     "Stop the job when a worker sent no heartbeat for this many seconds after its first (0: off)", "0"},
    {"straggler_action", true,
     "off; warn: name a rank whose steps take --straggler_factor times the others' (the log, /metrics; "
     "docs/faults.md); replace: also treat a straggler as lost (its node leaves an elastic job, whose other nodes "
     "go on without it, with a node waiting for a place, or with --spares in a live job)",
     "off"},
    {"straggler_factor", true, "With --straggler_action: a rank's busy time per step over the median of the others'",
     "1.5"},
    {"straggler_window", true, "With --straggler_action: the steps the figures are taken over", "50"},
    {"metrics_port", true, "Serve Prometheus metrics at http://ADDR:PORT/metrics (0: off)", "0"},
    {"metrics_addr", true,
     "Address --metrics_port listens on; anything but loopback exposes the metrics on the network", "127.0.0.1"},
    {"log_dir", true, "Write DIR/<run id>_<random>/attempt_<k>/<rank>/{stdout,stderr}.log (a new folder per run)", nullptr},
    {"redirects", true, "Streams sent only to the log files: 0..3 or local_rank:0..3,...", "0"},
    {"tee", true, "Streams sent to the log files and the console: 0..3 or local_rank:0..3,...", "0"},
    {"log_line_prefix_template", true,
     "Prefix of the workers' console lines, with ${role_name}, ${rank}, ${local_rank}, ${hostname} "
     "(default: $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else '[rank N]: ')",
     nullptr},
    {"collapse_lines", true,
     "Hold each console line up to SECONDS for the same line from other ranks and print it once, as "
     "[ranks 0-63]: ... (0: off; the log files keep every line), e.g. 0.5",
     "0"},
    {"local_ranks_filter", true, "Show only these local ranks on the console, e.g. 0,1", nullptr},
    {"ranks_filter", true, "Show only these global ranks on the console, e.g. 0,8-15 (with --local_ranks_filter: both)",
     nullptr},
    {"gpus", true, "GPUs for the local workers: 0,3,5 or auto or auto:N", nullptr},
    {"allow_busy_gpus", false, "Let --gpus auto pick GPUs that other processes use", nullptr},
    {"cpu_bind", true,
     "none, or exclusive: each local worker runs on its own contiguous share of the launcher's CPUs "
     "(OMP_NUM_THREADS = its CPU count unless set)",
     "none"},
    {"numa_binding", true,
     "node, socket, exclusive or core-complex: pin each local worker to CPUs near its GPU (CPU-only: local "
     "ranks in blocks over the NUMA nodes), as torchrun does",
     nullptr},
    {"dry_run", false, "Print each worker's command and environment, start nothing", nullptr},
    {"no_python", false, "Exec the target as a binary even if its name ends in .py", nullptr},
    {"python", true, "Interpreter for a .py target, -m or --run_path (default: $PYTHON_EXEC, $PYTHON, python3)", nullptr},
    {"virtual_local_rank", false, "LOCAL_RANK=0 for every worker, which sees only its own GPU (as device 0)", nullptr},
    {"duplicate_stdout_filters", true,
     "Also write tee'd stdout lines containing any of these (a,b; ',,' is a comma) to <attempt>/filtered_stdout.log",
     nullptr},
    {"duplicate_stderr_filters", true, "The same for stderr: <attempt>/filtered_stderr.log", nullptr},
    // One command, every host: launcher/hosts/remote_launch.h, docs/launcher.md "One command, every host".
    {"hostfile", true, "Start every host of FILE ('HOST slots=N' lines) over --ssh_cmd, node ranks in its order", nullptr},
    {"hosts", true, "Start every host of HOST:SLOTS,... (Horovod's -H) over --ssh_cmd", nullptr},
    {"include", true, "With --hostfile/--hosts: only these hosts or slots, e.g. host1@host2:0,1", nullptr},
    {"exclude", true, "With --hostfile/--hosts: not these hosts or slots, e.g. host1@host2:0,1", nullptr},
    {"ssh_cmd", true, "With --hostfile/--hosts: how a host is started, as `CMD HOST 'command line'` (CMD read by sh)",
     "ssh -o BatchMode=yes"},
    {"env", true, "With --hostfile/--hosts: forward variable NAME to every host (repeatable; see also .ddp_env)", nullptr},
    {"watch_stdin", false, "Stop the workers when stdin closes (each host of --hostfile/--hosts gets it)", nullptr},
    {"module", false, "The target is a Python module: PYTHON -u -m MODULE args", nullptr},
    {"run_path", false, "The target is a Python script (as a .py target: PYTHON -u SCRIPT args)", nullptr},
    // torchrun's flags that ddp_launch refuses, saying why: see Note [torchrun's command line].
    {"logs_specs", true, "Refused: a Python entry point", nullptr},
    {"run_id", true, "TORCHELASTIC_RUN_ID (default: rdzv_id, or 'none')", nullptr},
    {"print_completion", true,
     "Print a completion script for bash, zsh or tcsh and exit, e.g. --print-completion bash > "
     "~/.local/share/bash-completion/completions/ddp_launch",
     nullptr},
    {"help", false, "Print this help", nullptr},
    {"version", false, "Print the version", nullptr},
};

const FlagSpec* find_flag(const std::string& name) {
  for (const auto& f : kFlags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// The flag a command-line name means: itself, or the one flag it is a prefix of (argparse's
// abbreviations); nullptr when none or several.
const FlagSpec* match_flag(const std::string& name) {
  if (const FlagSpec* exact = find_flag(name)) return exact;
  const FlagSpec* match = nullptr;
  for (const auto& f : kFlags) {
    if (name.empty() || std::string(f.name).rfind(name, 0) != 0) continue;
    if (match != nullptr) return nullptr;
    match = &f;
  }
  return match;
}

// "--nproc-per-node=4" -> "--nproc_per_node=4", "--nproc=4" -> "--nproc_per_node=4", "-r3" and
// "-r=3" -> "--redirects=3", "-r" -> "--redirects": the spellings torchrun's parser accepts (see
// Note [torchrun's command line]). Unknown names are left for the caller to report.
std::string normalise_flag(const std::string& arg) {
  if (arg.size() >= 2 && arg[0] == '-' && arg[1] != '-') {
    const char* name = torchrun_short_option(arg[1]);
    if (name == nullptr) return arg;
    std::string value = arg.substr(2);
    if (!value.empty() && value[0] == '=') value = value.substr(1);
    return "--" + std::string(name) + (arg.size() > 2 ? "=" + value : "");
  }
  if (arg.rfind("--", 0) != 0) return arg;
  const auto eq = arg.find('=');
  std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
  for (auto& c : name) {
    if (c == '-') c = '_';
  }
  if (const FlagSpec* flag = match_flag(name)) name = flag->name;
  return "--" + name + (eq == std::string::npos ? "" : arg.substr(eq));
}

std::string random_run_id() {
  std::random_device rd;
  const auto high = rd();
  return ddp::str(std::hex, high, rd());
}

}  // namespace

// Note [Shell completion]
// ~~~~~~~~~~~~~~~~~~~~~~~
// torchrun 2.14 prints a completion script with --print-completion SHELL (bash, zsh, tcsh; it asks
// the optional shtab package to derive one from its parser). ddp_launch derives its own from kFlags,
// the one list of its flags, so a script never names a flag the parser refuses: each flag in both
// spellings; after a flag that takes a value, and for the training binary and its arguments, file
// names. Descriptions (zsh only) are each flag's help cut at the first sentence.
std::string completion_script(const std::string& shell) {
  struct Spelling {
    std::string underscored, dashed;
  };
  std::vector<Spelling> flags;
  std::vector<std::string> words;  // every spelling, without the leading "--"
  for (const auto& f : kFlags) {
    Spelling s{f.name, f.name};
    std::replace(s.dashed.begin(), s.dashed.end(), '_', '-');
    flags.push_back(s);
    words.push_back(s.underscored);
    if (s.dashed != s.underscored) words.push_back(s.dashed);
  }
  if (shell == "bash") {
    std::vector<std::string> options;
    for (const auto& w : words) options.push_back("--" + w);
    return "# bash completion for ddp_launch (ddp_launch --print-completion bash)\n"
           "_ddp_launch() {\n"
           "  local cur=${COMP_WORDS[COMP_CWORD]}\n"
           "  if [[ $cur == -* ]]; then\n"
           "    COMPREPLY=($(compgen -W \"" + ddp::join(options, " ") + "\" -- \"$cur\"))\n"
           "  else\n"
           "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
           "  fi\n"
           "}\n"
           "complete -o filenames -F _ddp_launch ddp_launch\n";
  }
  if (shell == "zsh") {
    std::string out = "#compdef ddp_launch\n# zsh completion for ddp_launch (ddp_launch --print-completion zsh)\n"
                      "_arguments \\\n";
    for (size_t k = 0; k < flags.size(); ++k) {
      std::string help = kFlags[k].help;
      help = trim_blanks(help.substr(0, help.find_first_of(".:;(")));
      for (char& ch : help) {
        if (std::string("[]'\\`$").find(ch) != std::string::npos) ch = ' ';
      }
      const std::string& u = flags[k].underscored;
      const std::string& d = flags[k].dashed;
      const std::string names = u == d ? "--" + u : "{--" + u + ",--" + d + "}";
      out += ddp::str("  '(--", u, u == d ? "" : " --" + d, ")'", names, "'[", help, "]",
                      kFlags[k].takes_value ? ":value:_files" : "", "' \\\n");
    }
    return out + "  '*::training binary and its arguments:_files'\n";
  }
  if (shell == "tcsh") {
    return "# tcsh completion for ddp_launch (ddp_launch --print-completion tcsh)\n"
           "complete ddp_launch 'c/--/(" + ddp::join(words, " ") + ")/' 'p/*/f/'\n";
  }
  throw UsageError(ddp::str("--print_completion: invalid choice '", shell, "' (choose from bash, zsh, tcsh)"));
}

const char* numa_binding_name(NumaBinding mode) {
  switch (mode) {
    case NumaBinding::kNode: return "node";
    case NumaBinding::kSocket: return "socket";
    case NumaBinding::kExclusive: return "exclusive";
    case NumaBinding::kCoreComplex: return "core-complex";
    case NumaBinding::kNone: break;
  }
  return "none";
}

std::vector<std::string> split_list(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep)) out.push_back(item);
  if (!text.empty() && text.back() == sep) out.push_back("");
  return out;
}

std::string trim_blanks(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

StdStreams StreamSpec::for_local_rank(int local_rank) const {
  if (per_local_rank.empty()) return all;
  auto it = per_local_rank.find(local_rank);
  return it == per_local_rank.end() ? StdStreams::kNone : it->second;
}

int parse_int_flag(const std::string& flag, const std::string& text, int min, int max) {
  size_t used = 0;
  long long value = 0;
  bool ok = !text.empty() && !std::isspace(static_cast<unsigned char>(text[0]));
  if (ok) {
    try {
      value = std::stoll(text, &used);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok || used != text.size()) {
    throw UsageError(ddp::str(flag, " expects an integer, got '", ddp::printable(text), "'"));
  }
  if (value < min || value > max) {
    throw UsageError(ddp::str(flag, " must be in ", min, "..", max, ", got ", value));
  }
  return static_cast<int>(value);
}

// The whole of `text` as a finite number (no leading space, nothing after it), or nullopt.
static std::optional<double> strict_number(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

// Strict parsing of a duration flag in seconds; throws UsageError naming the flag.
static double parse_seconds_flag(const std::string& flag, const std::string& text) {
  const std::optional<double> value = strict_number(text);
  if (!value || *value < 0) throw UsageError(ddp::str(flag, " expects a number of seconds >= 0, got '", text, "'"));
  return *value;
}

StreamSpec parse_stream_spec(const std::string& flag, const std::string& text) {
  StreamSpec spec;
  if (text.find(':') == std::string::npos) {
    spec.all = static_cast<StdStreams>(parse_int_flag(flag, text, 0, 3));
    return spec;
  }
  for (const auto& item : split_list(text, ',')) {
    const auto colon = item.find(':');
    if (colon == std::string::npos) {
      throw UsageError(ddp::str(flag, " '", text, "': '", item,
                                "' is not LOCAL_RANK:STREAMS (e.g. 0:1,1:2)"));
    }
    const int rank = parse_int_flag(flag + " local rank", item.substr(0, colon), 0, 1 << 20);
    const auto streams = static_cast<StdStreams>(parse_int_flag(flag + " streams", item.substr(colon + 1), 0, 3));
    if (!spec.per_local_rank.emplace(rank, streams).second) {
      throw UsageError(ddp::str(flag, " '", text, "' names local rank ", rank, " twice"));
    }
  }
  return spec;
}

GpuRequest parse_gpu_request(const std::string& text) {
  GpuRequest req;
  if (text == "auto" || text.rfind("auto:", 0) == 0) {
    req.mode = GpuRequest::Mode::kAuto;
    if (text != "auto") req.auto_count = parse_int_flag("--gpus auto:N", text.substr(5), 1, 1 << 16);
    return req;
  }
  req.mode = GpuRequest::Mode::kList;
  std::set<int> seen;
  for (const auto& item : split_list(text, ',')) {
    const int gpu = parse_int_flag("--gpus (a list like 0,3,5, or auto, or auto:N)", item, 0, 1 << 16);
    if (!seen.insert(gpu).second) {
      throw UsageError(ddp::str("--gpus '", text, "' names GPU ", gpu, " twice"));
    }
    req.list.push_back(gpu);
  }
  return req;
}

// Splits argv into the launcher's own flags (normalised: '-' -> '_' in long names) and the worker
// command (from the first positional argument on, verbatim).
struct SplitArgs {
  std::vector<std::string> launcher_args;
  std::vector<std::string> program;
};

// Note [A flag is never a value]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// "--local_addr --dry_run" must not take --dry_run as the address and start a real job (found by
// faults.launch_fuzz: the job then waited 600 s for a rendezvous host named "-m"). As in torchrun's
// argparse, the separate value of a flag may not look like a flag: "--..." or '-' and a letter. A
// negative number ("-1", "-.5") and "-" stay values; "--flag=-x" is always a value.
static bool looks_like_a_flag(const std::string& arg) {
  return arg.size() >= 2 && arg[0] == '-' && (arg[1] == '-' || std::isalpha(static_cast<unsigned char>(arg[1])));
}

static SplitArgs split_launcher_args(int argc, const char* const* argv) {
  SplitArgs split;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the training binary
    const std::string norm = normalise_flag(arg);
    split.launcher_args.push_back(norm);
    if (norm.rfind("--", 0) == 0 && norm.find('=') == std::string::npos) {
      const FlagSpec* flag = find_flag(norm.substr(2));
      if (flag != nullptr && flag->takes_value && i + 1 < argc) {
        const std::string value = argv[++i];
        if (looks_like_a_flag(value)) {
          throw UsageError(ddp::str(norm, " needs a value, but the next argument '", value,
                                    "' is a flag; give the value, or write ", norm, "=VALUE for one that starts with '-'"));
        }
        split.launcher_args.push_back(value);
      }
    }
  }
  for (; i < argc; ++i) split.program.emplace_back(argv[i]);
  return split;
}

// Note [Free port on one node]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torchrun on one node without --master_port serves its store on a free port (c10d on localhost:0),
// so two jobs on one shared machine never collide; a fixed default (29500) made the second job fail.
// ddp_launch does the same: one node (and not Slurm, whose nodes derive the job's port) and no
// --master_port means port 0, which the static rendezvous turns into a free port and the start-up
// line announces ("master 127.0.0.1:PORT"). --master_port P is exactly P, with --standalone too.
// Across nodes (a host list included) the port must be agreed in advance: 29500, torchrun's default. --rdzv_endpoint HOST:0
// (torchrun's recipe for one-node jobs) is the same: one node needs no rendezvous store.

// --recovery restart|live; live only in an elastic job with a c10d store (its workers' membership
// lives there).
static Recovery parse_recovery_flag(const std::string& text, bool elastic_with_store) {
  if (text == "restart") return Recovery::kRestart;
  if (text != "live") throw UsageError(ddp::str("--recovery '", text, "': use restart or live"));
  if (!elastic_with_store) {
    throw UsageError("--recovery live needs elastic membership over a c10d store: add --nnodes MIN:MAX (MIN < MAX) "
                     "and --rdzv_endpoint HOST:PORT");
  }
  return Recovery::kLive;
}

// Every value of the configuration, validated. See Note [torchrun's command line].
static void fill_config(LaunchConfig& c, FlagValues& values, const EnvironmentSnapshot& env,
                        const std::vector<std::string>& program) {
  auto given = [&](const char* name) { return values.given(name); };
  auto text = [&](const char* name) { return values.text(name); };
  auto on = [&](const char* name) { return values.on(name); };
  const std::optional<SlurmInfo> slurm = slurm_info(env);

  // Topology: flags first, then Slurm's variables, then defaults.
  if (given("nnodes")) {
    const std::string n = text("nnodes");
    const auto colon = n.find(':');
    if (colon != std::string::npos) {
      const int lo = parse_int_flag("--nnodes", n.substr(0, colon), 1, 1 << 20);
      const int hi = parse_int_flag("--nnodes", n.substr(colon + 1), 1, 1 << 20);
      if (lo > hi) throw UsageError(ddp::str("--nnodes ", n, ": MIN is above MAX; write MIN:MAX, e.g. 2:4"));
      c.nnodes = hi;
      c.min_nnodes = lo;
      c.elastic = lo < hi;  // See Note [Elastic rounds] in launcher/rendezvous/rounds.cpp
    } else {
      c.nnodes = parse_int_flag("--nnodes", n, 1, 1 << 20);
    }
  } else if (slurm) {
    c.nnodes = slurm->nnodes;
    c.notes.push_back(ddp::str("nnodes=", c.nnodes, " from SLURM_NNODES"));
    if (c.nnodes > 1 && !slurm->in_step) {
      c.warnings.push_back(ddp::str("SLURM_NNODES=", c.nnodes, " but no srun step (SLURM_STEP_ID is unset: the batch script "
                                    "itself?): every node needs its own ddp_launch: srun --ntasks-per-node 1 ddp_launch ..."));
    }
  }
  const bool rdzv = given("rdzv_endpoint");
  if (given("node_rank")) {
    c.node_rank = parse_int_flag("--node_rank", text("node_rank"), 0, 1 << 20);
  } else if (slurm && !rdzv) {
    c.node_rank = slurm->node_id;
    c.notes.push_back(ddp::str("node_rank=", *c.node_rank, " from SLURM_NODEID"));
  } else if (!rdzv) {
    c.node_rank = 0;
  }
  if (given("master_addr")) {
    c.master_addr = text("master_addr");
    if (c.master_addr.empty()) throw UsageError("--master_addr is empty");
    check_host("--master_addr", c.master_addr);
  } else if (slurm && !slurm->hosts.empty()) {
    c.master_addr = slurm->hosts.front();
    c.notes.push_back(ddp::str("master_addr=", c.master_addr, " from SLURM_JOB_NODELIST"));
  }
  if (given("master_port")) {
    c.master_port = parse_int_flag("--master_port", text("master_port"), 0, 65535);
  } else if (slurm && slurm->job_id) {
    c.master_port = slurm_default_port(*slurm->job_id);
    c.notes.push_back(ddp::str("master_port=", c.master_port, " from SLURM_JOB_ID"));
  } else if (c.nnodes == 1 && !given("hostfile") && !given("hosts")) {  // a host list: its first host is the master
    c.master_port = 0;  // See Note [Free port on one node]
  }
  c.standalone = on("standalone");
  if (c.standalone) {
    if (c.nnodes != 1) throw UsageError(ddp::str("--standalone runs one node, but --nnodes is ", c.nnodes));
    if (rdzv) throw UsageError("--standalone and --rdzv_endpoint exclude each other");
    c.node_rank = 0;
    c.master_addr = "127.0.0.1";
    if (!given("master_port")) c.master_port = 0;  // --master_port P: exactly P (torchrun ignores it)
  }
  if (rdzv) {
    if (given("node_rank")) {
      throw UsageError("--node_rank and --rdzv_endpoint exclude each other: the rendezvous assigns node ranks");
    }
    const Endpoint endpoint = parse_rdzv_endpoint("--rdzv_endpoint", text("rdzv_endpoint"));
    c.rdzv_host = endpoint.host;
    c.rdzv_port = endpoint.port;
    if (given("rdzv_backend") && text("rdzv_backend") != "c10d") {
      throw UsageError(ddp::str("--rdzv_backend ", text("rdzv_backend"),
                                ": only c10d is supported with --rdzv_endpoint"));
    }
    if (c.rdzv_port == 0) {  // torchrun's recipe for several one-node jobs on a host: HOST:0
      if (c.nnodes != 1) {
        throw UsageError(ddp::str("--rdzv_endpoint ", text("rdzv_endpoint"), ": port 0 (a free port) works on one node only; "
                                  "with --nnodes ", c.nnodes, " give every node the same port"));
      }
      c.notes.push_back(ddp::str("--rdzv_endpoint ", c.rdzv_host, ":0 on one node: this host, a free port"));
      c.rdzv_host.clear();  // one node needs no rendezvous: See Note [Free port on one node]
      c.node_rank = 0;
      c.master_addr = "127.0.0.1";
      c.master_port = given("master_port") ? c.master_port : 0;
    }
  } else if (given("rdzv_backend") && text("rdzv_backend") != "static" && text("rdzv_backend") != "c10d") {
    throw UsageError(ddp::str("--rdzv_backend ", text("rdzv_backend"), ": use c10d (with --rdzv_endpoint) or static"));
  }
  if (given("rdzv_id")) {
    c.rdzv_id = text("rdzv_id");
    if (c.rdzv_id.empty() || c.rdzv_id.find_first_of("/ \t\n") != std::string::npos) {
      throw UsageError(ddp::str("--rdzv_id '", c.rdzv_id, "' must be non-empty without '/' or spaces"));
    }
  }
  if (rdzv) c.rdzv_token = env.get("DDP_RDZV_TOKEN").value_or("");
  c.keep_c10_logs = env.get("TORCH_CPP_LOG_LEVEL").has_value();
  c.rdzv_timeout_s = parse_seconds_flag("--rdzv_timeout", text("rdzv_timeout"));
  if (c.rdzv_timeout_s <= 0) throw UsageError("--rdzv_timeout must be > 0");
  if (given("rdzv_conf")) {
    const RendezvousConf conf = parse_rdzv_conf(text("rdzv_conf"));
    if (conf.join_timeout_s) {
      if (given("rdzv_timeout") && *conf.join_timeout_s != c.rdzv_timeout_s) {
        throw UsageError(ddp::str("--rdzv_conf join_timeout=", *conf.join_timeout_s, " and --rdzv_timeout ",
                                  c.rdzv_timeout_s, " disagree: give one"));
      }
      c.rdzv_timeout_s = *conf.join_timeout_s;
    }
    if (conf.last_call_timeout_s) c.rdzv_last_call_s = *conf.last_call_timeout_s;
    if (conf.keep_alive_interval_s) c.live_keep_alive_s = *conf.keep_alive_interval_s;
    if (conf.keep_alive_max_attempt) c.live_keep_alive_max_attempt = *conf.keep_alive_max_attempt;
  }
  if (given("local_addr")) {
    c.local_addr = text("local_addr");
    if (c.local_addr.empty()) throw UsageError("--local_addr is empty");
    check_host("--local_addr", c.local_addr);
  }
  c.role = text("role");
  c.collapse_window_s = parse_seconds_flag("--collapse_lines", text("collapse_lines"));
  if (c.collapse_window_s > 60) {  // a console line held longer is no longer a console line
    throw UsageError(ddp::str("--collapse_lines ", text("collapse_lines"), ": at most 60 seconds; 0.3-1 suits ranks in step"));
  }
  c.log_line_prefix_template = given("log_line_prefix_template")
                                   ? text("log_line_prefix_template")
                                   : env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE").value_or("");
  if (c.role.empty()) throw UsageError("--role is empty");
  if (c.node_rank && *c.node_rank >= c.nnodes) {
    throw UsageError(ddp::str("--node_rank ", *c.node_rank, " must be below --nnodes ", c.nnodes));
  }
  if (c.master_port == 0 && c.nnodes > 1) {
    throw UsageError(ddp::str("--master_port 0 (a free port) works on a single node only; with --nnodes ",
                              c.nnodes, " give every node the same port"));
  }

  // Workers per node.
  if (given("nproc_per_node")) {
    c.nproc_given = true;
    const std::string n = text("nproc_per_node");
    static const std::map<std::string, NprocRequest::Kind> kKinds{
        {"gpu", NprocRequest::Kind::kGpu}, {"cpu", NprocRequest::Kind::kCpu}, {"auto", NprocRequest::Kind::kAuto}};
    if (n == "xpu") {
      throw UsageError("--nproc_per_node xpu: ddp_launch counts NVIDIA GPUs (gpu) or CPUs (cpu), not Intel XPUs");
    }
    if (const auto kind = kKinds.find(n); kind != kKinds.end()) c.nproc.kind = kind->second;
    else c.nproc.number = parse_int_flag("--nproc_per_node (a number >= 1, gpu, cpu or auto)", n, 1, 1 << 16);
  }
  if (given("gpus")) {
    c.gpus = parse_gpu_request(text("gpus"));
    if (c.gpus.mode == GpuRequest::Mode::kList) {
      const int n = static_cast<int>(c.gpus.list.size());
      if (!c.nproc_given) {
        c.nproc.number = n;
        c.nproc_given = true;
      } else if (c.nproc.kind == NprocRequest::Kind::kNumber && c.nproc.number > n) {
        throw UsageError(ddp::str("--gpus lists ", n, " GPUs for --nproc_per_node ", c.nproc.number,
                                  " workers: give one GPU per worker"));
      }
    } else if (c.gpus.auto_count && !c.nproc_given) {
      c.nproc.number = *c.gpus.auto_count;
      c.nproc_given = true;
    }
  }
  c.allow_busy_gpus = on("allow_busy_gpus");
  const std::string cpu_bind = text("cpu_bind");
  if (cpu_bind != "none" && cpu_bind != "exclusive") {
    throw UsageError(ddp::str("--cpu_bind: unknown value '", cpu_bind, "' (choose none or exclusive)"));
  }
  c.cpu_bind = cpu_bind == "exclusive" ? CpuBind::kExclusive : CpuBind::kNone;

  // Supervision and output.
  c.max_restarts = parse_int_flag("--max_restarts", text("max_restarts"), 0, 1 << 20);
  c.monitor_interval_s = parse_seconds_flag("--monitor_interval", text("monitor_interval"));
  if (c.monitor_interval_s <= 0) throw UsageError("--monitor_interval must be > 0");
  c.shutdown_grace_s = parse_seconds_flag("--shutdown_grace", text("shutdown_grace"));
  if (given("shutdown_timeout")) {  // torchrun's name
    const double timeout = parse_seconds_flag("--shutdown_timeout", text("shutdown_timeout"));
    if (given("shutdown_grace") && timeout != c.shutdown_grace_s) {
      throw UsageError(ddp::str("--shutdown_timeout ", timeout, " and --shutdown_grace ", c.shutdown_grace_s,
                                " are one setting: give one"));
    }
    c.shutdown_grace_s = timeout;
  } else if (!given("shutdown_grace") && env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) {
    c.shutdown_grace_s = parse_seconds_flag("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", *env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"));
  }
  c.signals_to_handle = text("signals_to_handle");
  c.forwarded_signals = parse_signals_to_handle(c.signals_to_handle);
  const std::string start_method = text("start_method");
  if (start_method != "spawn" && start_method != "fork" && start_method != "forkserver") {
    refuse_torchrun_only("start_method", start_method);
  }
  const std::string event_log_handler = text("event_log_handler");
  if (event_log_handler != "null" && event_log_handler != "dynamic_rendezvous") {
    refuse_torchrun_only("event_log_handler", event_log_handler);
  }
  c.virtual_local_rank = on("virtual_local_rank");
  if (given("logs_specs")) refuse_torchrun_only("logs_specs", text("logs_specs"));
  if (given("numa_binding")) {
    const std::string mode = text("numa_binding");
    for (NumaBinding m : {NumaBinding::kNode, NumaBinding::kSocket, NumaBinding::kExclusive, NumaBinding::kCoreComplex}) {
      if (mode == numa_binding_name(m)) c.numa_binding = m;
    }
    if (c.numa_binding == NumaBinding::kNone) {
      throw UsageError(ddp::str("--numa_binding: invalid choice '", mode, "' (choose from node, socket, exclusive, core-complex)"));
    }
    if (c.cpu_bind != CpuBind::kNone) {
      throw UsageError("--numa_binding and --cpu_bind exclusive both pin the workers: give one");
    }
  }
  if (given("duplicate_stdout_filters")) c.duplicate_stdout_filters = parse_duplicate_filters(text("duplicate_stdout_filters"));
  if (given("duplicate_stderr_filters")) c.duplicate_stderr_filters = parse_duplicate_filters(text("duplicate_stderr_filters"));
  c.hang_timeout_s = parse_seconds_flag("--hang_timeout", text("hang_timeout"));
  c.metrics_port = parse_int_flag("--metrics_port", text("metrics_port"), 0, 65535);
  const std::string straggler_action = text("straggler_action");
  if (straggler_action != "off" && straggler_action != "warn" && straggler_action != "replace") {
    throw UsageError(ddp::str("--straggler_action: invalid choice '", straggler_action, "' (choose from off, warn, replace)"));
  }
  c.stragglers = straggler_action != "off";
  c.replace_stragglers = straggler_action == "replace";
  const std::optional<double> factor = strict_number(text("straggler_factor"));
  if (!factor || *factor <= 1) {
    throw UsageError(ddp::str("--straggler_factor must be over 1 (a rank's time over the others'), got '",
                              text("straggler_factor"), "'"));
  }
  c.straggler_factor = *factor;
  c.straggler_window = parse_int_flag("--straggler_window", text("straggler_window"), 5, 100000);
  if (!c.stragglers && (given("straggler_factor") || given("straggler_window"))) {
    throw UsageError("--straggler_factor and --straggler_window need --straggler_action warn or replace");
  }
  // --nnodes MIN:MAX needs the c10d rendezvous (the static one has a fixed node count), or a host
  // list: with --hosts/--hostfile every host joins the first host's c10d rendezvous.
  const bool store = rdzv || given("hostfile") || given("hosts");
  if (c.elastic && !store) {
    throw UsageError(ddp::str("--nnodes ", text("nnodes"), " (elastic membership) needs the c10d rendezvous: add "
                              "--rdzv_endpoint HOST:PORT (and the same --rdzv_id on every node); the static "
                              "rendezvous (--node_rank, --master_addr) has a fixed node count"));
  }
  c.recovery = parse_recovery_flag(text("recovery"), c.elastic && store);  // See Note [Live recovery with ddp_launch]
  // See Note [Replacing a straggler] in launcher/agent/attempt.cpp.
  if (c.replace_stragglers && !c.elastic) {
    throw UsageError("--straggler_action replace needs elastic membership (--nnodes MIN:MAX with MIN < MAX and "
                     "--rdzv_endpoint, restart-based or --recovery live): the replaced node leaves and the others go "
                     "on without it");
  }
  c.spares = parse_int_flag("--spares", text("spares"), 0, 1024);
  if (c.spares > 0 && c.recovery != Recovery::kLive) {
    throw UsageError("--spares needs --recovery live: a spare takes a lost worker's place inside the running job "
                     "(restart-based rounds restart every worker anyway; add --recovery live)");
  }
  c.metrics_addr = text("metrics_addr");
  if (!is_numeric_address(c.metrics_addr)) {
    throw UsageError(ddp::str("--metrics_addr '", c.metrics_addr,
                              "' is not an IPv4 or IPv6 address (e.g. 127.0.0.1, or 0.0.0.0 for every interface)"));
  }
  if (given("log_dir")) {
    c.log_dir = text("log_dir");
    if (c.log_dir.empty()) throw UsageError("--log_dir is empty");
  }
  c.redirects = parse_stream_spec("--redirects", text("redirects"));
  c.tee = parse_stream_spec("--tee", text("tee"));
  if (given("local_ranks_filter") && !text("local_ranks_filter").empty()) {  // torchrun's default: ""
    std::vector<int> ranks;
    for (const auto& item : split_list(text("local_ranks_filter"), ',')) {
      ranks.push_back(parse_int_flag("--local_ranks_filter (e.g. 0,1)", item, 0, 1 << 20));
    }
    c.local_ranks_filter = ranks;
  }
  if (given("ranks_filter") && !text("ranks_filter").empty()) {
    std::vector<std::pair<int, int>> ranges;
    for (const auto& item : split_list(text("ranks_filter"), ',')) {
      const auto dash = item.find('-');
      const std::string what = "--ranks_filter (ranks and ranges, e.g. 0,8-15)";
      const int first = parse_int_flag(what, item.substr(0, dash), 0, 1 << 20);
      const int last = dash == std::string::npos ? first : parse_int_flag(what, item.substr(dash + 1), 0, 1 << 20);
      if (last < first) throw UsageError(ddp::str("--ranks_filter: range ", item, " ends before it starts; write ", last, "-", first));
      ranges.emplace_back(first, last);
    }
    c.ranks_filter = ranges;
  }
  c.dry_run = on("dry_run");
  c.run_id = given("run_id") ? text("run_id") : c.standalone ? random_run_id() : c.rdzv_id;
  if (c.run_id.empty() || c.run_id.find('/') != std::string::npos) {
    throw UsageError(ddp::str("run id '", c.run_id, "' must be non-empty without '/'"));
  }

  // One command, every host (the host list is read and checked by launch_on_hosts).
  if (given("hostfile")) c.hostfile = text("hostfile");
  if (given("hosts")) c.hosts = text("hosts");
  if (given("include")) c.include_hosts = text("include");
  if (given("exclude")) c.exclude_hosts = text("exclude");
  c.ssh_cmd = text("ssh_cmd");
  c.watch_stdin = on("watch_stdin");

  // The worker command: a binary, or a Python script or module (See Note [Python workers]).
  if (program.empty()) {
    throw UsageError("no training binary given: ddp_launch [options] TRAINING_BINARY [its arguments...]");
  }
  if (!c.hostfile.empty() || !c.hosts.empty()) {  // each host resolves the command in its own PATH
    c.program_args = program;
    return;
  }
  PythonRequest python;
  python.module = on("module");
  python.run_path = on("run_path");
  python.no_python = on("no_python");
  if (given("python")) python.python = text("python");
  WorkerCommand command = resolve_worker_command(program, python, env);
  c.program_path = std::move(command.path);
  c.program_args = std::move(command.args);
}

static ParseResult parse_launch_args_as_given(int argc, const char* const* argv, const EnvironmentSnapshot& env) {
  const SplitArgs split = split_launcher_args(argc, argv);

  cxxopts::Options options("ddp_launch",
                           "Starts the workers of one node of a data-parallel job. Flags are torchrun's, in both "
                           "spellings (--nproc_per_node, --nproc-per-node). See docs/launcher.md.");
  options.custom_help("[options] TRAINING_BINARY [its arguments...]");
  {
    auto adder = options.add_options();
    for (const auto& f : kFlags) {
      if (!f.takes_value) {
        adder(std::string(f.name) == "help" ? "h,help" : f.name, f.help);
      } else if (f.default_value != nullptr) {
        adder(f.name, f.help, cxxopts::value<std::string>()->default_value(f.default_value));
      } else {
        adder(f.name, f.help, cxxopts::value<std::string>());
      }
    }
  }
  ParseResult result;
  for (size_t i = 0; i < split.launcher_args.size(); ++i) {
    const std::string& arg = split.launcher_args[i];
    if (arg == "-h") continue;
    const auto eq = arg.find('=');
    const FlagSpec* flag = arg.rfind("--", 0) == 0 ? find_flag(arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)) : nullptr;
    if (flag == nullptr) {
      const std::string name = arg.substr(0, eq);
      std::vector<std::string> candidates;
      for (const auto& f : kFlags) {
        const std::string full = "--" + std::string(f.name);
        if (name.size() > 2 && full.rfind(name, 0) == 0) candidates.push_back(full);
      }
      if (candidates.size() > 1) {
        throw UsageError(ddp::str("ambiguous flag '", name, "' could match ", ddp::join(candidates, ", ")));
      }
      throw UsageError(ddp::str("unknown flag '", arg, "' (see ddp_launch --help)"));
    }
    if (flag->takes_value && eq == std::string::npos) {
      if (i + 1 >= split.launcher_args.size()) throw UsageError(ddp::str(arg, " needs a value"));
      ++i;  // skip its value
    }
  }
  std::vector<const char*> cargv{"ddp_launch"};
  for (const auto& a : split.launcher_args) cargv.push_back(a.c_str());
  cxxopts::ParseResult opts;
  try {
    opts = options.parse(static_cast<int>(cargv.size()), cargv.data());
  } catch (const cxxopts::exceptions::no_such_option& e) {
    throw UsageError(ddp::str(e.what(), " (see ddp_launch --help)"));
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(e.what());
  }
  if (opts.count("help")) {
    result.action = ParseResult::Action::kHelp;
    result.help_text = options.help();
    return result;
  }
  if (opts.count("version")) {
    result.action = ParseResult::Action::kVersion;
    return result;
  }
  if (opts.count("print_completion")) {
    result.action = ParseResult::Action::kPrintCompletion;
    result.help_text = completion_script(opts["print_completion"].as<std::string>());
    return result;
  }
  // A flag on the command line, else torchrun's PET_<NAME> variable, else the default: see
  // Note [PET variables] in launcher/config/flag_values.cpp.
  FlagValues values([&](const char* name) { return opts.count(name) > 0; },
                    [&](const char* name) { return opts[name].as<std::string>(); }, env);
  values.naming_variables([&] { fill_config(result.config, values, env, split.program); });
  result.config.launcher_args = split.launcher_args;  // the base of each host's command line
  return result;
}

// The command line and the environment are outside input, and errors quote them: a control byte in
// a flag's value or a variable (a newline, a '\r' from a file edited on Windows) is quoted as \xNN
// here, whichever check quoted it, so that the error stays one line (found by fuzz_rdzv_conf).
ParseResult parse_launch_args(int argc, const char* const* argv, const EnvironmentSnapshot& env) {
  try {
    return parse_launch_args_as_given(argc, argv, env);
  } catch (const UsageError& e) {
    const std::string message = e.what();
    if (std::none_of(message.begin(), message.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; })) throw;
    throw UsageError(ddp::printable(message));
  }
}

}  // namespace ddp::launcher::config
