#include "ddp/base/worker_variables.h"

#include "ddp/base/printable.h"

#include <sys/un.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/error.h"
#include "ddp/base/detail/hostlist.h"

extern char** environ;

namespace ddp {

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

EnvironmentSnapshot EnvironmentSnapshot::from_process() {
  EnvironmentSnapshot snapshot;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const char* eq = std::strchr(*entry, '=');
    if (eq == nullptr) continue;
    snapshot.vars.emplace(std::string(*entry, static_cast<std::size_t>(eq - *entry)), std::string(eq + 1));
  }
  return snapshot;
}

EnvironmentSnapshot EnvironmentSnapshot::from_map(std::map<std::string, std::string> vars) {
  EnvironmentSnapshot snapshot;
  snapshot.vars = std::move(vars);
  return snapshot;
}

std::optional<std::string> EnvironmentSnapshot::get(const std::string& name) const {
  auto it = vars.find(name);
  if (it == vars.end()) return std::nullopt;
  return it->second;
}

EnvLookup EnvironmentSnapshot::lookup() const {
  return [snapshot = *this](const std::string& name) { return snapshot.get(name); };
}

int parse_int(const std::string& text, const std::string& what, int min_value, int max_value) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < min_value || value > max_value) {
    throw InvalidArgument(str(what, "='", printable(text), "' is not an integer in [", min_value, ", ",
                              max_value, "]"));
  }
  return static_cast<int>(value);
}

namespace {

// A local rank outside its node's count (LOCAL_RANK=1 with LOCAL_WORLD_SIZE=1, found by
// fuzz_environment) would pick a GPU or a CPU share that is not there: the variables disagree.
void check_local_rank(int local_rank, const char* rank_name, int local_world_size, const char* size_name) {
  if (local_rank >= local_world_size) {
    throw InvalidArgument(str(rank_name, "=", local_rank, " is not below the local world size ", local_world_size, " (",
                              size_name, ", or ", env::kWorldSize, " when unset): set both, with ", rank_name,
                              " in 0..", size_name, "-1"));
  }
}

constexpr int kMaxInt = std::numeric_limits<int>::max();
constexpr const char* kHowToSet =
    ": start the program with ddp_launch (or torchrun), or set it yourself";

// First variable of `names` that is set, parsed as an integer; nullopt when none is set.
std::optional<int> first_int(const EnvLookup& env, std::initializer_list<const char*> names,
                             int min_value) {
  for (const char* name : names) {
    if (auto value = env(name)) return parse_int(*value, name, min_value, kMaxInt);
  }
  return std::nullopt;
}

}  // namespace

std::string diagnostics_dir(const EnvLookup& env) {
  if (auto dir = env(env::kLogDir); dir && !dir->empty()) return *dir;
  if (auto file = env(env::kErrorFile); file && !file->empty()) {
    const auto slash = file->rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : file->substr(0, slash);
  }
  return "";
}

std::optional<LiveRecoveryEnvironment> parse_live_recovery_environment(const EnvLookup& env) {
  const auto store = env(env::kLiveStore);
  if (!store) return std::nullopt;
  LiveRecoveryEnvironment out;
  const auto colon = store->rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw InvalidArgument(str(env::kLiveStore, "='", *store, "' is not HOST:PORT"));
  }
  out.store_host = store->substr(0, colon);
  if (out.store_host.size() > 2 && out.store_host.front() == '[' && out.store_host.back() == ']') {
    out.store_host = out.store_host.substr(1, out.store_host.size() - 2);  // [IPv6]
  }
  out.store_port = parse_int(store->substr(colon + 1), env::kLiveStore, 1, 65535);
  for (auto [name, value] : {std::pair{env::kLivePrefix, &out.prefix}, std::pair{env::kLiveMember, &out.member_id}}) {
    const auto text = env(name);
    if (!text || text->empty() || text->find('\n') != std::string::npos) {
      throw InvalidArgument(str(name, " must be one non-empty line when ", env::kLiveStore, " is set"));
    }
    *value = *text;
  }
  if (const auto spare = env(env::kLiveSpare)) {
    if (*spare != "0" && *spare != "1") throw InvalidArgument(str(env::kLiveSpare, "='", printable(*spare), "' must be 0 or 1"));
    out.spare = *spare == "1";
  }
  return out;
}

