// Process tests of one command, every host (launcher/hosts/remote_launch.h) on this machine alone: the
// "hosts" are reached through a fake ssh that runs the command line in /bin/sh, so the local
// launcher's console, exit code, summary and stopping are tested without namespaces (the real
// sshd runs in tests/hosts/ssh_test.sh).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "ddp/base/str.h"
#include "launcher/process/net.h"
#include "tests/launcher/process_harness.h"

using namespace ddp::launcher;
using namespace ddp::launcher::process;
using namespace ddp::launcher::testing;
using namespace std::chrono_literals;

namespace {

// Called as ssh is (CMD HOST 'line'): runs the line in sh, as ssh's remote shell would.
const std::string kFakeSsh = "sh -c 'exec /bin/sh -c \"$2\"' fake_ssh";

std::vector<std::string> job_args(const std::string& hosts, std::vector<std::string> worker_args) {
  std::vector<std::string> args{"--hosts", hosts, "--ssh_cmd", kFakeSsh, "--master_addr", "127.0.0.1",
                                "--master_port", std::to_string(pick_free_port("127.0.0.1")), "--shutdown_grace",
                                "5", worker_path()};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return args;
}

}  // namespace

TEST_CASE("hosts: every line carries its host and rank; a failed rank's code and one summary", "[hosts]") {
  TempDir dir;
  const LaunchOutcome ok = run_launcher(job_args("a:2,b:1", {"--print", "hi"}), {}, 60s);
  // Unequal slots are refused before anything starts.
  CHECK(ok.exit_code == 2);
  CHECK(ok.err.find("hosts a (2 slots) and b (1 slots) differ") != std::string::npos);

  const LaunchOutcome run = run_launcher(job_args("a:2,b:2", {"--out", dir.path(), "--print", "hi $x 'y'"}), {}, 60s);
  INFO("the launcher's stderr:\n" << run.err);
  REQUIRE(run.exit_code == 0);
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(count_of(run.out, (rank < 2 ? "a" : "b") + std::string(": [rank ") + std::to_string(rank) + "]: hi $x 'y'\n") ==
          1);
    CHECK(read_record(dir.path() + "/rank" + std::to_string(rank) + ".attempt0").env.at("MASTER_ADDR") == "127.0.0.1");
  }
  CHECK(count_of(run.err, "=====") == 0);

  const LaunchOutcome failed =
      run_launcher(job_args("a:2,b:2", {"--out", dir.path(), "--mark-sigterm", "--sleep", "0:60", "--sleep", "1:60",
                                        "--sleep", "2:60", "--sleep", "3:0.2", "--exit", "3:9", "--error-message",
                                        "3:out of patience"}),
                   {}, 60s);
  CHECK(failed.exit_code == 9);
  CHECK(count_of(failed.err, "ddp_launch: job FAILED: b (node 1) of 2 failed first, exit code 9\n") == 1);
  CHECK(count_of(failed.err, "  message   : out of patience\n") == 1);
  // Node a is stopped by the launchers' job channel (exit 1) or by its closed stdin (143), whichever
  // comes first (Note [Coordinated restarts]); either way it reports its own exit code.
  CHECK(count_of(failed.err, "  a (node 0): exit code 1 (stopped after it)\n") +
            count_of(failed.err, "  a (node 0): exit code 143 (stopped after it)\n") ==
        1);
  CHECK(count_of(failed.err, std::string(64, '=') + "\n") == 2);  // one summary, not one per host
  for (int rank = 0; rank < 3; ++rank) CHECK(std::filesystem::exists(dir.path() + "/sigterm" + std::to_string(rank)));
}

TEST_CASE("hosts: SIGTERM on the local launcher stops every host; --dry_run starts nothing", "[hosts]") {
  TempDir dir;
  std::vector<std::string> argv{launcher_path()};
  for (const auto& a : job_args("a:1,b:1", {"--out", dir.path(), "--mark-sigterm", "--sleep", "*:60"})) argv.push_back(a);
  Child child(argv);
  REQUIRE(wait_for_files(dir.path(), "rank", 2, 30s));
  child.signal(SIGTERM);
  const auto outcome = child.wait(30s);
  REQUIRE(outcome);
  CHECK(outcome->exit_code == 143);
  CHECK(count_of(outcome->err, "ddp_launch: stopped by SIGTERM; every host was stopped\n") == 1);
  CHECK(std::filesystem::exists(dir.path() + "/sigterm0"));
  CHECK(std::filesystem::exists(dir.path() + "/sigterm1"));

  // SIGTERM during the start-up check: the checks are killed, nothing is left.
  const std::string hanging_ssh = "sh -c 'echo $$ > " + dir.path() + "/tmp-$1; mv " + dir.path() + "/tmp-$1 " +
                                  dir.path() + "/check-$1.pid; exec sleep 60' fake_ssh";  // the file appears whole
  Child checking({launcher_path(), "--hosts", "a,b", "--ssh_cmd", hanging_ssh, "/bin/true"});
  REQUIRE(wait_for_files(dir.path(), "check-", 2, 30s));
  std::vector<int> check_pids;
  for (const char* host : {"a", "b"}) check_pids.push_back(std::stoi(read_text(dir.path() + "/check-" + host + ".pid")));
  checking.signal(SIGTERM);
  const auto stopped = checking.wait(30s);
  REQUIRE(stopped);
  CHECK(stopped->exit_code == 143);
  CHECK(wait_gone(check_pids, 10s).empty());

  const LaunchOutcome dry = run_launcher({"--hosts", "h1:2,h2:2", "--dry_run", "--max_restarts", "1", "--env", "FWD_A",
                                          "--env=FWD_B", "--ssh_cmd", "ssh -p 2222", "./train", "it's"},
                                         {{"FWD_A", "1"}, {"FWD_B", "x y"}});
  CHECK(dry.exit_code == 0);
  CHECK(dry.out.find(" && exec env FWD_A=1 '\\''FWD_B=x y'\\'' ") != std::string::npos);  // --env is repeatable
  CHECK(dry.out.find("h2 (node 1): ssh -p 2222 h2 'cd ") != std::string::npos);
  CHECK(dry.out.find("--max_restarts 1 --nnodes=2 --node_rank=1 --master_addr=h1 --nproc_per_node=2 --watch_stdin "
                     "-- ./train '\\''it'\\''\\'\\'''\\''s'\\'''") != std::string::npos);
}

