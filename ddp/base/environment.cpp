#include "ddp/base/environment.h"

#include <sys/un.h>

#include <cstdlib>
#include <limits>

#include "ddp/base/error.h"

namespace ddp {

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
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
  if (auto dir = env("DDP_LOG_DIR"); dir && !dir->empty()) return *dir;
  if (auto file = env("TORCHELASTIC_ERROR_FILE"); file && !file->empty()) {
    const auto slash = file->rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : file->substr(0, slash);
  }
  return "";
}

LaunchEnvironment parse_launch_environment(const EnvLookup& env, int rank_override,
                                           int world_size_override) {
  LaunchEnvironment out;
  const bool torchrun_style = env("RANK") || env("WORLD_SIZE");
  const bool slurm = !torchrun_style && env("SLURM_PROCID");
  out.source = slurm ? "slurm" : "torchrun";

  auto rank = rank_override >= 0 ? std::optional<int>(rank_override)
                                 : first_int(env, {"RANK", "SLURM_PROCID"}, 0);
  auto world = world_size_override >= 0 ? std::optional<int>(world_size_override)
                                        : first_int(env, {"WORLD_SIZE", "SLURM_NTASKS"}, 1);
  if (!rank) throw InvalidArgument(str("environment variable RANK is not set", kHowToSet));
  if (!world) throw InvalidArgument(str("environment variable WORLD_SIZE is not set", kHowToSet));
  out.rank = *rank;
  out.world_size = *world;
  if (out.world_size < 1) throw InvalidArgument(str("WORLD_SIZE=", out.world_size, " must be >= 1"));
  if (out.rank >= out.world_size) {
    throw InvalidArgument(str("RANK=", out.rank, " is not below WORLD_SIZE=", out.world_size));
  }
  // A single-node job without LOCAL_* is its own local world.
  out.local_rank = first_int(env, {"LOCAL_RANK", "SLURM_LOCALID"}, 0).value_or(out.rank);
  out.local_world_size =
      first_int(env, {"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"}, 1).value_or(out.world_size);

  auto addr = env("MASTER_ADDR");
  if (!addr || addr->empty()) {
    throw InvalidArgument(str("environment variable MASTER_ADDR is not set", kHowToSet,
                              " (the host name or address of rank 0)"));
  }
  out.master_addr = *addr;
  auto port = env("MASTER_PORT");
  if (!port) {
    throw InvalidArgument(str("environment variable MASTER_PORT is not set", kHowToSet,
                              " (a free TCP port on rank 0's host)"));
  }
  out.master_port = parse_int(*port, "MASTER_PORT", 1, 65535);
  return out;
}

InitMethod parse_init_method(const std::string& url) {
  InitMethod out;
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(str("init_method '", url, "': ", why,
                               "; use env://, tcp://host:port or file:///absolute/path"));
  };
  if (url == "env://" || url.empty()) return out;
  if (url.rfind("tcp://", 0) == 0) {
    out.kind = InitMethod::Kind::tcp;
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
    out.kind = InitMethod::Kind::file;
    out.path = url.substr(7);
    if (out.path.empty() || out.path.front() != '/') throw bad("the path must be absolute");
    return out;
  }
  throw bad("unknown scheme");
}

std::optional<AgentEnvironment> parse_agent_environment(const EnvLookup& env) {
  auto path = env("DDP_AGENT_SOCKET");
  if (!path || path->empty()) return std::nullopt;
  if (path->front() != '/' || path->size() >= sizeof(sockaddr_un{}.sun_path)) {
    throw InvalidArgument(str("DDP_AGENT_SOCKET='", *path, "' is not an absolute path shorter than ",
                              sizeof(sockaddr_un{}.sun_path), " bytes; unset it, or let ddp_launch set it"));
  }
  AgentEnvironment out;
  out.socket_path = *path;
  out.rank = first_int(env, {"RANK"}, 0).value_or(0);
  return out;
}

}  // namespace ddp