// Note [Launch sources]
// ~~~~~~~~~~~~~~~~~~~~~
// The same binary runs under ddp_launch or torchrun (RANK, WORLD_SIZE, ...), started directly by
// srun (SLURM_PROCID, SLURM_NTASKS, ...), by OpenMPI's mpirun (OMPI_COMM_WORLD_*), by MPICH's or Intel
// MPI's mpiexec (PMI_RANK, PMI_SIZE), or alone (nothing: a world of size 1, so a serial run needs no
// launcher). Schedulers nest, so several sources can be present at once, and which one describes
// this process follows from who started whom:
// - an agent (ddp_launch, torchrun: RANK/WORLD_SIZE with TORCHELASTIC_RUN_ID) is the process's
//   parent; the scheduler variables it inherited describe the agent itself (ddp_launch under srun
//   sees SLURM_PROCID = its node), so the agent's win and the others are not looked at;
// - an MPI launcher started inside a Slurm allocation starts its daemons with srun, so its ranks
//   inherit the daemon's SLURM_PROCID: MPI's variables win over Slurm's;
// - any other pair that is present must agree on rank and world size: RANK/WORLD_SIZE set by hand
//   (or by a PyTorchJob) next to Slurm's or MPI's, or OpenMPI's next to PMI's. Disagreeing, one of
//   them is stale (a RANK exported in the shell and copied to every rank by `mpirun -x`, say), and
//   guessing would start a job in which two processes claim the same rank: an error names both.
// A partial set (RANK without WORLD_SIZE) is an error, never a world of size 1. Slurm's variables
// count only in an srun task (SLURM_STEP_ID set): the batch script itself has SLURM_PROCID=0 and the
// allocation's SLURM_NTASKS, so a binary run there without srun would wait for ranks that never come.
namespace {

struct SourceReading {
  LaunchSource source = LaunchSource::kNone;
  const char* rank_name = "";
  const char* size_name = "";
  int rank = 0;
  int size = 1;
};

// The rank and size one source gives, nullopt when neither variable is set. Throws when only one is.
std::optional<SourceReading> read_source(const EnvLookup& env, LaunchSource source, const char* rank_name,
                                         const char* size_name) {
  const auto rank = env(rank_name);
  const auto size = env(size_name);
  if (!rank && !size) return std::nullopt;
  if (!rank || !size) {
    const char* missing = rank ? size_name : rank_name;
    throw InvalidArgument(str("environment variable ", missing, " is not set but ", rank ? rank_name : size_name,
                              " is", kHowToSet, " (a partial set is never taken for a world of size 1)"));
  }
  SourceReading reading{source, rank_name, size_name, parse_int(*rank, rank_name, 0, kMaxInt),
                        parse_int(*size, size_name, 1, kMaxInt)};
  if (reading.rank >= reading.size) {
    throw InvalidArgument(str(rank_name, "=", reading.rank, " is not below ", size_name, "=", reading.size));
  }
  return reading;
}

std::string describe(const SourceReading& r) {
  return str(r.rank_name, "=", r.rank, ", ", r.size_name, "=", r.size);
}

// Both present: they must agree (See Note [Launch sources]).
void check_agree(const std::optional<SourceReading>& a, const std::optional<SourceReading>& b) {
  if (!a || !b || (a->rank == b->rank && a->size == b->size)) return;
  throw InvalidArgument(str("conflicting launch sources: ", launch_source_name(a->source), " says ", describe(*a),
                            " but ", launch_source_name(b->source), " says ", describe(*b),
                            "; unset the stale ones (e.g. a RANK exported in the shell)"));
}

// "2(x3),1" (SLURM_TASKS_PER_NODE) at node `node`: the tasks of that node; nullopt when malformed.
std::optional<int> tasks_on_node(const std::string& text, int node) {
  int first = 0;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::size_t paren = item.find("(x");
    int tasks = 0;
    int repeat = 1;
    try {
      tasks = parse_int(item.substr(0, paren), env::kSlurmTasksPerNode, 1, kMaxInt);
      if (paren != std::string::npos) {
        if (item.back() != ')') return std::nullopt;
        repeat = parse_int(item.substr(paren + 2, item.size() - paren - 3), env::kSlurmTasksPerNode, 1, kMaxInt);
      }
    } catch (const InvalidArgument&) {
      return std::nullopt;
    }
    if (node < first + repeat) return tasks;
    first += repeat;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return std::nullopt;
}

}  // namespace

const char* launch_source_name(LaunchSource source) {
  switch (source) {
    case LaunchSource::kLauncher: return "torchrun";
    case LaunchSource::kSlurm: return "slurm";
    case LaunchSource::kOpenMpi: return "openmpi";
    case LaunchSource::kPmi: return "pmi";
    case LaunchSource::kNone: return "none";
  }
  return "none";
}

int slurm_default_port(long long job_id) { return static_cast<int>(10000 + job_id % 50000); }

