#pragma once
// The launch environment of a training process, parsed and validated in one place.
// Torch-free, so that it is cheap to compile and to unit-test.
#include <functional>
#include <optional>
#include <string>

namespace ddp {

// Looks up one environment variable; nullopt when it is not set. Tests pass a map instead of the
// process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The real process environment (std::getenv).
EnvLookup process_environment();

// What a launcher (ddp_launch, torchrun, srun) told this process.
struct LaunchEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  // "torchrun" when RANK/WORLD_SIZE were set, "slurm" when they came from SLURM_PROCID/SLURM_NTASKS.
  std::string source;
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, falling back to
// SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE for the first four.
// Throws ddp::InvalidArgument naming the missing or malformed variable.
// rank_override / world_size_override (>= 0) replace RANK / WORLD_SIZE (explicit arguments win).
LaunchEnvironment parse_launch_environment(const EnvLookup& env, int rank_override = -1,
                                           int world_size_override = -1);

// The folder a rank writes diagnostics to (its collectives-rank<R>.json on a collective's failure):
// DDP_LOG_DIR (set by ddp_launch --log_dir to the attempt's folder), else the folder of
// TORCHELASTIC_ERROR_FILE (torchrun, or ddp_launch without --log_dir), else "" (nowhere).
std::string diagnostics_dir(const EnvLookup& env);

// A parsed init_method URL.
struct InitMethod {
  enum class Kind { env, tcp, file };
  Kind kind = Kind::env;
  std::string host;  // tcp
  int port = 0;      // tcp
  std::string path;  // file
};

// Parses "env://", "tcp://host:port" (IPv6 as "tcp://[::1]:port") or "file:///absolute/path".
// Throws ddp::InvalidArgument for anything else.
InitMethod parse_init_method(const std::string& url);

// Where heartbeats go (see Note [Agent channel] in ddp/agent_channel.h): DDP_AGENT_SOCKET, set by
// ddp_launch with --hang_timeout or --metrics_port, and this process's RANK (0 when unset).
struct AgentEnvironment {
  std::string socket_path;
  int rank = 0;
};

// nullopt when DDP_AGENT_SOCKET is unset or empty: no launcher listens, reporting is a no-op.
// Throws ddp::InvalidArgument when the path cannot be a Unix socket address (too long, not
// absolute) or RANK is malformed.
std::optional<AgentEnvironment> parse_agent_environment(const EnvLookup& env);

// Parses a whole decimal integer in [min_value, max_value]; `what` names the value in the error.
int parse_int(const std::string& text, const std::string& what, int min_value, int max_value);

}  // namespace ddp
