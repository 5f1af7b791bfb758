// train_fashion_mnist under ddp_launch --recovery live on one host: a worker SIGKILLed mid-epoch costs
// the survivors the step in flight, not their processes; its restart joins and receives the state;
// every sample of the epoch is trained on exactly once. See Note [Live training] (examples/live_training.h).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "launcher/process/net.h"
#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

using ddp::testing::kBinDir;

// sample -> how many times a rank trained on it in epoch 0, over every --log-samples file in dir.
std::map<int64_t, int> trained_in_first_epoch(const fs::path& dir) {
  std::map<int64_t, int> counts;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path());
    int64_t epoch = 0, sample = 0;
    while (in >> epoch >> sample) {
      if (epoch == 0) ++counts[sample];
    }
  }
  return counts;
}

}  // namespace

TEST_CASE("a worker killed mid-epoch under ddp_launch --recovery live: survivors keep their processes, its "
          "restart joins, every sample is trained once",
          "[training][ddp][live]") {
  ddp::testing::TempDir tmp;
  const fs::path logs = tmp.path / "samples";
  fs::create_directories(logs);
  const int port = ddp::launcher::process::pick_free_port("127.0.0.1");
  // 600 samples, 48 per step at any world size (--batch-policy global): 16 per rank at 3, 24 at 2. The
  // last rank dies in step 4 (offset 144); the survivors run step 4 again at world size 2 (to 192) and
  // hold it until the restarted worker asks to join; the rest, 408, is split among 3 ranks.
  // One launcher of three workers (See Note [Restarting one live worker] in launcher/agent/live_respawn.h):
  // the dead one is restarted alone, its node-mates keep their processes.
  const std::string launch =
      "timeout -k 5 80 " + kBinDir + "/ddp_launch --nnodes 1:2 --nproc_per_node 3 --rdzv_endpoint 127.0.0.1:" +
      std::to_string(port) + " --rdzv_id live_example --rdzv_conf last_call_timeout=1 --recovery live " +
      "--max_restarts 1 --monitor_interval 0.05 " + kBinDir +
      "/train_fashion_mnist --mode ddp --limit 600 --epochs 1 --seed 3 --batch-policy global " +
      "--global-batch-size 48 --die-at-step 4 --log-samples " + logs.string() + " --checkpoint-dir " +
      (tmp.path / "ck").string() + " --checkpoint-every 2";
  const auto run = ddp::testing::run_command(launch, 90);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);

  // "rank R: live recovery round N, world size W, pid P": the first round's PIDs are the workers started.
  const std::regex round_line(R"(rank (\d+): live recovery round (\d+), world size (\d+), pid (\d+))");
  std::map<int, std::set<std::string>> pids_by_round;
  for (auto it = std::sregex_iterator(run.output.begin(), run.output.end(), round_line); it != std::sregex_iterator();
       ++it) {
    pids_by_round[std::stoi((*it)[2])].insert((*it)[4]);
  }
  REQUIRE(pids_by_round.size() == 3);  // the start, the loss, the join
  const std::set<std::string> started = pids_by_round.begin()->second;
  CHECK(started.size() == 3);
  CHECK(std::next(pids_by_round.begin())->second.size() == 2);  // the survivors, at world size 2
  CHECK_THAT(run.output, Contains("restarting it alone (--recovery live)") &&
                             Contains("marked node0/local2 gone in the training's membership"));

  // Every rank ends at the same step with the same parameters: two survivors and one new process.
  const std::regex finished_line(
      R"(rank (\d+): live recovery finished at step (\d+), world size 3, pid (\d+), parameters ([0-9a-f]+))");
  std::set<std::string> steps, checksums, survivors, newcomers;
  for (auto it = std::sregex_iterator(run.output.begin(), run.output.end(), finished_line);
       it != std::sregex_iterator(); ++it) {
    steps.insert((*it)[2]);
    checksums.insert((*it)[4]);
    (started.count((*it)[3]) ? survivors : newcomers).insert((*it)[3]);
  }
  CHECK(survivors.size() == 2);
  CHECK(newcomers.size() == 1);
  CHECK(steps == std::set<std::string>{"13"});  // 3 at world 3, 1 at world 2, 9 at world 3: none lost
  CHECK(checksums.size() == 1);
  CHECK_THAT(run.output, Contains("epoch 1 goes on at sample offset 144 of 600, 24 samples per rank") &&
                             Contains("epoch 1 goes on at sample offset 192 of 600, 16 samples per rank"));

  // Checkpoints are written during a live run (whole-job loss), at world sizes 3 and after the rejoin.
  CHECK(fs::exists(tmp.path / "ck"));
  CHECK(!fs::is_empty(tmp.path / "ck"));

  // The dropped step's samples were trained on after the regroup, once: every sample exactly once.
  const auto counts = trained_in_first_epoch(logs);
  CHECK(counts.size() == 600);
  int64_t total = 0;
  for (const auto& [sample, count] : counts) {
    INFO("sample " << sample);
    CHECK(sample >= 0);
    CHECK(sample < 600);
    CHECK(count == 1);
    total += count;
  }
  CHECK(total == 600);
}