WorkerEnvironment parse_worker_environment(const EnvLookup& env, int rank_override,
                                           int world_size_override) {
  WorkerEnvironment out;
  const auto launcher = read_source(env, LaunchSource::kLauncher, env::kRank, env::kWorldSize);
  const bool agent = launcher && env(env::kRunId).has_value();
  std::optional<SourceReading> chosen = launcher;
  if (!agent) {  // See Note [Launch sources]
    // A batch script (no srun step) sees the allocation's SLURM_NTASKS and SLURM_PROCID=0: not its own.
    const auto slurm = env(env::kSlurmStepId)
                           ? read_source(env, LaunchSource::kSlurm, env::kSlurmProcId, env::kSlurmNtasks)
                           : std::nullopt;
    const auto ompi = read_source(env, LaunchSource::kOpenMpi, env::kOmpiRank, env::kOmpiSize);
    const auto pmi = read_source(env, LaunchSource::kPmi, env::kPmiRank, env::kPmiSize);
    check_agree(ompi, pmi);
    const auto scheduler = ompi ? ompi : pmi ? pmi : slurm;
    check_agree(launcher, scheduler);
    if (!chosen) chosen = scheduler;
  }
  out.launch_source = chosen ? chosen->source : LaunchSource::kNone;
  out.source = launch_source_name(out.launch_source);
  out.rank = rank_override >= 0 ? rank_override : chosen ? chosen->rank : 0;
  out.world_size = world_size_override >= 0 ? world_size_override : chosen ? chosen->size : 1;
  if (out.world_size < 1) throw InvalidArgument(str(env::kWorldSize, "=", out.world_size, " must be >= 1"));
  if (out.rank >= out.world_size) {
    throw InvalidArgument(str(env::kRank, "=", out.rank, " is not below ", env::kWorldSize, "=", out.world_size));
  }

  // Where the process sits on its node; a source without local variables is its own node.
  using Names = std::pair<const char*, const char*>;  // the local rank's and the local size's variable
  static const std::map<LaunchSource, Names> kLocalNames = {
      {LaunchSource::kSlurm, {env::kSlurmLocalId, env::kSlurmNtasksPerNode}},
      {LaunchSource::kOpenMpi, {env::kOmpiLocalRank, env::kOmpiLocalSize}},
      {LaunchSource::kPmi, {env::kMpiLocalRankId, env::kMpiLocalNranks}}};
  const auto names = kLocalNames.find(out.launch_source);
  const auto [local_rank_name, local_size_name] =
      names != kLocalNames.end() ? names->second : Names{env::kLocalRank, env::kLocalWorldSize};
  out.local_rank = first_int(env, {local_rank_name}, 0).value_or(out.rank);
  out.local_world_size = first_int(env, {local_size_name}, 1).value_or(out.world_size);
  check_local_rank(out.local_rank, local_rank_name, out.local_world_size, local_size_name);
  out.group_rank = first_int(env, {env::kGroupRank}, 0).value_or(0);
  out.group_world_size = first_int(env, {env::kGroupWorldSize}, 1).value_or(1);
  if (out.launch_source == LaunchSource::kSlurm) {
    out.group_rank = first_int(env, {env::kSlurmNodeId}, 0).value_or(0);
    out.group_world_size = first_int(env, {env::kSlurmNnodes}, 1).value_or(1);
    if (!env(env::kSlurmNtasksPerNode)) {
      const auto per_node = env(env::kSlurmTasksPerNode);
      const auto tasks = per_node ? tasks_on_node(*per_node, out.group_rank) : std::nullopt;
      out.local_world_size = tasks.value_or(out.local_world_size);
    }
  }
  out.restart_count = first_int(env, {env::kRestartCount}, 0).value_or(0);
  out.max_restarts = first_int(env, {env::kMaxRestarts}, 0).value_or(0);
  out.run_id = env(env::kRunId).value_or("");

  // The master: MASTER_ADDR/MASTER_PORT; under Slurm, else the first node and the job's port; alone,
  // nothing is needed (no TCP store).
  std::string addr_from = env::kMasterAddr;
  std::string port_from = env::kMasterPort;
  auto addr = env(env::kMasterAddr);
  auto port = env(env::kMasterPort);
  if ((!addr || addr->empty()) && out.launch_source == LaunchSource::kSlurm) {
    if (auto nodelist = env(env::kSlurmJobNodelist); nodelist && !nodelist->empty()) {
      addr = detail::expand_hostlist(*nodelist).front();
      addr_from = str("the first host of ", env::kSlurmJobNodelist);
    }
  }
  if (!port && out.launch_source == LaunchSource::kSlurm) {
    if (auto job = env(env::kSlurmJobId)) {
      port = std::to_string(slurm_default_port(parse_int(*job, env::kSlurmJobId, 0, kMaxInt)));
      port_from = str(env::kSlurmJobId, " (10000 + id % 50000)");
    }
  }
  const bool mpi = out.launch_source == LaunchSource::kOpenMpi || out.launch_source == LaunchSource::kPmi;
  const std::string how = mpi ? " (pass it to every rank: mpirun -x MASTER_ADDR=HOST -x MASTER_PORT=PORT)" : "";
  if (out.launch_source == LaunchSource::kNone && out.world_size == 1) {
    out.master_addr = addr && !addr->empty() ? *addr : "127.0.0.1";
    out.master_port = port ? parse_int(*port, env::kMasterPort, 1, 65535) : 0;
    out.description = "no launcher variables (RANK/WORLD_SIZE, Slurm's, MPI's): running alone, a world of size 1";
    return out;
  }
  if (!addr || addr->empty()) {
    throw InvalidArgument(str("environment variable ", env::kMasterAddr, " is not set", kHowToSet,
                              " (the host name or address of rank 0)", how));
  }
  out.master_addr = *addr;
  if (!port) {
    throw InvalidArgument(str("environment variable ", env::kMasterPort, " is not set", kHowToSet,
                              " (a free TCP port on rank 0's host)", how));
  }
  out.master_port = parse_int(*port, env::kMasterPort, 1, 65535);
  const std::string from = chosen ? str(launch_source_name(out.launch_source), " (", describe(*chosen), ")")
                                  : std::string("InitOptions::rank and InitOptions::world_size");
  out.description = str("rank ", out.rank, " of ", out.world_size, " from ", from, ", master ", out.master_addr, ":",
                        out.master_port, " from ", addr_from, " and ", port_from);
  return out;
}

