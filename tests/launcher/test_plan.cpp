// Unit tests of the launcher's plan (launcher/agent/plan.h): the one source of every worker's rank,
// environment, files, console routing and CPUs, for --dry_run and the supervisor alike.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "launcher/config/config.h"
#include "launcher/agent/plan.h"
#include "launcher/rendezvous/rendezvous.h"

using namespace ddp::launcher;
using namespace ddp::launcher::agent;
using namespace ddp::launcher::config;
using namespace ddp::launcher::process;
using namespace ddp::launcher::rendezvous;

namespace {

LaunchConfig config_of(std::vector<std::string> args) {
  std::vector<const char*> argv{"ddp_launch"};
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back("/bin/true");
  return parse_launch_args(static_cast<int>(argv.size()), argv.data(),
                           ddp::EnvironmentSnapshot::from_map({{"PATH", "/usr/bin:/bin"}}))
      .config;
}

std::map<std::string, std::string> env_of(const WorkerLaunch& w) {
  std::map<std::string, std::string> env;
  for (const auto& kv : w.env) env[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  return env;
}

RunContext run_in(const std::string& folder) {
  RunContext run;
  run.inherited = {{"PATH", "/usr/bin"}, {"KEEP", "me"}};
  run.run_folder = folder;
  return run;
}

}  // namespace

TEST_CASE("plan: ranks, world and files of every worker of node 1 of 2, attempt 1", "[launcher][plan]") {
  const LaunchConfig c = config_of({"--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "3", "--master_addr",
                                "10.0.0.1", "--max_restarts", "2", "--log_dir", "/logs", "--run_id", "r"});
  const NodeAssignment node = assignment_from_flags(c, 3);
  LocalWorkers local;
  local.nproc = 3;
  const auto plan = plan_workers(c, node, local, run_in("/logs/r_abcdef"), 1);
  REQUIRE(plan.size() == 3);
  std::set<std::string> dirs;
  for (int lr = 0; lr < 3; ++lr) {
    const WorkerLaunch& w = plan[lr];
    INFO("local rank " << lr);
    CHECK(w.local_rank == lr);
    CHECK(w.rank == 3 + lr);
    const auto env = env_of(w);
    CHECK(env.at("RANK") == std::to_string(3 + lr));
    CHECK(env.at("WORLD_SIZE") == "6");
    CHECK(env.at("GROUP_RANK") == "1");
    CHECK(env.at("MASTER_ADDR") == "10.0.0.1");
    CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "1");
    CHECK(env.at("TORCHELASTIC_MAX_RESTARTS") == "2");
    CHECK(env.at("KEEP") == "me");  // inherited
    CHECK(env.at("OMP_NUM_THREADS") == "1");
    CHECK(w.dir == "/logs/r_abcdef/attempt_1/" + std::to_string(3 + lr));
    CHECK(w.error_file == w.dir + "/error.json");
    CHECK(env.at("TORCHELASTIC_ERROR_FILE") == w.error_file);
    CHECK(env.at("DDP_LOG_DIR") == "/logs/r_abcdef/attempt_1");
    // --log_dir: both streams to files and the console.
    CHECK(w.stdout_log == w.dir + "/stdout.log");
    CHECK(w.stderr_log == w.dir + "/stderr.log");
    CHECK(w.stdout_to_console);
    CHECK(w.stderr_to_console);
    CHECK(w.cpus.empty());
    // What a dry run prints is what the worker gets.
    for (const auto& [key, value] : w.launcher_set) CHECK(env.at(key) == value);
    dirs.insert(w.dir);
  }
  CHECK(dirs.size() == 3);
}