// See Note [Hot spares] in ddp/elastic/membership.h.
TEST_CASE("a worker killed mid-epoch with --spares 1: the spare takes its place, the world size stays 3, its "
          "restart waits as a spare and leaves at the end",
          "[training][ddp][live][spares]") {
  ddp::testing::TempDir tmp;
  const fs::path logs = tmp.path / "samples";
  fs::create_directories(logs);
  const int port = ddp::launcher::process::pick_free_port("127.0.0.1");
  const std::string launch =
      "timeout -k 5 80 " + kBinDir + "/ddp_launch --nnodes 1:2 --nproc_per_node 3 --spares 1 --rdzv_endpoint 127.0.0.1:" +
      std::to_string(port) + " --rdzv_id spare_example --rdzv_conf last_call_timeout=1 --recovery live " +
      "--max_restarts 1 --monitor_interval 0.05 " + kBinDir +
      "/train_fashion_mnist --mode ddp --limit 600 --epochs 1 --seed 3 --batch-policy global " +
      "--global-batch-size 48 --die-at-step 4 --die-after-spares 1 --log-samples " + logs.string();
  const auto run = ddp::testing::run_command(launch, 90);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const std::regex round_line(R"(rank (\d+): live recovery round (\d+), world size (\d+), pid (\d+))");
  std::map<int, std::set<std::string>> pids_by_round;
  std::set<std::string> world_sizes;
  for (auto it = std::sregex_iterator(run.output.begin(), run.output.end(), round_line); it != std::sregex_iterator();
       ++it) {
    pids_by_round[std::stoi((*it)[2])].insert((*it)[4]);
    world_sizes.insert((*it)[3]);
  }
  REQUIRE(pids_by_round.size() == 2);  // the start, the loss (the spare in the dead worker's place)
  CHECK(world_sizes == std::set<std::string>{"3"});
  CHECK(std::next(pids_by_round.begin())->second.size() == 3);
  CHECK_THAT(run.output, Contains("1 spare(s) took the place of the missing") &&
                             Contains("a spare (ddp_launch --spares) that the job did not need: released"));
  const std::regex finished_line(
      R"(rank (\d+): live recovery finished at step (\d+), world size 3, pid (\d+), parameters ([0-9a-f]+))");
  std::set<std::string> steps, checksums, pids;
  for (auto it = std::sregex_iterator(run.output.begin(), run.output.end(), finished_line);
       it != std::sregex_iterator(); ++it) {
    steps.insert((*it)[2]);
    checksums.insert((*it)[4]);
    pids.insert((*it)[3]);
  }
  CHECK(pids.size() == 3);
  CHECK(steps == std::set<std::string>{"13"});  // 600 / 48 = 12.5: 13 steps at world size 3, none lost
  CHECK(checksums.size() == 1);
  const auto counts = trained_in_first_epoch(logs);
  CHECK(counts.size() == 600);
  for (const auto& [sample, count] : counts) {
    INFO("sample " << sample);
    CHECK(count == 1);
  }
}

TEST_CASE("--zero under ddp_launch --recovery live is refused in one line (exit 2)", "[training][ddp][live]") {
  const int port = ddp::launcher::process::pick_free_port("127.0.0.1");
  const auto run = ddp::testing::run_command(
      kBinDir + "/ddp_launch --nnodes 1:2 --nproc_per_node 1 --rdzv_endpoint 127.0.0.1:" + std::to_string(port) +
          " --rdzv_id live_zero --rdzv_conf last_call_timeout=1 --recovery live " + kBinDir + "/train_fashion_mnist --mode ddp --limit 64 --zero",
      60);
  INFO(run.output);
  CHECK(run.exit_code != 0);
  CHECK_THAT(run.output, Contains("--zero cannot run under ddp_launch --recovery live: a lost rank's shard"));
}