LocalPlacement parse_local_placement(const EnvLookup& env, int rank, int world_size) {
  LocalPlacement out;
  out.local_rank = rank;
  out.local_world_size = world_size;
  if (auto value = env(env::kLocalRank)) out.local_rank = parse_int(*value, env::kLocalRank, 0, 1 << 20);
  if (auto value = env(env::kLocalWorldSize)) {
    out.local_world_size = parse_int(*value, env::kLocalWorldSize, 1, 1 << 20);
  }
  check_local_rank(out.local_rank, env::kLocalRank, out.local_world_size, env::kLocalWorldSize);
  return out;
}

std::optional<int> parse_omp_num_threads(const EnvLookup& env) {
  if (auto value = env(env::kOmpNumThreads)) return parse_int(*value, env::kOmpNumThreads, 1, 4096);
  return std::nullopt;
}

InitMethod parse_init_method(const std::string& url) {
  InitMethod out;
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(str("init_method '", url, "': ", why,
                               "; use env://, tcp://host:port or file:///absolute/path"));
  };
  if (url == "env://" || url.empty()) return out;
  if (url.rfind("tcp://", 0) == 0) {
    out.kind = InitMethod::Kind::kTcp;
    const std::string rest = url.substr(6);
    std::size_t colon = std::string::npos;
    if (!rest.empty() && rest.front() == '[') {  // [ipv6]:port
      const auto close = rest.find(']');
      if (close == std::string::npos) throw bad("unterminated '['");
      out.host = rest.substr(1, close - 1);
      colon = close + 1;
      if (colon >= rest.size() || rest[colon] != ':') throw bad("missing ':port'");
    } else {
      colon = rest.rfind(':');
      if (colon == std::string::npos) throw bad("missing ':port'");
      out.host = rest.substr(0, colon);
    }
    if (out.host.empty()) throw bad("missing host");
    out.port = parse_int(rest.substr(colon + 1), "port of init_method", 1, 65535);
    return out;
  }
  if (url.rfind("file://", 0) == 0) {
    out.kind = InitMethod::Kind::kFile;
    out.path = url.substr(7);
    if (out.path.empty() || out.path.front() != '/') throw bad("the path must be absolute");
    return out;
  }
  throw bad("unknown scheme");
}

std::optional<AgentEnvironment> parse_agent_environment(const EnvLookup& env) {
  auto path = env(env::kAgentSocket);
  if (!path || path->empty()) return std::nullopt;
  if (path->front() != '/' || path->size() >= sizeof(sockaddr_un{}.sun_path)) {
    throw InvalidArgument(str(env::kAgentSocket, "='", *path, "' is not an absolute path shorter than ",
                              sizeof(sockaddr_un{}.sun_path), " bytes; unset it, or let ddp_launch set it"));
  }
  AgentEnvironment out;
  out.socket_path = *path;
  out.rank = first_int(env, {env::kAgentRank, env::kRank}, 0).value_or(0);
  return out;
}

}  // namespace ddp
