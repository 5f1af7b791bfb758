#pragma once
// ddp_launch's configuration: every flag parsed once, validated, into LaunchConfig.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/config/slurm_placement.h"
#include "ddp/base/error.h"

namespace ddp::launcher::config {

// Which standard streams of a worker go somewhere (torchrun's Std: 0 none, 1 out, 2 err, 3 both).
enum class StdStreams { kNone = 0, kOut = 1, kErr = 2, kBoth = 3 };
constexpr StdStreams operator|(StdStreams a, StdStreams b) {
  return static_cast<StdStreams>(static_cast<int>(a) | static_cast<int>(b));
}
// Whether `streams` includes `stream` (kOut or kErr).
constexpr bool includes(StdStreams streams, StdStreams stream) {
  return (static_cast<int>(streams) & static_cast<int>(stream)) != 0;
}

// torchrun's --redirects / --tee value: one StdStreams for every local rank ("3"), or a map
// "0:1,1:2" from local rank to StdStreams (ranks not named get kNone).
struct StreamSpec {
  StdStreams all = StdStreams::kNone;
  std::map<int, StdStreams> per_local_rank;
  StdStreams for_local_rank(int local_rank) const;
};
StreamSpec parse_stream_spec(const std::string& flag, const std::string& text);

// How --gpus chooses each local worker's CUDA_VISIBLE_DEVICES.
struct GpuRequest {
  enum class Mode { kNone, kList, kAuto } mode = Mode::kNone;
  std::vector<int> list;       // kList: the GPU indices, in local-rank order
  std::optional<int> auto_count;  // kAuto: "auto:N"
};
GpuRequest parse_gpu_request(const std::string& text);

// How many workers per node: a number, or resolved at start-up from the machine.
struct NprocRequest {
  enum class Kind { kNumber, kGpu, kCpu, kAuto } kind = Kind::kNumber;
  int number = 1;
};

// --cpu_bind: whether each local worker is pinned to its own CPUs.
enum class CpuBind { kNone, kExclusive };

// --numa_binding (torchrun's): each local worker pinned near its GPU (or, CPU-only, its NUMA node).
// See Note [NUMA binding] in launcher/resources/numa_binding.cpp.
enum class NumaBinding { kNone, kNode, kSocket, kExclusive, kCoreComplex };
const char* numa_binding_name(NumaBinding mode);  // torchrun's spelling: "node", ..., "core-complex"

// --recovery: what a lost host costs the others. See Note [Live recovery with ddp_launch] in
// launcher/agent/live_recovery.cpp.
enum class Recovery { kRestart, kLive };

struct LaunchConfig {
  // Topology.
  int nnodes = 1;
  std::optional<int> node_rank;  // absent with --rdzv_endpoint: assigned at rendezvous
  NprocRequest nproc;
  bool nproc_given = false;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 0: pick a free port (single node only)
  bool standalone = false;
  // Dynamic rendezvous (c10d TCPStore, in the plugin library).
  std::string rdzv_host;  // empty: static rendezvous
  int rdzv_port = 0;
  std::string rdzv_id = "none";
  double rdzv_timeout_s = 600;
  // The job's rendezvous secret, from DDP_RDZV_TOKEN (never a flag: command lines are visible to
  // every user). Empty: none. See Note [Rendezvous token] in launcher/rendezvous/records.cpp.
  std::string rdzv_token;
  bool keep_c10_logs = false;  // TORCH_CPP_LOG_LEVEL is set: the rendezvous leaves c10's logging alone
  std::string local_addr;  // --local_addr: what this node advertises in a dynamic rendezvous; empty: the route's
  std::string role = "default";  // ROLE_NAME
  // Elastic membership: --nnodes MIN:MAX with MIN < MAX (nnodes is then MAX). See Note [Elastic
  // rounds] in launcher/rendezvous/rounds.cpp.
  bool elastic = false;
  int min_nnodes = 1;
  double rdzv_last_call_s = 3;  // --rdzv_conf last_call_timeout: how long a round waits for more than MIN
  Recovery recovery = Recovery::kRestart;  // --recovery
  // --recovery live: --rdzv_conf keep_alive_interval and keep_alive_max_attempt (See Note [Lost
  // hosts in a live job] in launcher/channel/live_watch.cpp).
  double live_keep_alive_s = 1;
  int live_keep_alive_max_attempt = 5;
  // Supervision.
  std::vector<int> forwarded_signals;  // --signals_to_handle
  std::string signals_to_handle;       // its text, as given: TORCHELASTIC_SIGNALS_TO_HANDLE
  int max_restarts = 0;
  double monitor_interval_s = 0.1;
  double shutdown_grace_s = 10;
  // Observability (docs/observability.md).
  double hang_timeout_s = 0;  // 0: no hang watchdog
  int metrics_port = 0;       // 0: no metrics server
  // --spares K: K spare workers per node in a --recovery live job (See Note [Hot spares in
  // ddp_launch] in launcher/agent/plan.cpp).
  int spares = 0;
  // --straggler_action warn|replace (See Note [Stragglers] in launcher/observe/straggler.h).
  bool stragglers = false;
  bool replace_stragglers = false;  // --straggler_action replace
  double straggler_factor = 1.5;
  int straggler_window = 50;
  std::string metrics_addr = "127.0.0.1";
  // Output.
  // torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, or --log_line_prefix_template (See Note [Log
  // line prefix] in launcher/process/line_splitter.cpp); empty: "[rank N]: ".
  std::string log_line_prefix_template;
  // --collapse_lines SECONDS (0: off): See Note [Collapsed lines] in launcher/process/line_collapser.cpp.
  double collapse_window_s = 0;
  std::string log_dir;  // empty: no per-worker log files (unless redirects need them)
  StreamSpec redirects;
  StreamSpec tee;
  std::optional<std::vector<int>> local_ranks_filter;  // absent: every rank on the console
  std::optional<std::vector<std::pair<int, int>>> ranks_filter;  // global ranks, inclusive ranges; absent: all
  // torchrun's --duplicate_stdout_filters / --duplicate_stderr_filters: lines of tee'd streams that
  // contain any of these are also written to <attempt folder>/filtered_std{out,err}.log.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  // GPUs.
  GpuRequest gpus;
  bool allow_busy_gpus = false;
  // torchrun's --virtual_local_rank: every worker gets LOCAL_RANK=0 and only its GPU (the local
  // rank's entry of an inherited CUDA_VISIBLE_DEVICES, else its --gpus GPU, else GPU local_rank).
  bool virtual_local_rank = false;
  // CPUs (See Note [CPU binding] in launcher/resources/resources.h).
  CpuBind cpu_bind = CpuBind::kNone;
  NumaBinding numa_binding = NumaBinding::kNone;
  // Misc.
  bool dry_run = false;
  std::string run_id;  // TORCHELASTIC_RUN_ID
  // The worker: resolved executable path (as execvp would find it) and argv (argv[0] as given).
  std::string program_path;
  std::vector<std::string> program_args;
  // One command, every host (launcher/hosts/remote_launch.h): --hostfile or --hosts, --include or
  // --exclude, --ssh_cmd; --watch_stdin on each host. launcher_args: this launcher's own flags as
  // given (normalised), the base of each host's command line.
  std::string hostfile;
  std::string hosts;
  std::string include_hosts;
  std::string exclude_hosts;
  std::string ssh_cmd = "ssh -o BatchMode=yes";
  bool watch_stdin = false;
  std::vector<std::string> launcher_args;
  // Where the values came from, for the start-up line ("slurm" or "flags").
  std::vector<std::string> notes;
  std::vector<std::string> warnings;  // lines printed at start-up as warnings
};

// Result of parsing: either a config, or a request to print help / version.
struct ParseResult {
  enum class Action { kRun, kHelp, kVersion, kPrintCompletion } action = Action::kRun;
  LaunchConfig config;
  std::string help_text;  // --help's text, or --print_completion's script
};

// Parses argv (argv[0] is the launcher) against the launcher's environment. Throws UsageError.
// Does not touch the machine beyond looking up the worker binary (PATH search like execvp).
ParseResult parse_launch_args(int argc, const char* const* argv, const EnvironmentSnapshot& env);

// The completion script of ddp_launch's flags for `shell` (bash, zsh or tcsh; See Note [Shell
// completion]). Throws UsageError for another shell.
std::string completion_script(const std::string& shell);

// "a,b," -> {"a", "b", ""}; "" -> {}.
std::vector<std::string> split_list(const std::string& text, char sep);
// Without leading and trailing spaces and tabs.
std::string trim_blanks(const std::string& text);

// Strict number parsing for flags: the whole text must be the number. Throw UsageError naming flag.
int parse_int_flag(const std::string& flag, const std::string& text, int min, int max);

}  // namespace ddp::launcher::config
