// The fuzz entries of what the launcher and a worker read from outside as text or bytes: hostfiles and
// --hosts/--include/--exclude, .ddp_env, --rdzv_conf, the environment (the launcher's flags' variables
// and a worker's contract), the agent socket's datagrams, the rendezvous store's values. Torch-free:
// the libFuzzer targets link ddp_launcher_core, not LibTorch. See Note [Fuzz inputs].
#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "ddp/base/agent_message.h"
#include "ddp/base/error.h"
#include "ddp/base/worker_variables.h"
#include "launcher/channel/job_channel.h"
#include "launcher/config/config.h"
#include "launcher/hosts/hostfile.h"
#include "launcher/rendezvous/records.h"
#include "launcher/rendezvous/rounds.h"
#include "tests/fuzz/fuzz_entries.h"

namespace fs = std::filesystem;

namespace ddp::fuzz {
namespace {

void check(bool ok, const char* what) {
  if (!ok) throw std::logic_error(std::string("invariant broken: ") + what);
}

std::string text_of(const uint8_t* data, size_t size, size_t from = 0) {
  return from >= size ? std::string() : std::string(reinterpret_cast<const char*>(data) + from, size - from);
}

// Runs `parse`; a ddp::Error (UsageError included) is a rejection of one line, anything else escapes.
template <class F>
Outcome guarded(F&& parse) {
  try {
    parse();
    return {true, ""};
  } catch (const ddp::Error& e) {
    return rejected(e);
  }
}

void check_hosts(const std::vector<launcher::hosts::HostSlots>& hosts) {
  std::vector<std::string> names;
  for (const auto& h : hosts) {
    check(!h.host.empty() && h.slots >= 1, "a host has a name and at least one slot");
    check(!h.local_ranks.empty() && std::is_sorted(h.local_ranks.begin(), h.local_ranks.end()) &&
              std::adjacent_find(h.local_ranks.begin(), h.local_ranks.end()) == h.local_ranks.end() &&
              h.local_ranks.front() >= 0 && h.local_ranks.back() < h.slots,
          "a host's slots are ascending, distinct, within 0..slots-1");
    names.push_back(h.host);
  }
  std::sort(names.begin(), names.end());
  check(std::adjacent_find(names.begin(), names.end()) == names.end(), "no host is listed twice");
}

// "a\nb\nc" -> up to `n` parts split at the first n-1 newlines.
std::vector<std::string> split_lines(const std::string& text, size_t n) {
  std::vector<std::string> parts;
  size_t from = 0;
  while (parts.size() + 1 < n) {
    const size_t nl = text.find('\n', from);
    if (nl == std::string::npos) break;
    parts.push_back(text.substr(from, nl - from));
    from = nl + 1;
  }
  parts.push_back(text.substr(std::min(from, text.size())));
  while (parts.size() < n) parts.emplace_back();
  return parts;
}

EnvironmentSnapshot environment_of(const std::string& text) {
  std::map<std::string, std::string> vars{{"PATH", "/usr/bin:/bin"}};
  size_t from = 0;
  while (from <= text.size()) {
    size_t nl = text.find('\n', from);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(from, nl - from);
    const size_t eq = line.find('=');
    if (eq != std::string::npos && eq > 0 && line.find('\0') == std::string::npos) vars[line.substr(0, eq)] = line.substr(eq + 1);
    from = nl + 1;
  }
  return EnvironmentSnapshot::from_map(std::move(vars));
}

launcher::config::LaunchConfig parse_args(std::vector<std::string> args, const EnvironmentSnapshot& env) {
  std::vector<const char*> argv{"ddp_launch"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return launcher::config::parse_launch_args(static_cast<int>(argv.size()), argv.data(), env).config;
}

const launcher::rendezvous::Token& fuzz_token() {
  static const launcher::rendezvous::Token token("fuzz-secret");
  return token;
}

}  // namespace

Outcome hostfile_entry(const uint8_t* data, size_t size, const fs::path&) {
  if (size == 0) return {false, "empty input"};
  const std::string text = text_of(data, size, 1);
  return guarded([&] {
    switch (data[0] % 3) {
      case 0:
        check_hosts(launcher::hosts::parse_hostfile(text, "fuzz-hostfile"));
        break;
      case 1:
        check_hosts(launcher::hosts::parse_hosts_list(text));
        break;
      default: {  // hosts list, --include, --exclude: one per line
        const std::vector<std::string> parts = split_lines(text, 3);
        check_hosts(launcher::hosts::select_hosts(launcher::hosts::parse_hosts_list(parts[0]), parts[1], parts[2]));
      }
    }
  });
}

Outcome ddp_env_entry(const uint8_t* data, size_t size, const fs::path&) {
  const std::string text = text_of(data, size);
  return guarded([&] {
    for (const auto& [name, value] : launcher::hosts::parse_env_file(text, "fuzz.ddp_env")) {
      check(launcher::hosts::is_env_name(name), ".ddp_env names are variable names");
      check(value.find('\n') == std::string::npos, "a .ddp_env value is one line");
    }
  });
}

Outcome rdzv_conf_entry(const uint8_t* data, size_t size, const fs::path&) {
  const std::string text = text_of(data, size);
  if (text.find('\0') != std::string::npos) return {false, "a command-line argument holds no NUL"};
  return guarded([&] {
    parse_args({"--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:29400", "--rdzv_conf", text,
                "/bin/true"},
               environment_of(""));
  });
}

Outcome environment_entry(const uint8_t* data, size_t size, const fs::path&) {
  // NAME=VALUE lines: the launcher's view (torchrun's PET_* and TORCHELASTIC_* variables, Slurm's),
  // then a worker's (RANK, WORLD_SIZE, MASTER_*, LOCAL_*, the agent and live recovery variables).
  const EnvironmentSnapshot env = environment_of(text_of(data, size));
  const Outcome launcher_side = guarded([&] { parse_args({"/bin/true"}, env); });
  const Outcome worker_side = guarded([&] {
    const EnvLookup lookup = env.lookup();
    const WorkerEnvironment w = parse_worker_environment(lookup);
    check(w.rank >= 0 && w.rank < w.world_size, "0 <= rank < world size");
    check(w.local_rank >= 0 && w.local_rank < w.local_world_size, "0 <= local rank < local world size (contract)");
    const LocalPlacement local = parse_local_placement(lookup, w.rank, w.world_size);
    check(local.local_rank >= 0 && local.local_rank < local.local_world_size, "0 <= local rank < local world size");
    parse_omp_num_threads(lookup);
    parse_agent_environment(lookup);
    parse_live_recovery_environment(lookup);
  });
  if (!launcher_side.parsed && !worker_side.parsed) return {false, launcher_side.error + " | " + worker_side.error};
  return {true, ""};
}

Outcome agent_datagram_entry(const uint8_t* data, size_t size, const fs::path&) {
  const std::optional<AgentMessage> message = decode_agent_message(data, size);
  if (!message) return {false, "not an agent message"};
  check(size == kAgentMessageBytes, "only datagrams of kAgentMessageBytes decode");
  unsigned char again[kAgentMessageBytes];
  encode_agent_message(*message, again);
  // The round trip gives the same bytes, but for the 2 pad bytes after the flags.
  check(std::memcmp(again, data, 6) == 0 && std::memcmp(again + 8, data + 8, kAgentMessageBytes - 8) == 0,
        "encoding a decoded message gives its bytes back");
  return {true, ""};
}

Outcome store_values_entry(const uint8_t* data, size_t size, const fs::path&) {
  if (size == 0) return {false, "empty input"};
  namespace rdzv = launcher::rendezvous;
  const std::string value = text_of(data, size, 1);
  std::string error;
  switch (data[0] % 5) {
    case 0: {  // the master record
      const auto master = rdzv::parse_master_record(fuzz_token(), "fuzzjob", value, error);
      if (!master) return rejected(std::runtime_error(error));
      check(!master->addr.empty() && master->port >= 1 && master->port <= 65535, "a master has an address and a port");
      return {true, ""};
    }
    case 1: {  // a closed round's members
      const auto members = rdzv::parse_closed_record(fuzz_token(), "fuzzjob", 3, 8, value, error);
      if (!members) return rejected(std::runtime_error(error));
      check(std::is_sorted(members->begin(), members->end()) &&
                std::adjacent_find(members->begin(), members->end()) == members->end() &&
                (members->empty() || (members->front() >= 0 && members->back() < 8)),
            "closed members are ascending, distinct slots below max_nodes");
      return {true, ""};
    }
    case 2: {  // a slot's claim
      const bool valid = rdzv::is_valid_claim(fuzz_token(), "fuzzjob", 4, 1, value);
      return {valid, valid ? "" : "not a claim of this job"};
    }
    case 3: {  // the member list inside a closed record
      std::vector<int> slots;
      if (!rdzv::parse_members(value, 8, slots)) return {false, "not a member list"};
      check(std::is_sorted(slots.begin(), slots.end()) && slots.size() <= 8 &&
                std::adjacent_find(slots.begin(), slots.end()) == slots.end(),
            "a member list is ascending and distinct, at most max_nodes");
      check(rdzv::format_members(slots) == value, "a member list reads back as written");
      return {true, ""};
    }
    default: {  // a number on the job channel
      const std::optional<int> n = launcher::channel::parse_line_int(value);
      return {n.has_value(), n ? "" : "not a number"};
    }
  }
}

// Seeds: valid inputs of every mode.
void write_launcher_seeds(const fs::path& corpus) {
  namespace rdzv = launcher::rendezvous;
  const auto seed = [&](const std::string& target, const std::string& name, const std::string& content) {
    fs::create_directories(corpus / target);
    write_file(corpus / target / name, reinterpret_cast<const uint8_t*>(content.data()), content.size());
  };
  seed("hostfile", "hostfile", std::string(1, '\0') + "# two hosts\nnode1 slots=4\nnode2 slots=2\n\nnode3\n");
  seed("hostfile", "hosts-list", std::string(1, '\1') + "node1:4,node2:2,node3");
  seed("hostfile", "include", std::string(1, '\2') + "node1:4,node2:2\nnode1:0,2@node2");
  seed("hostfile", "exclude", std::string(1, '\2') + "node1:4,node2:2\n\nnode1:1");
  seed("ddp_env", "two", "# forwarded\nNCCL_DEBUG=INFO\nPYTHONPATH=/opt/lib:/srv\n");
  seed("ddp_env", "empty-value", "OMP_NUM_THREADS=\n\n");
  seed("rdzv_conf", "timeouts", "join_timeout=30,last_call_timeout=2");
  seed("rdzv_conf", "keep_alive", "keep_alive_interval=1,keep_alive_max_attempt=5,read_timeout=60");
  seed("environment", "torchrun-worker",
       "RANK=1\nWORLD_SIZE=2\nLOCAL_RANK=1\nLOCAL_WORLD_SIZE=2\nMASTER_ADDR=127.0.0.1\nMASTER_PORT=29500\n"
       "GROUP_RANK=0\nROLE_RANK=1\nTORCHELASTIC_RESTART_COUNT=0\nOMP_NUM_THREADS=2\n");
  seed("environment", "pet-and-slurm",
       "PET_NPROC_PER_NODE=2\nPET_MAX_RESTARTS=1\nPET_RDZV_CONF=join_timeout=5\nSLURM_JOB_NODELIST=node[01-04,7]\n"
       "SLURM_NODEID=1\nSLURM_NNODES=5\nRANK=0\nWORLD_SIZE=1\n");
  AgentMessage m;
  m.flags = AgentMessage::kHasStep | AgentMessage::kHasLoss;
  m.rank = 3;
  m.pid = 4242;
  m.step = 17;
  m.step_time_s = 0.25;
  m.wait_time_s = 0.125;
  m.loss = 1.5;
  m.timestamp_s = 1.7e9;
  unsigned char bytes[kAgentMessageBytes];
  encode_agent_message(m, bytes);
  seed("agent_datagram", "heartbeat", std::string(reinterpret_cast<const char*>(bytes), sizeof bytes));
  m.flags = AgentMessage::kHasSamples;
  m.samples = 1 << 20;
  encode_agent_message(m, bytes);
  seed("agent_datagram", "samples", std::string(reinterpret_cast<const char*>(bytes), sizeof bytes));
  seed("store_values", "master", std::string(1, '\0') + rdzv::make_master_record(fuzz_token(), "fuzzjob", {"10.0.0.1", 29500}));
  seed("store_values", "closed", std::string(1, '\1') + rdzv::make_closed_record(fuzz_token(), "fuzzjob", 3, {0, 2, 5}));
  seed("store_values", "claim",
       std::string(1, '\2') + rdzv::make_claim(fuzz_token(), "fuzzjob", 4, 1, "00112233445566778899aabbccddeeff"));
  seed("store_values", "members", std::string(1, '\3') + "0,1,3");
  seed("store_values", "number", std::string(1, '\4') + "29501");
}

}  // namespace ddp::fuzz
