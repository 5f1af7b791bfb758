// Process tests: the real ddp_launch binary starting launch_test_worker (no LibTorch).
#include <arpa/inet.h>
#include <dlfcn.h>
#include <sched.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "ddp/base/error.h"
#include "ddp/base/str.h"
#include "launcher/process/net.h"
#include "launcher/process/spawn.h"
#include "launcher/resources/resources.h"
#include "launcher/agent/supervisor.h"
#include "tests/launcher/config_support.h"
#include "tests/launcher/process_harness.h"

using namespace ddp::launcher;
using namespace ddp::launcher::agent;
using namespace ddp::launcher::process;
using namespace ddp::launcher::resources;
using namespace ddp::launcher::testing;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> with_worker(std::vector<std::string> launcher_args, const std::vector<std::string>& worker_args) {
  launcher_args.push_back(worker_path());
  launcher_args.insert(launcher_args.end(), worker_args.begin(), worker_args.end());
  return launcher_args;
}

std::string record_path(const TempDir& dir, int rank, int attempt = 0) {
  return dir.path() + "/rank" + std::to_string(rank) + ".attempt" + std::to_string(attempt);
}

// The pids the workers of attempt 0 recorded.
std::vector<int> recorded_pids(const TempDir& dir, int nworkers) {
  std::vector<int> pids;
  for (int rank = 0; rank < nworkers; ++rank) pids.push_back(read_record(record_path(dir, rank)).pid);
  return pids;
}

// Starts one ddp_launch per node at once and waits for all of them.
std::vector<LaunchOutcome> run_nodes(const std::vector<std::vector<std::string>>& per_node_args,
                                     std::chrono::milliseconds timeout) {
  std::vector<std::unique_ptr<Child>> nodes;
  for (const auto& args : per_node_args) {
    std::vector<std::string> argv{launcher_path()};
    argv.insert(argv.end(), args.begin(), args.end());
    nodes.push_back(std::make_unique<Child>(argv, std::map<std::string, std::string>{{"DDP_TEST_PASSTHROUGH", "kept as is"}}));
  }
  std::vector<LaunchOutcome> outcomes;
  for (auto& node : nodes) {
    auto outcome = node->wait(timeout);
    REQUIRE(outcome);
    outcomes.push_back(*outcome);
  }
  return outcomes;
}

void check_worker_env(const TempDir& dir, int nnodes, int nproc, const std::string& run_id) {
  const int world = nnodes * nproc;
  std::set<std::string> error_files;
  std::set<std::string> ports;
  std::set<std::string> group_of_rank0;
  for (int rank = 0; rank < world; ++rank) {
    INFO("rank " << rank << " of " << nnodes << "x" << nproc);
    REQUIRE(wait_for_files(dir.path(), "rank" + std::to_string(rank) + ".", 1, 5s));
    const auto r = read_record(record_path(dir, rank));
    const int node = std::stoi(r.env.at("GROUP_RANK"));
    CHECK(r.env.at("RANK") == std::to_string(rank));
    CHECK(r.env.at("LOCAL_RANK") == std::to_string(rank - node * nproc));
    CHECK(r.env.at("WORLD_SIZE") == std::to_string(world));
    CHECK(r.env.at("LOCAL_WORLD_SIZE") == std::to_string(nproc));
    CHECK(r.env.at("GROUP_WORLD_SIZE") == std::to_string(nnodes));
    CHECK(rank / nproc == node);
    CHECK(r.env.at("ROLE_RANK") == std::to_string(rank));
    CHECK(r.env.at("ROLE_WORLD_SIZE") == std::to_string(world));
    CHECK(r.env.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(r.env.at("MASTER_PORT") != "0");
    ports.insert(r.env.at("MASTER_PORT"));
    CHECK(r.env.at("TORCHELASTIC_RESTART_COUNT") == "0");
    CHECK(r.env.at("TORCHELASTIC_MAX_RESTARTS") == "1");
    CHECK(r.env.at("TORCHELASTIC_RUN_ID") == run_id);
    CHECK(r.env.at("TORCHELASTIC_ERROR_FILE").front() == '/');
    error_files.insert(r.env.at("TORCHELASTIC_ERROR_FILE"));
    if (nproc > 1) {
      CHECK(r.env.at("OMP_NUM_THREADS") == "1");
    } else {
      CHECK(r.env.count("OMP_NUM_THREADS") == 0);
    }
    CHECK(r.env.at("DDP_TEST_PASSTHROUGH") == "kept as is");
    CHECK(r.argv == std::vector<std::string>{worker_path(), "--out", dir.path(), "two words", "--nnodes", "7"});
  }
  CHECK(static_cast<int>(error_files.size()) == world);  // one error file per worker
  CHECK(ports.size() == 1);
}

}  // namespace

TEST_CASE("every variable reaches the workers, static rendezvous, nnodes x nproc", "[process][env]") {
  for (auto [nnodes, nproc] : std::vector<std::pair<int, int>>{{1, 1}, {1, 3}, {2, 2}, {3, 1}}) {
    INFO(nnodes << " nodes x " << nproc << " workers");
    TempDir dir;
    const int port = nnodes == 1 ? 0 : pick_free_port("127.0.0.1");
    std::vector<std::vector<std::string>> nodes;
    for (int node = 0; node < nnodes; ++node) {
      nodes.push_back(with_worker({"--nnodes", std::to_string(nnodes), "--node_rank", std::to_string(node),
                                   "--nproc_per_node", std::to_string(nproc), "--master_addr", "127.0.0.1",
                                   "--master_port", std::to_string(port), "--max_restarts", "1"},
                                  {"--out", dir.path(), "two words", "--nnodes", "7"}));
    }
    for (const auto& outcome : run_nodes(nodes, 20s)) {
      CHECK(outcome.exit_code == 0);
      CHECK(count_of(outcome.err, "OMP_NUM_THREADS=1") == (nproc > 1 ? 1u : 0u));
    }
    check_worker_env(dir, nnodes, nproc, "none");
  }
}

