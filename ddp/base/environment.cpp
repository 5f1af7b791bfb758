#include "ddp/base/environment.h"

#include <sys/un.h>

#include <cstdlib>
#include <cstring>
#include <limits>

#include "ddp/base/env_names.h"
#include "ddp/base/error.h"

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
    throw InvalidArgument(str(what, "='", text, "' is not an integer in [", min_value, ", ",
                              max_value, "]"));
  }
  return static_cast<int>(value);
}

namespace {

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

WorkerEnvironment parse_worker_environment(const EnvLookup& env, int rank_override,
                                           int world_size_override) {
  WorkerEnvironment out;
  const bool torchrun_style = env(env::kRank) || env(env::kWorldSize);
  const bool slurm = !torchrun_style && env(env::kSlurmProcId);
  out.source = slurm ? "slurm" : "torchrun";

  auto rank = rank_override >= 0 ? std::optional<int>(rank_override)
                                 : first_int(env, {env::kRank, env::kSlurmProcId}, 0);
  auto world = world_size_override >= 0 ? std::optional<int>(world_size_override)
                                        : first_int(env, {env::kWorldSize, env::kSlurmNtasks}, 1);
  if (!rank) throw InvalidArgument(str("environment variable ", env::kRank, " is not set", kHowToSet));
  if (!world) throw InvalidArgument(str("environment variable ", env::kWorldSize, " is not set", kHowToSet));
  out.rank = *rank;
  out.world_size = *world;
  if (out.world_size < 1) throw InvalidArgument(str(env::kWorldSize, "=", out.world_size, " must be >= 1"));
  if (out.rank >= out.world_size) {
    throw InvalidArgument(str(env::kRank, "=", out.rank, " is not below ", env::kWorldSize, "=", out.world_size));
  }
  // A single-node job without LOCAL_* is its own local world.
  out.local_rank = first_int(env, {env::kLocalRank, env::kSlurmLocalId}, 0).value_or(out.rank);
  out.local_world_size =
      first_int(env, {env::kLocalWorldSize, env::kSlurmNtasksPerNode}, 1).value_or(out.world_size);
  out.group_rank = first_int(env, {env::kGroupRank}, 0).value_or(0);
  out.group_world_size = first_int(env, {env::kGroupWorldSize}, 1).value_or(1);
  out.restart_count = first_int(env, {env::kRestartCount}, 0).value_or(0);
  out.max_restarts = first_int(env, {env::kMaxRestarts}, 0).value_or(0);
  out.run_id = env(env::kRunId).value_or("");

  auto addr = env(env::kMasterAddr);
  if (!addr || addr->empty()) {
    throw InvalidArgument(str("environment variable ", env::kMasterAddr, " is not set", kHowToSet,
                              " (the host name or address of rank 0)"));
  }
  out.master_addr = *addr;
  auto port = env(env::kMasterPort);
  if (!port) {
    throw InvalidArgument(str("environment variable ", env::kMasterPort, " is not set", kHowToSet,
                              " (a free TCP port on rank 0's host)"));
  }
  out.master_port = parse_int(*port, env::kMasterPort, 1, 65535);
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
  out.rank = first_int(env, {env::kRank}, 0).value_or(0);
  return out;
}

}  // namespace ddp
