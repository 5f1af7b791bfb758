// An epoch checkpointed at world size 3 and resumed at world size 2, with real processes under
// ddp_launch on one host: the samples the ranks trained on cover the epoch exactly once. See Note
// [Re-sharding at a new world size] (samplers/reshard.h) and Note [Batch policy] (examples/batch_policy.h).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

using ddp::testing::kBinDir;

// (epoch, sample) -> how many times a rank trained on it, over every --log-samples file in dir whose
// name has `world` in it (e.g. "world3"), or all of them.
std::map<std::pair<int64_t, int64_t>, int> trained(const fs::path& dir, const std::string& world = "") {
  std::map<std::pair<int64_t, int64_t>, int> counts;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().find(world) == std::string::npos) continue;
    std::ifstream in(entry.path());
    int64_t epoch = 0, sample = 0;
    while (in >> epoch >> sample) ++counts[{epoch, sample}];
  }
  return counts;
}

// The first sample rank 0 of `world` trained on in `epoch`: P[0] of the epoch's order.
int64_t first_sample(const fs::path& dir, const std::string& world, int64_t epoch) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find(world + "-rank0-") == std::string::npos) continue;
    std::ifstream in(entry.path());
    int64_t e = 0, sample = 0;
    while (in >> e >> sample) {
      if (e == epoch) return sample;
    }
  }
  FAIL("no sample of epoch " << epoch << " in " << world << "'s rank 0 log");
  return -1;
}

// Trains 2 epochs of 601 samples: a run at world size 3 stops after `steps` steps (checkpointed
// there), a run at world size 2 resumes it. Checks the resume lines and that every sample of each epoch
// was trained on once, plus only the padding of the share that ended the epoch: P[0] of its order.
void check_three_then_two(const std::string& batch_flags, int steps, int64_t offset, const std::string& step_line,
                          const std::string& resumed_step_line) {
  ddp::testing::TempDir tmp;
  const fs::path logs = tmp.path / "samples";
  fs::create_directories(logs);
  const std::string program = kBinDir + "/train_fashion_mnist --mode ddp --limit 601 --epochs 2 --seed 7 " +
                              batch_flags + " --checkpoint-dir " + (tmp.path / "ck").string() + " --log-samples " +
                              logs.string();
  const auto launch = [&](int ranks) {
    return kBinDir + "/ddp_launch --nproc_per_node " + std::to_string(ranks) + " --master_port 0 " + program;
  };
  const std::string stop = std::to_string(steps);
  const auto first = ddp::testing::run_command(launch(3) + " --checkpoint-every " + stop + " --max-steps " + stop);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK_THAT(first.output, Contains("3 process(es)") && Contains(step_line));
  const auto resumed = ddp::testing::run_command(launch(2) + " --resume");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Contains("2 process(es)") && Contains(resumed_step_line));
  for (int rank : {0, 1}) {
    CHECK_THAT(resumed.output, Contains("rank " + std::to_string(rank) + ": resumed epoch 1 at sample offset " +
                                        std::to_string(offset) + " of 601, world size 3 -> 2"));
  }
  const auto all = trained(logs);
  int64_t before_change = 0;
  for (const auto& [key, count] : trained(logs, "world3")) before_change += count;
  CHECK(before_change == offset);  // nothing of epoch 1 at world 3, nothing after the checkpoint
  // The closed forms: epoch 0 ends with the rest, 601 - offset, split among 2 ranks; epoch 1 is 2 x 301.
  const int64_t rest = 601 - offset;
  const int64_t expected_total[2] = {offset + 2 * ((rest + 1) / 2), 602};
  const int64_t padded[2] = {first_sample(logs, "world3", 0), first_sample(logs, "world2", 1)};
  for (int64_t epoch : {0, 1}) {
    INFO("epoch " << epoch);
    int64_t total = 0, repeated = 0;
    for (int64_t sample = 0; sample < 601; ++sample) {
      const auto found = all.find({epoch, sample});
      const int count = found == all.end() ? 0 : found->second;
      INFO("sample " << sample);
      CHECK(count >= 1);
      CHECK(count <= 2);
      total += count;
      if (count == 2) {
        ++repeated;
        CHECK(sample == padded[epoch]);
      }
    }
    CHECK(total == expected_total[epoch]);
    CHECK(repeated == expected_total[epoch] - 601);
  }
  CHECK(all.size() == 2 * 601);  // nothing outside [0, 601) and no third epoch
}

}  // namespace

TEST_CASE("an epoch stopped at world size 3 and resumed at 2 trains on every sample once (ddp_launch)",
          "[training][ddp][elastic]") {
  SECTION("--batch-policy per-rank (default): 21 per rank, 63 then 42 per step; stopped at offset 189") {
    // 189 is odd: rounding it to a multiple of 2 ranks (as before re-sharding) would train a sample twice.
    check_three_then_two("--batch-size 21", 3, 189, "63 samples per step, 10 steps per epoch",
                         "42 samples per step, 15 steps per epoch");
  }
  SECTION("--batch-policy global: 60 per step at both sizes (20 then 30 per rank); stopped at offset 240") {
    check_three_then_two("--batch-policy global --global-batch-size 60", 4, 240, "60 samples per step, 11 steps per epoch",
                         "60 samples per step, 11 steps per epoch");
  }
}