TEST_CASE("dynamic rendezvous: launchers get node ranks from the c10d store", "[process][rdzv]") {
  for (auto [nnodes, nproc] : std::vector<std::pair<int, int>>{{2, 2}, {3, 1}}) {
    INFO(nnodes << " nodes x " << nproc << " workers");
    TempDir dir;
    const std::string port = std::to_string(pick_free_port("127.0.0.1"));
    std::vector<std::vector<std::string>> nodes;
    for (int node = 0; node < nnodes; ++node) {
      nodes.push_back(with_worker({"--nnodes", std::to_string(nnodes), "--nproc_per_node", std::to_string(nproc),
                                   "--rdzv_endpoint", "127.0.0.1:" + port, "--rdzv_id", "job42", "--rdzv_timeout",
                                   "30", "--max_restarts", "1"},
                                  {"--out", dir.path(), "two words", "--nnodes", "7"}));
    }
    for (const auto& outcome : run_nodes(nodes, 60s)) {
      INFO(outcome.err);
      CHECK(outcome.exit_code == 0);
    }
    check_worker_env(dir, nnodes, nproc, "job42");
    CHECK(read_record(record_path(dir, 0)).env.at("MASTER_PORT") != port);  // the workers' own port
  }
}

TEST_CASE("a rendezvous that cannot complete fails after --rdzv_timeout, naming what it waited for",
          "[process][rdzv]") {
  TempDir dir;
  const std::string endpoint = "127.0.0.1:" + std::to_string(pick_free_port("127.0.0.1"));
  const auto outcome = run_launcher(with_worker({"--nnodes", "2", "--nproc_per_node", "1", "--rdzv_endpoint", endpoint,
                                                 "--rdzv_id", "lonely", "--rdzv_timeout", "1.5"},
                                                {"--out", dir.path()}),
                                    {}, 30s);
  INFO(outcome.err);
  CHECK(outcome.exit_code == 1);
  CHECK_THAT(outcome.err, Catch::Contains("1 of 2 nodes joined"));
  CHECK_THAT(outcome.err, Catch::Contains(endpoint));
  CHECK_THAT(outcome.err, Catch::Contains("'lonely'"));
  CHECK(list_dir(dir.path()).empty());  // no worker started
}

TEST_CASE("a rendezvous endpoint with no route from here: one line naming what was tried, exit 2",
          "[process][rdzv]") {
  TempDir dir;
  const auto outcome = run_launcher(with_worker({"--nnodes", "2", "--nproc_per_node", "1", "--rdzv_endpoint",
                                                 "no-such-host.invalid:29400", "--rdzv_timeout", "30"},
                                                {"--out", dir.path()}),
                                    {}, 30s);
  INFO(outcome.err);
  CHECK(outcome.exit_code == ddp::kUsageExitCode);
  CHECK_THAT(outcome.err, Catch::Contains("tried the route to --rdzv_endpoint host no-such-host.invalid") &&
                              Catch::Contains("does not resolve") && Catch::Contains("give --rdzv_endpoint as"));
  CHECK(std::count(outcome.err.begin(), outcome.err.end(), '\n') == 2);  // "waiting for 2 nodes", the error
  CHECK_THAT(outcome.err, Catch::Contains("ddp_launch: error: no address to advertise"));
  CHECK(list_dir(dir.path()).empty());
}

TEST_CASE("a node beyond --nnodes is refused at rendezvous", "[process][rdzv]") {
  TempDir dir;
  const std::string endpoint = "127.0.0.1:" + std::to_string(pick_free_port("127.0.0.1"));
  auto node_args = [&](const std::string& sleep) {
    return with_worker({launcher_path(), "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_endpoint", endpoint,
                        "--rdzv_id", "full", "--rdzv_timeout", "20"},
                       {"--out", dir.path(), "--sleep", sleep});
  };
  // The job must still be running when the extra node arrives: its workers sleep long enough for a
  // slow start of the extra launcher (several seconds under ASan on a loaded machine).
  Child first(node_args("*:8"));
  Child second(node_args("*:8"));
  REQUIRE(wait_for_files(dir.path(), "rank", 2, 20s));  // both joined and started their workers
  const std::vector<std::string> extra_args = node_args("*:0");
  const auto extra = run_launcher({extra_args.begin() + 1, extra_args.end()}, {}, 30s);
  INFO(extra.err);
  CHECK(extra.exit_code == 1);
  CHECK_THAT(extra.err, Catch::Contains("already has all 2 nodes"));
  REQUIRE(first.wait(20s));
  REQUIRE(second.wait(20s));
  CHECK(first.wait(0ms)->exit_code == 0);
  CHECK(second.wait(0ms)->exit_code == 0);
  CHECK(list_dir(dir.path()).size() == 2);  // the extra node started no worker
}