TEST_CASE("plan: the join timeout reaches every worker (--rdzv_conf join_timeout, default 600 s)", "[launcher][plan]") {
  LocalWorkers local;
  local.nproc = 2;
  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--nproc_per_node", "2"}, "600"},
           {{"--nproc_per_node", "2", "--rdzv_conf", "join_timeout=42.5"}, "42.5"},
           {{"--nproc_per_node", "2", "--rdzv_timeout", "7"}, "7"}}) {
    const LaunchConfig c = config_of(args);
    for (const WorkerLaunch& w : plan_workers(c, assignment_from_flags(c, 2), local, run_in("/tmp/x"), 0)) {
      CHECK(env_of(w).at("DDP_JOIN_TIMEOUT") == expected);
    }
  }
}

TEST_CASE("plan: console and file routing follow --redirects, --tee and --local_ranks_filter", "[launcher][plan]") {
  LocalWorkers local;
  local.nproc = 3;
  const LaunchConfig c = config_of({"--nproc_per_node", "3", "--redirects", "0:3,1:1", "--tee", "1:1",
                                "--local_ranks_filter", "0,1"});
  const auto plan = plan_workers(c, assignment_from_flags(c, 3), local, run_in("/tmp/x"), 0);
  REQUIRE(plan.size() == 3);
  // Rank 0: both streams only to files.
  CHECK_FALSE(plan[0].stdout_to_console);
  CHECK_FALSE(plan[0].stderr_to_console);
  CHECK(plan[0].stdout_log == "/tmp/x/attempt_0/0/stdout.log");
  CHECK(plan[0].stderr_log == "/tmp/x/attempt_0/0/stderr.log");
  // Rank 1: stdout redirected and teed back, stderr untouched and not written.
  CHECK(plan[1].stdout_to_console);
  CHECK(plan[1].stderr_to_console);
  CHECK(plan[1].stdout_log == "/tmp/x/attempt_0/1/stdout.log");
  CHECK(plan[1].stderr_log.empty());
  // Rank 2: filtered off the console, no files.
  CHECK_FALSE(plan[2].stdout_to_console);
  CHECK_FALSE(plan[2].stderr_to_console);
  CHECK(plan[2].stdout_log.empty());
  CHECK(env_of(plan[2]).count("DDP_LOG_DIR") == 0);  // no --log_dir
  CHECK(writes_log_files(c, 3));
  CHECK_FALSE(writes_log_files(config_of({"--nproc_per_node", "2"}), 2));
}

TEST_CASE("plan: GPUs, CPUs and the agent socket reach each worker", "[launcher][plan]") {
  const LaunchConfig c = config_of({"--nproc_per_node", "2"});
  LocalWorkers local;
  local.nproc = 2;
  local.gpus = {"3", "5"};
  local.cpu_slices = {{0, 1}, {2, 3, 4}};
  RunContext run = run_in("/r");
  run.agent_socket = "/tmp/agent.sock";
  const auto plan = plan_workers(c, assignment_from_flags(c, 2), local, run, 0);
  REQUIRE(plan.size() == 2);
  for (int lr = 0; lr < 2; ++lr) {
    const auto env = env_of(plan[lr]);
    CHECK(env.at("CUDA_VISIBLE_DEVICES") == local.gpus[lr]);
    CHECK(plan[lr].cpus == local.cpu_slices[lr]);
    CHECK(env.at("OMP_NUM_THREADS") == std::to_string(local.cpu_slices[lr].size()));
    CHECK(env.at("DDP_AGENT_SOCKET") == "/tmp/agent.sock");
  }
}

TEST_CASE("plan: a restart changes only the attempt's restart count and folders", "[launcher][plan]") {
  const LaunchConfig c = config_of({"--nproc_per_node", "2", "--max_restarts", "1"});
  LocalWorkers local;
  local.nproc = 2;
  const auto first = plan_workers(c, assignment_from_flags(c, 2), local, run_in("/r"), 0);
  const auto second = plan_workers(c, assignment_from_flags(c, 2), local, run_in("/r"), 1);
  for (int lr = 0; lr < 2; ++lr) {
    auto a = env_of(first[lr]);
    auto b = env_of(second[lr]);
    CHECK(a.at("TORCHELASTIC_RESTART_COUNT") == "0");
    CHECK(b.at("TORCHELASTIC_RESTART_COUNT") == "1");
    CHECK(first[lr].error_file == "/r/attempt_0/" + std::to_string(lr) + "/error.json");
    CHECK(second[lr].error_file == "/r/attempt_1/" + std::to_string(lr) + "/error.json");
    for (const char* differs : {"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE"}) {
      a.erase(differs);
      b.erase(differs);
    }
    CHECK(a == b);
  }
}

