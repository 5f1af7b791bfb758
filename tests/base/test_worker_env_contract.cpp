// The launcher-worker environment contract (see Note [Worker environment contract] in
// ddp/base/worker_variable_names.h): what launcher/agent/worker_variables.cpp writes, ddp/base/worker_variables.cpp reads back.
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/worker_variables.h"
#include "ddp/base/error.h"
#include "launcher/agent/worker_variables.h"

using ddp::launcher::rendezvous::NodeAssignment;
using ddp::launcher::agent::WorkerSlot;

namespace {

ddp::EnvLookup lookup_of(const std::vector<std::pair<std::string, std::string>>& vars) {
  return ddp::EnvironmentSnapshot::from_map({vars.begin(), vars.end()}).lookup();
}

// "KEY=VALUE" strings (what execve gets) as a lookup.
ddp::EnvLookup lookup_of_strings(const std::vector<std::string>& entries) {
  std::map<std::string, std::string> vars;
  for (const auto& entry : entries) {
    const auto eq = entry.find('=');
    REQUIRE(eq != std::string::npos);
    vars.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return ddp::EnvironmentSnapshot::from_map(std::move(vars)).lookup();
}

}  // namespace

TEST_CASE("what ddp_launch sets, a worker reads back", "[env_contract]") {
  NodeAssignment node;
  node.nnodes = GENERATE(1, 2, 3);
  node.nproc_per_node = GENERATE(1, 4);
  node.node_rank = node.nnodes - 1;
  node.master_addr = "node7.cluster";
  node.master_port = 29400;
  node.run_id = "job42";
  node.max_restarts = 3;
  for (int local_rank = 0; local_rank < node.nproc_per_node; ++local_rank) {
    WorkerSlot slot;
    slot.local_rank = local_rank;
    slot.restart_count = 2;
    slot.error_file = "/runs/job42/attempt_2/" + std::to_string(local_rank) + "/error.json";
    slot.agent_socket = "/tmp/ddp_launch_x/agent.sock";
    slot.log_dir = "/runs/job42/attempt_2";
    const int rank = node.node_rank * node.nproc_per_node + local_rank;
    INFO("nnodes " << node.nnodes << ", nproc " << node.nproc_per_node << ", local rank " << local_rank);

    const auto vars = ddp::launcher::agent::launcher_variables(node, slot);
    const auto inherited = std::map<std::string, std::string>{{"PATH", "/bin"}, {"RANK", "99"}};
    const auto written = ddp::launcher::agent::worker_environment(inherited, node, slot);
    for (const auto& env : {lookup_of(vars), lookup_of_strings(written)}) {
      const ddp::WorkerEnvironment worker = ddp::parse_worker_environment(env);
      CHECK(worker.rank == rank);
      CHECK(worker.world_size == node.nnodes * node.nproc_per_node);
      CHECK(worker.local_rank == local_rank);
      CHECK(worker.local_world_size == node.nproc_per_node);
      CHECK(worker.group_rank == node.node_rank);
      CHECK(worker.group_world_size == node.nnodes);
      CHECK(worker.master_addr == node.master_addr);
      CHECK(worker.master_port == node.master_port);
      CHECK(worker.restart_count == slot.restart_count);
      CHECK(worker.max_restarts == node.max_restarts);
      CHECK(worker.run_id == node.run_id);
      CHECK(worker.source == "torchrun");
      CHECK(ddp::diagnostics_dir(env) == *slot.log_dir);
      const auto agent = ddp::parse_agent_environment(env);
      REQUIRE(agent);
      CHECK(agent->socket_path == *slot.agent_socket);
      CHECK(agent->rank == rank);
      CHECK(env(ddp::env::kErrorFile) == slot.error_file);
    }
  }
}

TEST_CASE("without --log_dir and the agent socket, diagnostics go next to the error file", "[env_contract]") {
  NodeAssignment node;
  WorkerSlot slot;
  slot.error_file = "/tmp/ddp_launch_abc/none/attempt_0/0/error.json";
  const auto env = lookup_of(ddp::launcher::agent::launcher_variables(node, slot));
  CHECK(ddp::diagnostics_dir(env) == "/tmp/ddp_launch_abc/none/attempt_0/0");
  CHECK_FALSE(ddp::parse_agent_environment(env));
}

TEST_CASE("every variable ddp_launch sets is a name of the contract", "[env_contract]") {
  using namespace ddp::env;
  const std::set<std::string> contract = {
      kRank, kLocalRank, kWorldSize, kLocalWorldSize, kGroupRank, kGroupWorldSize, kRoleName, kRoleRank,
      kRoleWorldSize, kMasterAddr, kMasterPort, kRestartCount, kMaxRestarts, kRunId, kErrorFile,
      kAgentSocket, kAgentRank, kLogDir, kCudaVisibleDevices, kCudaDeviceOrder, kOmpNumThreads, kSignalsToHandle,
      kTorchNcclAsyncErrorHandling};
  NodeAssignment node;
  node.nproc_per_node = 2;
  WorkerSlot slot;
  slot.visible_gpu = "1";
  slot.agent_socket = "/tmp/a.sock";
  slot.agent_rank = 9;  // a spare's
  slot.log_dir = "/logs";
  slot.cpus = {0, 1};
  // The heartbeats claim the launcher's rank for the process, not RANK (See Note [Hot spares in ddp_launch]).
  const auto agent = ddp::parse_agent_environment(lookup_of(ddp::launcher::agent::launcher_variables(node, slot)));
  REQUIRE(agent);
  CHECK(agent->rank == 9);
  std::set<std::string> set_names;
  for (const auto& [name, value] : ddp::launcher::agent::launcher_variables(node, slot)) set_names.insert(name);
  for (const auto& entry : ddp::launcher::agent::worker_environment({}, node, slot)) {
    set_names.insert(entry.substr(0, entry.find('=')));
  }
  for (const auto& name : set_names) {
    INFO(name);
    CHECK(contract.count(name) == 1);
  }
  CHECK(set_names.size() == contract.size());  // with a GPU, a socket, a log folder and pinned CPUs: all of them
}

TEST_CASE("a malformed optional variable is named, not ignored", "[env_contract]") {
  std::vector<std::pair<std::string, std::string>> vars = {
      {ddp::env::kRank, "0"}, {ddp::env::kWorldSize, "1"}, {ddp::env::kMasterAddr, "a"}, {ddp::env::kMasterPort, "1"}};
  CHECK_NOTHROW(ddp::parse_worker_environment(lookup_of(vars)));
  vars.emplace_back(ddp::env::kRestartCount, "two");
  CHECK_THROWS_WITH(ddp::parse_worker_environment(lookup_of(vars)),
                    Catch::Contains("TORCHELASTIC_RESTART_COUNT='two'"));
}

TEST_CASE("an environment snapshot looks up what it holds, and its lookup outlives it", "[env_contract]") {
  ddp::EnvLookup lookup;
  {
    const auto snapshot = ddp::EnvironmentSnapshot::from_map({{"A", "1"}, {"EMPTY", ""}});
    CHECK(snapshot.get("A") == "1");
    CHECK_FALSE(snapshot.get("B"));
    lookup = snapshot.lookup();
  }
  CHECK(lookup("A") == "1");
  CHECK(lookup("EMPTY") == "");
  CHECK_FALSE(lookup("B"));
  const auto process = ddp::EnvironmentSnapshot::from_process();
  CHECK(process.get("PATH") == ddp::process_environment()("PATH"));
}

TEST_CASE("tcp:// and file:// workers take their local placement from LOCAL_* when set", "[env_contract]") {
  const auto none = ddp::parse_local_placement(lookup_of({}), 3, 4);
  CHECK(none.local_rank == 3);
  CHECK(none.local_world_size == 4);
  const auto set = ddp::parse_local_placement(lookup_of({{ddp::env::kLocalRank, "1"}, {ddp::env::kLocalWorldSize, "2"}}), 3, 4);
  CHECK(set.local_rank == 1);
  CHECK(set.local_world_size == 2);
  CHECK_THROWS_WITH(ddp::parse_local_placement(lookup_of({{ddp::env::kLocalWorldSize, "0"}}), 0, 1),
                    Catch::Contains("LOCAL_WORLD_SIZE='0'"));
  // A local rank outside the node's count is refused (found by fuzz_environment), from either parser.
  CHECK_THROWS_WITH(ddp::parse_local_placement(lookup_of({{ddp::env::kLocalRank, "1"}, {ddp::env::kLocalWorldSize, "1"}}), 0, 2),
                    Catch::Contains("LOCAL_RANK=1 is not below the local world size 1 (LOCAL_WORLD_SIZE"));
  CHECK_THROWS_WITH(ddp::parse_local_placement(lookup_of({{ddp::env::kLocalWorldSize, "2"}}), 3, 4),
                    Catch::Contains("LOCAL_RANK=3 is not below the local world size 2"));
  CHECK_THROWS_WITH(ddp::parse_worker_environment(lookup_of({{ddp::env::kRank, "0"}, {ddp::env::kWorldSize, "2"},
                                                             {ddp::env::kLocalRank, "2"}, {ddp::env::kLocalWorldSize, "2"},
                                                             {ddp::env::kMasterAddr, "127.0.0.1"}, {ddp::env::kMasterPort, "29500"}})),
                    Catch::Contains("LOCAL_RANK=2 is not below the local world size 2"));
  // A value's control bytes are quoted: the error is one line.
  CHECK_THROWS_WITH(ddp::parse_local_placement(lookup_of({{ddp::env::kLocalRank, "1\n2"}}), 0, 4),
                    Catch::Equals("LOCAL_RANK='1\\x0a2' is not an integer in [0, 1048576]"));
  CHECK_FALSE(ddp::parse_omp_num_threads(lookup_of({})));
  CHECK(ddp::parse_omp_num_threads(lookup_of({{ddp::env::kOmpNumThreads, "8"}})) == 8);
  CHECK_THROWS_WITH(ddp::parse_omp_num_threads(lookup_of({{ddp::env::kOmpNumThreads, "many"}})),
                    Catch::Contains("OMP_NUM_THREADS='many'"));
}