TEST_CASE("a worker exits 3: the launcher exits 3, siblings are stopped, summary names the root cause",
          "[process][failure]") {
  TempDir dir;
  const auto outcome = run_launcher(
      with_worker({"--nproc_per_node", "3", "--master_port", "0", "--shutdown_grace", "5"},
                  {"--out", dir.path(), "--sleep", "0:60", "--sleep", "2:60", "--sleep", "1:0.3", "--exit", "1:3",
                   "--error-message", "1:boom from rank one"}),
      {}, 30s);
  INFO(outcome.err);
  CHECK(outcome.exit_code == 3);
  // SIGTERM stopped the sleepers within the grace period: no SIGKILL was needed.
  CHECK(outcome.seconds < 5);
  CHECK(outcome.err.find("sending SIGKILL") == std::string::npos);
  CHECK_THAT(outcome.err, Catch::Contains("rank 0 (local_rank: 0): exitcode SIGTERM"));
  CHECK_THAT(outcome.err, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(outcome.err, Catch::Contains("exitcode  : 3"));
  CHECK_THAT(outcome.err, Catch::Contains("message   : boom from rank one"));
  CHECK_THAT(outcome.err, Catch::Contains("host      : " + this_host_name()));
  CHECK_THAT(outcome.err, Catch::Contains("error.json"));
  CHECK(wait_gone(recorded_pids(dir, 3), 1s).empty());
}

TEST_CASE("siblings that ignore SIGTERM get SIGKILL after --shutdown_grace", "[process][failure]") {
  TempDir dir;
  const auto outcome = run_launcher(
      with_worker({"--nproc_per_node", "3", "--master_port", "0", "--shutdown_grace", "1"},
                  {"--out", dir.path(), "--ignore-sigterm", "--sleep", "0:60", "--sleep", "2:60", "--sleep", "1:0.5",
                   "--exit", "1:3"}),
      {}, 30s);
  INFO(outcome.err);
  CHECK(outcome.exit_code == 3);
  CHECK(outcome.seconds >= 1.0);  // the grace period was granted ...
  CHECK(outcome.seconds < 8);     // ... and then SIGKILL ended it
  CHECK_THAT(outcome.err, Catch::Contains("grace period: sending SIGKILL"));
  CHECK_THAT(outcome.err, Catch::Contains("message   : <the worker wrote no error file"));
  CHECK(wait_gone(recorded_pids(dir, 3), 1s).empty());
}

TEST_CASE("a worker killed by a signal: exit code 128+N and the signal's name", "[process][failure]") {
  TempDir dir;
  const auto outcome = run_launcher(with_worker({"--nproc_per_node", "2", "--master_port", "0", "--shutdown_grace", "2"},
                                                {"--out", dir.path(), "--sleep", "1:60", "--signal", "0:9"}),
                                    {}, 30s);
  INFO(outcome.err);
  CHECK(outcome.exit_code == 128 + 9);
  CHECK_THAT(outcome.err, Catch::Contains("exitcode  : SIGKILL (signal 9, exit code 137)"));
  CHECK_THAT(outcome.err, Catch::Contains("rank      : 0"));
}

TEST_CASE("the launcher killed with SIGKILL leaves no worker alive", "[process][signals]") {
  TempDir dir;
  // --log_dir inside the test's folder: a launcher killed with SIGKILL cannot remove its own folder.
  Child launcher(with_worker({launcher_path(), "--nproc_per_node", "3", "--master_port", "0", "--log_dir",
                              dir.path() + "/logs"},
                             {"--out", dir.path(), "--sleep", "*:60"}));
  REQUIRE(wait_for_files(dir.path(), "rank", 3, 10s));
  const std::vector<int> pids = recorded_pids(dir, 3);
  for (int pid : pids) CHECK(process_alive(pid));
  launcher.signal(SIGKILL);
  REQUIRE(launcher.wait(5s));
  CHECK(wait_gone(pids, 5s).empty());  // PR_SET_PDEATHSIG took them down
}

TEST_CASE("SIGTERM, SIGINT, SIGHUP, SIGQUIT to the launcher are forwarded to every worker", "[process][signals]") {
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) {
    INFO("signal " << sig);
    TempDir dir;
    Child launcher(with_worker({launcher_path(), "--nproc_per_node", "2", "--master_port", "0", "--shutdown_grace", "5"},
                               {"--out", dir.path(), "--mark-sigterm", "--sleep", "*:60"}));
    REQUIRE(wait_for_files(dir.path(), "rank", 2, 10s));
    launcher.signal(sig);
    const auto outcome = launcher.wait(10s);
    REQUIRE(outcome);
    CHECK(outcome->exit_code == 128 + sig);
    if (sig == SIGTERM) {
      // The workers' handler saw SIGTERM and exited 0 (it writes sigterm<rank>).
      CHECK(wait_for_files(dir.path(), "sigterm", 2, 1s));
      CHECK_THAT(outcome->err, Catch::Contains("received SIGTERM: forwarding it to 2 workers"));
    } else {
      CHECK_THAT(outcome->err, Catch::Contains("received " + process::signal_name(sig) + ": forwarding it to 2 workers"));
    }
    CHECK(wait_gone(recorded_pids(dir, 2), 2s).empty());
  }
}

TEST_CASE("SIGTERM during a failed group's --shutdown_grace: the failed worker's exit code", "[process][signals]") {
  // See Note [A signal during a failed stop] in launcher/agent/attempt.cpp. Rank 0 ignores SIGTERM,
  // so the stop after rank 1's failure lasts the whole grace (8 s), within which the launcher's own
  // SIGTERM comes (the signal does not shorten it, as in torchrun).
  TempDir dir;
  Child launcher(with_worker({launcher_path(), "--nproc_per_node", "2", "--master_port", "0", "--shutdown_grace", "8"},
                             {"--out", dir.path(), "--ignore-sigterm", "--sleep", "0:60", "--exit", "1:3"}));
  REQUIRE(launcher.wait_for_err("a worker failed: sending SIGTERM", 20s));
  launcher.signal(SIGTERM);
  const auto outcome = launcher.wait(20s);
  REQUIRE(outcome);
  INFO(outcome->err);
  CHECK(outcome->exit_code == 3);
  CHECK_THAT(outcome->err, Catch::Contains("worker group FAILED (launcher received SIGTERM)"));
  CHECK_THAT(outcome->err, Catch::Contains("rank      : 1"));
  CHECK(wait_gone(recorded_pids(dir, 2), 2s).empty());
}

