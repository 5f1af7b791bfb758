#pragma once
// The environment of a process, read in one way (EnvLookup), and the worker side of the
// launcher-worker contract: what a launcher told this process, parsed and validated in one place.
// The variable names are in ddp/base/worker_variable_names.h (see Note [Worker environment contract]).
// Torch-free, so that it is cheap to compile and to unit-test.
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace ddp {

// Looks up one environment variable; nullopt when it is not set. The one way this project reads
// its environment: the process's (process_environment), or a snapshot (EnvironmentSnapshot, which
// the launcher takes once and tests build from a map).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The real process environment (std::getenv).
EnvLookup process_environment();

// A copy of a set of environment variables: ddp_launch reads environ once into one (everything it
// reads comes from there, and `vars` is what its workers inherit); tests build one from a map.
struct EnvironmentSnapshot {
  std::map<std::string, std::string> vars;

  static EnvironmentSnapshot from_process();  // reads environ
  static EnvironmentSnapshot from_map(std::map<std::string, std::string> vars);

  std::optional<std::string> get(const std::string& name) const;
  // An EnvLookup over a copy of `vars` (it does not refer to this snapshot).
  EnvLookup lookup() const;
};

// Where this process's rank and world size came from. See Note [Launch sources] in worker_variables.cpp.
enum class LaunchSource {
  kLauncher,  // RANK/WORLD_SIZE: ddp_launch, torchrun, a PyTorchJob, or set by hand
  kSlurm,     // SLURM_PROCID/SLURM_NTASKS: srun started the binary
  kOpenMpi,   // OMPI_COMM_WORLD_*: OpenMPI's mpirun
  kPmi,       // PMI_RANK/PMI_SIZE: MPICH's or Intel MPI's mpiexec
  kNone,      // nothing: a world of size 1
};
// "torchrun", "slurm", "openmpi", "pmi", "none".
const char* launch_source_name(LaunchSource source);

// What a launcher (ddp_launch, torchrun, srun, mpirun) told this worker.
struct WorkerEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;  // 0 only with LaunchSource::kNone and no MASTER_PORT: no TCP store needed
  LaunchSource launch_source = LaunchSource::kNone;
  std::string source;  // launch_source_name(launch_source)
  // One line saying which variables gave rank, size and master (logged once by init_process_group).
  std::string description;
  // The node (GROUP_RANK, GROUP_WORLD_SIZE; 0 and 1 when unset) and the attempt
  // (TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS: 0 when unset; TORCHELASTIC_RUN_ID).
  int group_rank = 0;
  int group_world_size = 1;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
};

// Reads the launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), else Slurm's, OpenMPI's or PMI's (See Note [Launch sources]), and the optional GROUP_*
// and TORCHELASTIC_* variables. None at all: rank 0 of a world of size 1.
// Throws ddp::InvalidArgument naming the missing, malformed or conflicting variables.
// rank_override / world_size_override (>= 0) replace the rank / world size (explicit arguments win).
WorkerEnvironment parse_worker_environment(const EnvLookup& env, int rank_override = -1,
                                           int world_size_override = -1);

// Note [Slurm default port]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Under Slurm, without MASTER_PORT / --master_port, every node of a job must agree on a port without
// talking to each other, and two jobs sharing a node should not collide: port = 10000 + SLURM_JOB_ID
// % 50000 (always in 10000..59999; collisions need two jobs whose ids differ by a multiple of 50000 on
// the same first node). ddp_launch under srun and a binary started by srun directly use the same.
int slurm_default_port(long long job_id);

// Where a worker sits on its node when the init method names rank and world size explicitly
// (tcp://, file://): LOCAL_RANK / LOCAL_WORLD_SIZE when set, else the whole world is local.
struct LocalPlacement {
  int local_rank = 0;
  int local_world_size = 1;
};
LocalPlacement parse_local_placement(const EnvLookup& env, int rank, int world_size);

// OMP_NUM_THREADS, when set (1..4096); nullopt when unset. Throws ddp::InvalidArgument when malformed.
std::optional<int> parse_omp_num_threads(const EnvLookup& env);

// The folder a rank writes diagnostics to (its collectives-rank<R>.json on a collective's failure):
// DDP_LOG_DIR (set by ddp_launch --log_dir to the attempt's folder), else the folder of
// TORCHELASTIC_ERROR_FILE (torchrun, or ddp_launch without --log_dir), else "" (nowhere).
std::string diagnostics_dir(const EnvLookup& env);

// A parsed init_method URL.
struct InitMethod {
  enum class Kind { kEnv, kTcp, kFile };
  Kind kind = Kind::kEnv;
  std::string host;  // tcp
  int port = 0;      // tcp
  std::string path;  // file
};

// Parses "env://", "tcp://host:port" (IPv6 as "tcp://[::1]:port") or "file:///absolute/path".
// Throws ddp::InvalidArgument for anything else.
InitMethod parse_init_method(const std::string& url);

// Where heartbeats go (see Note [Agent channel] in ddp/base/agent_message.h): DDP_AGENT_SOCKET, set by
// ddp_launch with --hang_timeout or --metrics_port, and the rank the launcher knows this process by:
// DDP_AGENT_RANK (a hot spare's), else RANK (0 when unset).
struct AgentEnvironment {
  std::string socket_path;
  int rank = 0;
};

// nullopt when DDP_AGENT_SOCKET is unset or empty: no launcher listens, reporting is a no-op.
// Throws ddp::InvalidArgument when the path cannot be a Unix socket address (too long, not
// absolute) or RANK is malformed.
std::optional<AgentEnvironment> parse_agent_environment(const EnvLookup& env);

// ddp_launch --recovery live (See Note [Live recovery with ddp_launch] in launcher/agent/live_recovery.cpp):
// where the job's membership lives.
struct LiveRecoveryEnvironment {
  std::string store_host;  // the rendezvous store (DDP_LIVE_STORE "HOST:PORT")
  int store_port = 0;
  std::string prefix;     // the job's keys in it (DDP_LIVE_PREFIX)
  std::string member_id;  // this process's member id (DDP_LIVE_MEMBER)
  bool spare = false;     // a hot spare (DDP_LIVE_SPARE=1)
};
// nullopt when DDP_LIVE_STORE is unset (the job was not started with --recovery live). Throws
// ddp::InvalidArgument naming the variable when one is malformed or missing.
std::optional<LiveRecoveryEnvironment> parse_live_recovery_environment(const EnvLookup& env);

// Parses a whole decimal integer in [min_value, max_value]; `what` names the value in the error.
int parse_int(const std::string& text, const std::string& what, int min_value, int max_value);

}  // namespace ddp