// See Note [Hot spares in ddp_launch] in launcher/agent/plan.cpp.
TEST_CASE("plan: --spares adds spare processes after the workers, and a live restart comes back as a spare",
          "[launcher][plan][spares]") {
  const LaunchConfig c = config_of({"--nnodes", "2:3", "--rdzv_endpoint", "h0:29400", "--nproc_per_node", "2",
                                    "--recovery", "live", "--spares", "1", "--rdzv_id", "job"});
  CHECK(c.spares == 1);
  NodeAssignment node = assignment_from_flags(c, 2);
  node.nnodes = 3;
  node.node_rank = 1;
  node.live_node_key = "node1";
  LocalWorkers local;
  local.nproc = 2;
  local.spares = 1;
  const auto plan = plan_workers(c, node, local, run_in("/r"), 0);
  REQUIRE(plan.size() == 3);
  for (int lr = 0; lr < 2; ++lr) {
    const auto env = env_of(plan[lr]);
    CHECK(env.count("DDP_LIVE_SPARE") == 0);
    CHECK(env.at("RANK") == std::to_string(2 + lr));
    CHECK(env.at("DDP_LIVE_MEMBER") == "node1/local" + std::to_string(lr) + "/attempt0");
  }
  const WorkerLaunch& spare = plan[2];
  const auto env = env_of(spare);
  CHECK(env.at("DDP_LIVE_SPARE") == "1");
  CHECK(env.at("DDP_LIVE_MEMBER") == "node1/local2/attempt0");
  CHECK(env.at("RANK") == "2");  // its node's first worker's: valid torchrun variables, no rank of its own
  CHECK(env.at("LOCAL_RANK") == "0");
  CHECK(env.at("WORLD_SIZE") == "6");
  CHECK(spare.local_rank == 2);
  CHECK(spare.rank == 6 + 1);  // numbered after the world's ranks: node 1's first spare
  CHECK(spare.dir == "/r/attempt_0/7");
  CHECK(env.count("DDP_AGENT_RANK") == 0);  // no heartbeats without the agent socket
  RunContext watched = run_in("/r");
  watched.agent_socket = "/tmp/agent.sock";
  const auto watched_plan = plan_workers(c, node, local, watched, 0);
  CHECK(env_of(watched_plan[2]).at("DDP_AGENT_RANK") == "7");  // its heartbeats say the rank the launcher knows
  CHECK(env_of(watched_plan[0]).count("DDP_AGENT_RANK") == 0);  // a worker's RANK is that rank already
  // A dead worker restarted in a job with spares comes back as a spare (the one that took its place trains on).
  const auto restarted = plan_workers(c, node, local, run_in("/r"), 1, /*respawn=*/true);
  CHECK(env_of(restarted[0]).at("DDP_LIVE_SPARE") == "1");
  CHECK(env_of(restarted[0]).at("DDP_LIVE_MEMBER") == "node1/local0/attempt1");
  // Its files keep its rank's number: each place of the node has folders of its own.
  std::set<std::string> restarted_dirs;
  for (const WorkerLaunch& w : restarted) restarted_dirs.insert(w.dir);
  CHECK(restarted_dirs == std::set<std::string>{"/r/attempt_1/2", "/r/attempt_1/3", "/r/attempt_1/7"});
  local.spares = 0;
  CHECK(env_of(plan_workers(c, node, local, run_in("/r"), 1, /*respawn=*/true)[0]).count("DDP_LIVE_SPARE") == 0);
}