TEST_CASE("--signals_to_handle forwards SIGUSR1 (Slurm's requeue signal) to every worker", "[process][signals]") {
  TempDir dir;
  Child launcher(with_worker({launcher_path(), "--nproc_per_node", "2", "--master_port", "0", "--shutdown_grace", "5",
                              "--signals_to_handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"},
                             {"--out", dir.path(), "--sleep", "*:60"}));
  REQUIRE(wait_for_files(dir.path(), "rank", 2, 10s));
  launcher.signal(SIGUSR1);
  const auto outcome = launcher.wait(10s);
  REQUIRE(outcome);
  INFO(outcome->err);
  CHECK(outcome->exit_code == 128 + SIGUSR1);
  CHECK_THAT(outcome->err, Catch::Contains("received SIGUSR1: forwarding it to 2 workers"));
  CHECK(wait_gone(recorded_pids(dir, 2), 2s).empty());
}

TEST_CASE("restarts: the group restarts with TORCHELASTIC_RESTART_COUNT raised, up to --max_restarts",
          "[process][restart]") {
  {
    TempDir dir;
    const auto outcome = run_launcher(with_worker({"--nproc_per_node", "2", "--master_port", "0", "--max_restarts", "2",
                                                   "--shutdown_grace", "2"},
                                                  {"--out", dir.path(), "--sleep", "0:0.3", "--exit", "0:5", "--fail-attempts", "1"}),
                                      {}, 30s);
    INFO(outcome.err);
    CHECK(outcome.exit_code == 0);
    CHECK_THAT(outcome.err, Catch::Contains("restart 1 of 2"));
    for (int rank = 0; rank < 2; ++rank) {
      CHECK(read_record(record_path(dir, rank, 0)).env.at("TORCHELASTIC_RESTART_COUNT") == "0");
      const auto second = read_record(record_path(dir, rank, 1));
      CHECK(second.env.at("TORCHELASTIC_RESTART_COUNT") == "1");
      CHECK(second.env.at("TORCHELASTIC_MAX_RESTARTS") == "2");
    }
    CHECK_FALSE(wait_for_files(dir.path(), "rank0.attempt2", 1, 0ms));
  }
  {
    TempDir dir;
    const auto outcome = run_launcher(with_worker({"--nproc_per_node", "1", "--master_port", "0", "--max_restarts", "1",
                                                   "--monitor_interval", "0.05"},
                                                  {"--out", dir.path(), "--exit", "0:4"}),
                                      {}, 30s);
    CHECK(outcome.exit_code == 4);
    CHECK_THAT(outcome.err, Catch::Contains("FAILED after 2 attempts"));
    CHECK(list_dir(dir.path()) == std::vector<std::string>{"rank0.attempt0", "rank0.attempt1"});
  }
}

TEST_CASE("console lines carry the rank prefix; --log_dir layout; --redirects and --tee", "[process][logs]") {
  TempDir dir;
  const std::string logs = dir.path() + "/logs";
  const auto outcome = run_launcher(
      with_worker({"--nproc_per_node", "2", "--master_port", "0", "--log_dir", logs, "--run_id", "myrun",
                   "--max_restarts", "1"},
                  {"--print", "out line", "--eprint", "err line", "--print-partial", "tail", "--sleep", "1:0.3", "--exit", "1:1",
                   "--fail-attempts", "1", "--error-message", "1:first attempt fails"}),
      {}, 30s);
  INFO(outcome.out << outcome.err);
  CHECK(outcome.exit_code == 0);
  CHECK(list_dir(logs).size() == 1);
  const std::string run = run_folder(logs, "myrun");
  CHECK(list_dir(run) == std::vector<std::string>{"attempt_0", "attempt_1"});
  for (int attempt : {0, 1}) {
    const std::string a = run + "/attempt_" + std::to_string(attempt);
    CHECK(list_dir(a) == std::vector<std::string>{"0", "1"});
    for (int rank : {0, 1}) {
      const std::string d = a + "/" + std::to_string(rank);
      CHECK(read_text(d + "/stdout.log") == "out line\ntail");
      CHECK(read_text(d + "/stderr.log") == "err line\n");
    }
  }
  CHECK(list_dir(run + "/attempt_0/1") == std::vector<std::string>{"error.json", "stderr.log", "stdout.log"});
  CHECK_THAT(read_text(run + "/attempt_0/1/error.json"), Catch::Contains("first attempt fails"));
  // Without redirects the console shows every line once per attempt, prefixed, partial lines flushed.
  CHECK(count_of(outcome.out, "[rank 0]: out line\n") == 2);
  CHECK(count_of(outcome.out, "[rank 1]: tail\n") == 2);
  CHECK(count_of(outcome.err, "[rank 1]: err line\n") == 2);

  SECTION("--redirects 3 keeps the console clean, --tee 1 brings stdout back") {
    const auto quiet = run_launcher(with_worker({"--nproc_per_node", "2", "--master_port", "0", "--log_dir", logs,
                                                 "--run_id", "quiet", "--redirects", "3"},
                                                {"--print", "out line", "--eprint", "err line"}));
    CHECK(quiet.exit_code == 0);
    CHECK(quiet.out.find("[rank") == std::string::npos);
    CHECK(quiet.err.find("[rank") == std::string::npos);
    CHECK(read_text(run_folder(logs, "quiet") + "/attempt_0/1/stdout.log") == "out line\n");
    const auto teed = run_launcher(with_worker({"--nproc_per_node", "2", "--master_port", "0", "--log_dir", logs,
                                                "--run_id", "teed", "--redirects", "3", "--tee", "1"},
                                               {"--print", "out line", "--eprint", "err line"}));
    CHECK(count_of(teed.out, "out line") == 2);
    CHECK(teed.err.find("[rank") == std::string::npos);
    // Per-rank map: only local rank 0's streams are redirected.
    const auto mixed = run_launcher(with_worker({"--nproc_per_node", "2", "--master_port", "0", "--log_dir", logs,
                                                 "--run_id", "mixed", "--redirects", "0:3"},
                                                {"--print", "out line"}));
    CHECK(mixed.out == "[rank 1]: out line\n");
  }
}