TEST_CASE("hosts: flags that cannot go with a host list are refused with one line, exit 2", "[hosts]") {
  TempDir dir;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--hosts", "a:1", "--nnodes", "2"}, "--nnodes and --hosts exclude each other"},
      {{"--hosts", "a:1", "--node_rank", "0"}, "--node_rank and --hosts exclude each other"},
      {{"--hostfile", dir.path() + "/none", "--dry_run"}, "--hostfile: cannot open"},
      {{"--hostfile", dir.path() + "/none", "--hosts", "a"}, "--hostfile and --hosts exclude each other"},
      {{"--include", "a"}, "--include works with --hostfile or --hosts, which are not given"},
      {{"--hosts", "a:1", "--env", "DDP_SURELY_UNSET_VARIABLE", "--dry_run"},
       "--env DDP_SURELY_UNSET_VARIABLE: DDP_SURELY_UNSET_VARIABLE is not set here"},
      {{"--hosts", "a:2,b:2", "--exclude", "a:0", "--dry_run"}, "hosts a (1 slots) and b (2 slots) differ"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = args;
    argv.push_back("/bin/true");
    const LaunchOutcome outcome = run_launcher(argv);
    INFO(outcome.err);
    CHECK(outcome.exit_code == 2);
    CHECK(count_of(outcome.err, "ddp_launch: error: " + message) == 1);
    CHECK(count_lines(outcome.err) == 1);
  }
}

TEST_CASE("hosts: the root cause is the earliest failure, not the first ssh to end", "[hosts]") {
  // Host a's rank 0 fails first; host b's rank 2 fails after it (it waits for rank 0's mark); but
  // a's ssh reports only once b's has ended (a slow link). See Note [Root cause across hosts].
  TempDir dir;
  const std::string d = dir.path();
  const std::string worker = d + "/worker.sh";
  {
    std::ofstream script(worker);
    script << "#!/bin/sh\n"
              "case $RANK in\n"
              "  0) touch " << d << "/rank0-failed; exit 5 ;;\n"
              "  2) i=0; while [ ! -e " << d << "/rank0-failed ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done\n"
              "     sleep 1; exit 6 ;;\n"
              "  *) exec sleep 60 ;;\n"
              "esac\n";
  }
  std::filesystem::permissions(worker, std::filesystem::perms::owner_all);
  // The fake ssh of host b marks its end; host a's waits (bounded) for that mark before it ends
  // (not in the start-up check, which runs with --dry_run).
  const std::string late_ssh =
      "sh -c 'case \"$2\" in *--dry_run*) exec /bin/sh -c \"$2\";; esac; /bin/sh -c \"$2\"; rc=$?; if [ \"$1\" = b ]; then touch " + d +
      "/b-done; else i=0; while [ ! -e " + d + "/b-done ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
      "sleep 0.3; fi; exit $rc' fake_ssh";
  const LaunchOutcome outcome =
      run_launcher({"--hosts", "a:2,b:2", "--ssh_cmd", late_ssh, "--master_addr", "127.0.0.1", "--master_port",
                    std::to_string(pick_free_port("127.0.0.1")), "--shutdown_grace", "5", worker},
                   {}, 60s);
  INFO(outcome.err);
  CHECK(outcome.exit_code == 5);
  CHECK(count_of(outcome.err, "ddp_launch: job FAILED: a (node 0) of 2 failed first, exit code 5\n") == 1);
  // b's rank 2 exits 6 unless the launchers' job channel stopped b first (SIGTERM: 143, or 1 when its
  // workers ended cleanly); either way b ends first and a's earlier failure stays the root cause.
  int b_reported = 0;
  for (const char* code : {"1", "6", "143"}) {
    b_reported += count_of(outcome.err, ddp::str("  b (node 1): exit code ", code, " (stopped after it)\n"));
  }
  CHECK(b_reported == 1);
  CHECK(count_of(outcome.err, "b (node 1) exited with ") == 1);  // b ended first
}
