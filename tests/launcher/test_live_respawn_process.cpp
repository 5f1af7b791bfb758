// ddp_launch --recovery live restarts a dead worker alone (See Note [Restarting one live worker] in
// launcher/agent/live_respawn.h): the real launcher with launch_test_worker (no LibTorch, no training).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "launcher/process/net.h"
#include "tests/launcher/process_harness.h"

using namespace ddp::launcher::process;
using namespace ddp::launcher::testing;
using namespace std::chrono_literals;

namespace {

// One launcher, 2 workers, --recovery live: rank 1 exits 3 while TORCHELASTIC_RESTART_COUNT <
// fail_attempts; rank 0 sleeps 2 s meanwhile.
LaunchOutcome run_live(const TempDir& dir, int fail_attempts) {
  const std::string port = std::to_string(ddp::launcher::process::pick_free_port("127.0.0.1"));
  return run_launcher({"--nnodes", "1:2", "--nproc_per_node", "2", "--rdzv_endpoint", "127.0.0.1:" + port,
                       "--rdzv_conf", "last_call_timeout=1", "--recovery", "live", "--max_restarts", "1",
                       "--monitor_interval", "0.05", worker_path(), "--out", dir.path(), "--sleep", "0:2", "--exit",
                       "1:3", "--fail-attempts", std::to_string(fail_attempts)},
                      {}, 60s);
}

}  // namespace

TEST_CASE("--recovery live: a dead worker is restarted alone as a joiner, its node-mate keeps running",
          "[process][restart]") {
  TempDir dir;
  const auto outcome = run_live(dir, 1);
  INFO(outcome.err);
  CHECK(outcome.exit_code == 0);
  // Rank 0 started once; rank 1 twice, the second time with its own restart count and a new member id.
  CHECK(list_dir(dir.path()) == std::vector<std::string>{"rank0.attempt0", "rank1.attempt0", "rank1.attempt1"});
  const WorkerRecord restarted = read_record(dir.path() + "/rank1.attempt1");
  CHECK(restarted.env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(restarted.env.at("DDP_LIVE_MEMBER") == "node0/local1/attempt1");
  CHECK(read_record(dir.path() + "/rank0.attempt0").env.at("DDP_LIVE_MEMBER") == "node0/local0/attempt0");
  CHECK_THAT(outcome.err, Catch::Contains("marked node0/local1 gone in the training's membership; restart 1 of 1") &&
                              Catch::Contains("exited with 3: restarting it alone (--recovery live)"));
  CHECK(count_of(outcome.err, "sending SIGTERM") == 0);
}

TEST_CASE("--recovery live: once the node's --max_restarts are used up, a failure stops the group",
          "[process][restart]") {
  TempDir dir;
  const auto outcome = run_live(dir, 2);
  INFO(outcome.err);
  CHECK(outcome.exit_code == 3);
  CHECK_THAT(outcome.err, Catch::Contains("local rank 1 failed and this node's --max_restarts 1 is used up") &&
                              Catch::Contains("worker group FAILED") && Catch::Contains("exitcode  : 3"));
  // The group is not restarted whole: rank 0 ran once, and was stopped with the group. (Under load
  // rank 1 fails twice before rank 0 has written its record: that SIGTERM can come first, so the
  // record's presence is not asserted, its single attempt is.)
  std::vector<std::string> records = list_dir(dir.path());
  records.erase(std::remove(records.begin(), records.end(), "rank0.attempt0"), records.end());
  CHECK(records == std::vector<std::string>{"rank1.attempt0", "rank1.attempt1"});
  CHECK_THAT(outcome.err, Catch::Contains("rank 0 (local_rank: 0): exitcode SIGTERM (signal 15, exit code 143) (after "
                                          "the launcher stopped the group)"));
}