TEST_CASE("--duplicate_stdout_filters copies matching tee'd lines to filtered_stdout.log", "[process][logs]") {
  TempDir dir;
  const std::string logs = dir.path() + "/logs";
  const auto outcome = run_launcher(with_worker({"--nproc_per_node", "2", "--master_port", "0", "--log_dir", logs, "--tee",
                                                 "0:1", "--duplicate-stdout-filters", "apple,or,,ange"},
                                                {"--print", "an apple", "--print", "a pear", "--print", "or,ange juice"}));
  INFO(outcome.err);
  CHECK(outcome.exit_code == 0);
  const auto runs = list_dir(logs);
  REQUIRE(runs.size() == 1);
  const std::string filtered = read_text(logs + "/" + runs[0] + "/attempt_0/filtered_stdout.log");
  // As torchrun's: only the tee'd streams (local rank 0's stdout) are read; ",," is a comma.
  CHECK(filtered == "[rank 0]: an apple\n[rank 0]: or,ange juice\n");
}

TEST_CASE("--local_ranks_filter shows only the chosen ranks", "[process][logs]") {
  const auto outcome = run_launcher(with_worker({"--nproc_per_node", "3", "--master_port", "0", "--local_ranks_filter", "0,2"},
                                                {"--print", "hello", "--eprint", "oops"}));
  CHECK(outcome.exit_code == 0);
  CHECK(count_of(outcome.out, "[rank 0]: hello\n") == 1);
  CHECK(count_of(outcome.out, "[rank 2]: hello\n") == 1);
  CHECK(outcome.out.find("[rank 1]") == std::string::npos);
  CHECK(outcome.err.find("[rank 1]") == std::string::npos);
  CHECK(count_of(outcome.err, "[rank 2]: oops\n") == 1);
}

TEST_CASE("--ranks_filter 0,8-15 of 16 workers shows exactly those global ranks", "[process][logs]") {
  const auto outcome = run_launcher(with_worker({"--nproc_per_node", "16", "--master_port", "0", "--ranks_filter",
                                                 "0,8-15"},
                                                {"--print", "hello"}),
                                    {}, 60s);
  CHECK(outcome.exit_code == 0);
  for (int rank = 0; rank < 16; ++rank) {
    INFO("rank " << rank);
    CHECK(count_of(outcome.out, "[rank " + std::to_string(rank) + "]: hello\n") == (rank == 0 || rank >= 8 ? 1u : 0u));
  }
  // With --local_ranks_filter both apply; a range that ends before it starts is one line, exit 2.
  const auto both = run_launcher(with_worker({"--nproc_per_node", "4", "--master_port", "0", "--ranks_filter", "1-3",
                                              "--local_ranks_filter", "0,1"},
                                             {"--print", "hello"}));
  CHECK(both.out == "[rank 1]: hello\n");
  const auto backwards = run_launcher(with_worker({"--ranks_filter", "3-1"}, {}));
  CHECK(backwards.exit_code == 2);
  CHECK_THAT(backwards.err, Catch::Contains("--ranks_filter: range 3-1 ends before it starts; write 1-3"));
  CHECK(count_lines(backwards.err) == 1);
}

TEST_CASE("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE and --log_line_prefix_template set the console prefix",
          "[process][logs]") {
  const auto from_env = run_launcher(with_worker({"--nproc_per_node", "2", "--master_port", "0", "--role", "trainer"},
                                                 {"--print", "hello", "--eprint", "oops"}),
                                     {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}${local_rank}|$rank]:"}});
  CHECK(from_env.exit_code == 0);
  CHECK(count_of(from_env.out, "[trainer0|0]:hello\n") == 1);
  CHECK(count_of(from_env.out, "[trainer1|1]:hello\n") == 1);
  CHECK(count_of(from_env.err, "[trainer1|1]:oops\n") == 1);
  CHECK(from_env.out.find("[rank ") == std::string::npos);
  // The flag wins over the variable; ${hostname} is this machine's name.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const auto from_flag = run_launcher(with_worker({"--nproc_per_node", "1", "--master_port", "0",
                                                   "--log_line_prefix_template", "<${hostname} ${rank}> "},
                                                  {"--print", "hello"}),
                                      {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${rank}]:"}});
  CHECK(from_flag.out == std::string("<") + host + " 0> hello\n");
}

TEST_CASE("--collapse_lines with 16 workers: one line for what all print alike, the rest per rank",
          "[process][logs]") {
  const auto outcome = run_launcher(with_worker({"--nproc_per_node", "16", "--master_port", "0", "--collapse_lines", "20"},
                                                {"--print", "epoch 1", "--print-ranked", "loss of", "--eprint", "oops"}),
                                    {}, 60s);
  CHECK(outcome.exit_code == 0);
  CHECK(count_of(outcome.out, "[ranks 0-15]: epoch 1\n") == 1);
  CHECK(outcome.out.find("[rank 3]: epoch 1") == std::string::npos);
  CHECK(count_of(outcome.err, "[ranks 0-15]: oops\n") == 1);
  for (int rank = 0; rank < 16; ++rank) {  // the differing lines keep their rank, after the shared line
    INFO("rank " << rank);
    const std::string own = "[rank " + std::to_string(rank) + "]: loss of " + std::to_string(rank) + "\n";
    CHECK(count_of(outcome.out, own) == 1);
    CHECK(outcome.out.find(own) > outcome.out.find("epoch 1"));
  }
  CHECK(count_lines(outcome.out) == 17);
  const auto too_long = run_launcher(with_worker({"--collapse_lines", "61"}, {}));
  CHECK(too_long.exit_code == 2);
  CHECK_THAT(too_long.err, Catch::Contains("--collapse_lines 61: at most 60 seconds"));
  CHECK(count_lines(too_long.err) == 1);
}

TEST_CASE("--dry_run prints commands and environments and starts nothing", "[process][dry_run]") {
  TempDir dir;
  const auto outcome = run_launcher(with_worker({"--nproc_per_node", "2", "--nnodes", "2", "--node_rank", "1",
                                                 "--master_addr", "10.9.8.7", "--dry_run"},
                                                {"--out", dir.path(), "a b"}));
  CHECK(outcome.exit_code == 0);
  CHECK(list_dir(dir.path()).empty());
  CHECK_THAT(outcome.out, Catch::Contains("[rank 3]: command: " + worker_path() + " --out " + dir.path() + " 'a b'"));
  CHECK_THAT(outcome.out, Catch::Contains("RANK=2 LOCAL_RANK=0 WORLD_SIZE=4"));
  // Node 0's launcher listens on the master port; the workers' store takes a free port there (See
  // Note [One port per job]).
  CHECK_THAT(outcome.out, Catch::Contains("master 10.9.8.7:29500"));
  CHECK_THAT(outcome.out, Catch::Contains("MASTER_ADDR=10.9.8.7 MASTER_PORT=<free port>"));
}

TEST_CASE("Slurm's variables reach the real binary", "[process][slurm]") {
  const auto outcome = run_launcher({"--dry_run", "--nproc_per_node", "2", "/bin/true"},
                                    {{"SLURM_NNODES", "5"},
                                     {"SLURM_NODEID", "1"},
                                     {"SLURM_JOB_NODELIST", "ns[3182447,3185995,3186000-3186002]"},
                                     {"SLURM_JOB_ID", "777"}});
  INFO(outcome.err);
  CHECK(outcome.exit_code == 0);
  CHECK_THAT(outcome.out, Catch::Contains("2 workers on node 1 of 5, world size 10, master ns3182447:10777"));
  CHECK_THAT(outcome.out, Catch::Contains("[rank 3]: env: RANK=3 LOCAL_RANK=1"));
}

TEST_CASE("bad input: exit code 2, one line on stderr, no worker started", "[process][bad_input]") {
  TempDir dir;
  const std::string not_executable = dir.path() + "/not_executable";
  std::ofstream(not_executable) << "#!/bin/sh\n";
  // A port in use on the master: a listening socket of ours.
  const int busy = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(busy, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(busy, 1) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(busy, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string busy_port = std::to_string(ntohs(addr.sin_port));
  const std::string w = worker_path();
  const std::string out = dir.path() + "/started";
  ::mkdir(out.c_str(), 0755);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--no_such_flag", w}, "unknown flag '--no_such_flag'"},
      {{"--nproc_per_node", "two", w}, "expects an integer, got 'two'"},
      {{"--nproc_per_node", "0", w}, "--nproc_per_node"},
      {{"--nnodes", "2", "--node_rank", "5", w}, "--node_rank 5 must be below --nnodes 2"},
      {{"--nnodes", "2", "--master_port", "0", w}, "single node only"},
      {{"--master_port", busy_port, w}, "port " + busy_port + " on 127.0.0.1 is already in use"},
      {{dir.path() + "/missing"}, "does not exist"},
      {{not_executable}, "is not executable"},
      {{"no-such-program-anywhere"}, "not found in PATH"},
      {{"--shutdown_grace", "soon", w}, "--shutdown_grace"},
      {{"--gpus", "0,x", w}, "--gpus"},
      {{"--redirects", "9", w}, "--redirects"},
      {{"--nproc_per_node", "2"}, "no training binary"},
  };
  for (const auto& [args, expected] : cases) {
    std::vector<std::string> argv = args;
    if (argv.back() != "2") argv.insert(argv.end(), {"--out", out});  // (the last case has no worker)
    INFO(ddp::join(argv, " "));
    const auto outcome = run_launcher(argv, {}, 10s);
    INFO(outcome.err);
    CHECK(outcome.exit_code == 2);
    CHECK(count_lines(outcome.err) == 1);
    CHECK(outcome.err.rfind("ddp_launch: error: ", 0) == 0);
    CHECK_THAT(outcome.err, Catch::Contains(expected));
    CHECK(outcome.out.empty());
  }
  CHECK(list_dir(out).empty());
  ::close(busy);
}

TEST_CASE("without a GPU driver, --gpus auto and --nproc_per_node gpu fail cleanly", "[process][bad_input]") {
  if (void* nvml = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    ::dlclose(nvml);
    SUCCEED("this machine has NVML; the no-driver path cannot be checked here");
    return;
  }
  for (const auto& args : std::vector<std::vector<std::string>>{{"--gpus", "auto", "/bin/true"},
                                                                 {"--nproc_per_node", "gpu", "/bin/true"}}) {
    INFO(ddp::join(args, " "));
    const auto outcome = run_launcher(args, {}, 10s);
    CHECK(outcome.exit_code == 2);
    CHECK(count_lines(outcome.err) == 1);
    CHECK_THAT(outcome.err, Catch::Contains("cannot load libnvidia-ml.so.1"));
  }
  // nproc_per_node auto falls back to the CPU count.
  const auto outcome = run_launcher({"--nproc_per_node", "auto", "--dry_run", "/bin/true"}, {}, 10s);
  CHECK(outcome.exit_code == 0);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  REQUIRE(::sched_getaffinity(0, sizeof cpus, &cpus) == 0);
  CHECK_THAT(outcome.out, Catch::Contains(ddp::str("dry run: ", CPU_COUNT(&cpus), " workers")));
}

TEST_CASE("a relative --log_dir gives workers absolute error-file paths", "[process][logs]") {
  TempDir dir;
  const std::string relative = std::filesystem::relative(dir.path() + "/logs").string();
  REQUIRE(relative.front() != '/');
  const auto outcome = run_launcher(with_worker({"--nproc_per_node", "1", "--master_port", "0", "--log_dir", relative,
                                                 "--run_id", "rel"},
                                                {"--out", dir.path()}));
  CHECK(outcome.exit_code == 0);
  CHECK(read_record(record_path(dir, 0)).env.at("TORCHELASTIC_ERROR_FILE") ==
        run_folder(dir.path() + "/logs", "rel") + "/attempt_0/0/error.json");
}

TEST_CASE("a binary the kernel cannot execute: exit 127 with the errno", "[process][failure]") {
  TempDir dir;
  const std::string script = dir.path() + "/no_shebang";
  std::ofstream(script) << "echo this is not a program\n";
  ::chmod(script.c_str(), 0755);
  const auto outcome = run_launcher({"--nproc_per_node", "1", "--master_port", "0", script}, {}, 10s);
  CHECK(outcome.exit_code == 127);
  CHECK_THAT(outcome.err, Catch::Contains("[rank 0]: ddp_launch: execve failed (errno " + std::to_string(ENOEXEC) + ")"));
}

TEST_CASE("an error file replaced by a FIFO does not stop the failure summary", "[process][failure]") {
  // The summary reads the error file with ddp::read_error_file, which refuses anything but a regular
  // file without opening it for a blocking read (a FIFO nobody writes to would hang the launcher).
  const auto outcome = run_launcher({"--nproc_per_node", "1", "--master_port", "0", "/bin/sh", "-c",
                                     "mkfifo \"$TORCHELASTIC_ERROR_FILE\" && exit 3"},
                                    {}, 10s);
  INFO(outcome.err);
  CHECK(outcome.exit_code == 3);
  CHECK_THAT(outcome.err, Catch::Contains("message   : <the worker wrote no error file"));
}

TEST_CASE("--gpus 0,3,5 gives each local worker one GPU", "[process][env]") {
  TempDir dir;
  const auto outcome = run_launcher(with_worker({"--gpus", "0,3,5", "--master_port", "0"}, {"--out", dir.path()}));
  CHECK(outcome.exit_code == 0);
  const std::vector<std::string> expected{"0", "3", "5"};
  for (int rank = 0; rank < 3; ++rank) {  // three GPUs listed: three workers
    const auto r = read_record(record_path(dir, rank));
    CHECK(r.env.at("CUDA_VISIBLE_DEVICES") == expected[rank]);
    CHECK(r.env.at("CUDA_DEVICE_ORDER") == "PCI_BUS_ID");
    CHECK(r.env.at("LOCAL_WORLD_SIZE") == "3");
  }
}

TEST_CASE("--cpu_bind exclusive pins each worker, its threads and its restarts to its own CPUs", "[process][cpu]") {
  const std::vector<int> cpus = MachineResources::of_this_machine().cpus();  // this process's affinity
  const int nproc = std::min<int>(2, static_cast<int>(cpus.size()));  // the split itself: test_launcher_logic
  const auto slices = exclusive_cpu_slices(cpus, nproc);
  // A thread the worker starts reports its mask too (threads inherit it), and the first attempt
  // fails so that the restart's mask is checked as well.
  // Each worker waits (bounded) for its siblings' reports before exiting, so that attempt 0's
  // failure cannot stop a sibling before it has reported.
  TempDir reports;
  const std::string script = ddp::str(
      "grep Cpus_allowed_list: /proc/self/status; (grep Cpus_allowed_list: /proc/self/status) | sed s/^/sub:/; "
      "echo omp=$OMP_NUM_THREADS restart=$TORCHELASTIC_RESTART_COUNT; "
      "touch ", reports.path(), "/$RANK.$TORCHELASTIC_RESTART_COUNT; i=0; "
      "while [ $(ls ", reports.path(), " | grep -c \"[.]$TORCHELASTIC_RESTART_COUNT$\") -lt ", nproc,
      " ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; test $TORCHELASTIC_RESTART_COUNT = 1");
  const auto outcome = run_launcher({"--nproc_per_node", std::to_string(nproc), "--master_port", "0", "--cpu_bind",
                                     "exclusive", "--max_restarts", "1", "/bin/sh", "-c", script},
                                    {}, 20s);
  INFO(outcome.out << outcome.err);
  CHECK(outcome.exit_code == 0);
  for (int rank = 0; rank < nproc; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "]: ";
    const std::string list = format_cpu_list(slices[rank]);
    CHECK(count_of(outcome.out, prefix + "Cpus_allowed_list:\t" + list + "\n") == 2);  // both attempts
    CHECK(count_of(outcome.out, prefix + "sub:Cpus_allowed_list:\t" + list + "\n") == 2);
    CHECK(count_of(outcome.out, prefix + "omp=" + std::to_string(slices[rank].size()) + " restart=") == 2);
  }
  CHECK_THAT(outcome.err, Catch::Contains("--cpu_bind exclusive: local rank 0: " + format_cpu_list(slices[0])));

  // The user's OMP_NUM_THREADS wins; binding stays.
  const auto kept = run_launcher({"--nproc_per_node", "1", "--master_port", "0", "--cpu_bind", "exclusive", "/bin/sh",
                                  "-c", "echo omp=$OMP_NUM_THREADS"},
                                 {{"OMP_NUM_THREADS", "3"}}, 20s);
  CHECK(kept.exit_code == 0);
  CHECK_THAT(kept.out, Catch::Contains("[rank 0]: omp=3"));

  // More workers than CPUs: exit 2, one line, nothing started.
  TempDir dir;
  const std::string marker = dir.path() + "/started";
  const auto refused = run_launcher({"--nproc_per_node", std::to_string(cpus.size() + 1), "--master_port", "0",
                                     "--cpu_bind", "exclusive", "/bin/sh", "-c", "touch " + marker},
                                    {}, 20s);
  CHECK(refused.exit_code == 2);
  CHECK(count_lines(refused.err) == 1);
  CHECK_THAT(refused.err, Catch::Contains("--cpu_bind exclusive needs a CPU per worker"));
  CHECK_FALSE(std::filesystem::exists(marker));
}

TEST_CASE("--numa_binding pins each worker to its NUMA node's CPUs on this machine", "[process][cpu]") {
  // The placement itself: test_numa_binding.cpp (fake sysfs roots). Here: what this machine's /sys
  // gives is what each worker runs on, and the launcher says so.
  MachineResources machine = MachineResources::of_this_machine();
  const int nproc = std::min<int>(2, static_cast<int>(machine.cpus().size()));
  for (const char* mode : {"node", "exclusive", "core-complex"}) {
    const std::vector<std::string> flags = {"--nproc_per_node", std::to_string(nproc), "--master_port", "0",
                                            "--numa-binding", mode};
    std::vector<std::string> parsed = flags;
    parsed.push_back("/bin/true");
    std::string how;
    const auto slices = resolve_cpu_binding(ddp::launcher::testing::parse(parsed, ddp::EnvironmentSnapshot::from_process()),
                                            ddp::EnvironmentSnapshot::from_process(), nproc, {}, machine, how);
    REQUIRE(slices.size() == static_cast<std::size_t>(nproc));
    std::vector<std::string> args = flags;
    for (const char* a : {"/bin/sh", "-c", "grep Cpus_allowed_list: /proc/self/status; echo omp=$OMP_NUM_THREADS"}) args.push_back(a);
    const auto outcome = run_launcher(args, {}, 20s);
    INFO(mode << ": " << outcome.out << outcome.err);
    CHECK(outcome.exit_code == 0);
    for (int rank = 0; rank < nproc; ++rank) {
      const std::string prefix = "[rank " + std::to_string(rank) + "]: ";
      CHECK(count_of(outcome.out, prefix + "Cpus_allowed_list:\t" + format_cpu_list(slices[rank]) + "\n") == 1);
      CHECK(count_of(outcome.out, prefix + "omp=" + std::to_string(slices[rank].size()) + "\n") == 1);
    }
    CHECK_THAT(outcome.err, Catch::Contains(how + ": local rank 0: " + format_cpu_list(slices[0])));
    CHECK_THAT(outcome.err, Catch::Contains(ddp::str("--numa_binding ", mode, " (")));
  }
  const auto refused = run_launcher({"--numa_binding", "gpu", "/bin/true"}, {}, 20s);
  CHECK(refused.exit_code == 2);
  CHECK(count_lines(refused.err) == 1);
  CHECK_THAT(refused.err, Catch::Contains("--numa_binding: invalid choice 'gpu'"));
}

TEST_CASE("a static job needs only --master_port: its neighbour taken changes nothing", "[process]") {
  // See Note [One port per job] in launcher/rendezvous/rendezvous.h: node 0's launcher listens on --master_port,
  // the workers' store on a port the OS picked, told to node 1 in the coordinator's welcome.
  TempDir dir;
  // A listening socket whose lower neighbour is free: that neighbour is --master_port.
  int busy = -1, taken = 0, master_port = 0;
  for (int tries = 0; tries < 20 && master_port == 0; ++tries) {
    busy = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(busy, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(busy, 1) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(busy, reinterpret_cast<sockaddr*>(&addr), &len);
    taken = ntohs(addr.sin_port);
    if (ddp::launcher::process::probe_bind("127.0.0.1", taken - 1) == ddp::launcher::process::BindProbe::kFree) {
      master_port = taken - 1;
    } else {
      ::close(busy);
    }
  }
  REQUIRE(master_port != 0);
  std::vector<std::vector<std::string>> nodes;
  for (int node = 0; node < 2; ++node) {
    nodes.push_back(with_worker({"--nnodes", "2", "--node_rank", std::to_string(node), "--nproc_per_node", "1",
                                 "--master_addr", "127.0.0.1", "--master_port", std::to_string(master_port)},
                                {"--out", dir.path()}));
  }
  for (const auto& outcome : run_nodes(nodes, 60s)) {
    INFO(outcome.err);
    CHECK(outcome.exit_code == 0);
  }
  ::close(busy);
  // Both workers saw node 0's store port: neither --master_port nor a fixed offset of it.
  std::set<std::string> ports;
  for (int rank = 0; rank < 2; ++rank) {
    REQUIRE(wait_for_files(dir.path(), "rank" + std::to_string(rank) + ".", 1, 5s));
    ports.insert(read_record(record_path(dir, rank)).env.at("MASTER_PORT"));
  }
  REQUIRE(ports.size() == 1);
  CHECK(*ports.begin() != std::to_string(master_port));
  CHECK(*ports.begin() != std::to_string(taken));
}

TEST_CASE("node 1 of a static job whose node 0 never comes says so within --rdzv_timeout, exit 1", "[process][bad_input]") {
  TempDir dir;
  const int port = ddp::launcher::process::pick_free_port("127.0.0.1");
  const auto outcome =
      run_launcher(with_worker({"--nnodes", "2", "--node_rank", "1", "--master_addr", "127.0.0.1", "--master_port",
                                std::to_string(port), "--rdzv_timeout", "2"},
                               {"--out", dir.path()}),
                   {}, std::chrono::seconds(30));
  INFO(outcome.err);
  CHECK(outcome.exit_code == 1);
  CHECK_THAT(outcome.err, Catch::Contains("could not reach node 0's launcher at 127.0.0.1:" + std::to_string(port) +
                                          " within 2 s (--rdzv_timeout)"));
  CHECK(list_dir(dir.path()).empty());  // no worker started
}
