// The training programs end to end, on real Fashion-MNIST samples and on generated CIFAR-10 files.
// Every command runs under timeout(1), so a hung run fails the test instead of blocking it.
#include <sys/wait.h>

#include <catch2/catch.hpp>

#include <cstdio>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using ddp::testing::TempDir;
using Catch::Matchers::Contains;

namespace {

const std::string kBin = DDP_TEST_BIN_DIR;

using Run = ddp::testing::CommandRun;
Run run(const std::string& command, int timeout_seconds = 120) { return ddp::testing::run_command(command, timeout_seconds); }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The numbers of a JSON field holding a number or an array of numbers (enough for --metrics-json).
std::vector<double> json_numbers(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  REQUIRE(at != std::string::npos);
  size_t pos = at + key.size() + 3;
  std::vector<double> values;
  const bool array = json[json.find_first_not_of(' ', pos)] == '[';
  const size_t end = array ? json.find(']', pos) : json.find_first_of(",\n}", pos);
  std::string body = json.substr(pos, end - pos);
  for (char& c : body) {
    if (c == '[' || c == ',') c = ' ';
  }
  std::istringstream in(body);
  double v;
  while (in >> v) values.push_back(v);
  return values;
}

std::vector<float> read_params(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

void write_cifar10(const fs::path& dir, int records_per_file) {
  // Class c images are bright in channel c % 3 and dark elsewhere, so the classes can be learnt.
  unsigned seed = 1;
  int file = 0;
  for (const char* name : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                           "data_batch_5.bin", "test_batch.bin"}) {
    std::ofstream out(dir / name, std::ios::binary);
    for (int r = 0; r < records_per_file; ++r) {
      const int label = (r * 7 + file) % 10;
      out.put(static_cast<char>(label));
      for (int p = 0; p < 3072; ++p) {
        seed = seed * 1103515245u + 12345u;
        const int noise = static_cast<int>((seed >> 16) % 64);
        out.put(static_cast<char>(p / 1024 == label % 3 ? 150 + noise + label * 4 : noise));
      }
    }
    ++file;
  }
}

}  // namespace

// Requires a successful run, showing its output when it failed.
#define REQUIRE_SUCCESS(run_result)        \
  do {                                     \
    INFO((run_result).output);             \
    REQUIRE((run_result).exit_code == 0);  \
  } while (false)

TEST_CASE("single mode on 3000 real Fashion-MNIST samples: the loss falls", "[training]") {
  TempDir tmp;
  const Run r = run(kBin + "/train_fashion_mnist --limit 3000 --epochs 2 --batch-size 32 --lr 0.05 --metrics-json " +
                    (tmp / "m.json"));
  REQUIRE_SUCCESS(r);
  CHECK_THAT(r.output, Contains("epoch 2/2: train loss") && Contains("final test accuracy"));
  const std::string json = read_text(tmp / "m.json");
  const auto losses = json_numbers(json, "epoch_train_loss");
  REQUIRE(losses.size() == 2);
  CHECK(losses[1] < 0.8 * losses[0]);
  CHECK(json_numbers(json, "final_accuracy")[0] > 0.6);  // chance is 0.1
  CHECK(json_numbers(json, "peak_memory_bytes")[0] > 0);
  CHECK_THAT(json, Contains("\"mode\": \"single\"") && Contains("\"devices\": [\"cpu\"]"));
}

TEST_CASE("dp mode on a machine without GPUs says so, runs on the CPU and trains", "[training]") {
  TempDir tmp;
  const Run r = run(kBin + "/train_fashion_mnist --mode dp --workers 2 --limit 2000 --epochs 2 --metrics-json " +
                    (tmp / "m.json"));
  REQUIRE_SUCCESS(r);
  CHECK_THAT(r.output, Contains("0 CUDA device(s) visible; running on the one device cpu"));
  const auto losses = json_numbers(read_text(tmp / "m.json"), "epoch_train_loss");
  REQUIRE(losses.size() == 2);
  CHECK(losses[1] < 0.8 * losses[0]);
}

TEST_CASE("grad-accum 2 with batch 16 takes the same steps as batch 32", "[training]") {
  TempDir tmp;
  const std::string common = kBin + "/train_fashion_mnist --limit 512 --epochs 1 --lr 0.05 ";
  REQUIRE_SUCCESS(run(common + "--batch-size 32 --save-params " + (tmp / "a.bin")));
  REQUIRE_SUCCESS(run(common + "--batch-size 16 --grad-accum 2 --save-params " + (tmp / "b.bin")));
  const auto a = read_params(tmp / "a.bin");
  CHECK(a.size() == 61706);  // LeNet's parameters
  CHECK(max_abs_difference(a, read_params(tmp / "b.bin")) < 1e-4);
}

TEST_CASE("DDP on 2 ranks (ddp_launch) and single on the concatenated batch end with the same parameters",
          "[training][ddp]") {
  TempDir tmp;
  const std::string common = " --limit 512 --epochs 1 --lr 0.05 --seed 3 --save-params ";
  const std::string launch = kBin + "/ddp_launch --nproc_per_node 2 --master_port 0 " + kBin + "/train_fashion_mnist --mode ddp";
  REQUIRE_SUCCESS(run(kBin + "/train_fashion_mnist --batch-size 64" + common + (tmp / "single.bin")));
  const Run ddp = run(launch + " --batch-size 32" + common + (tmp / "ddp.bin"));
  REQUIRE_SUCCESS(ddp);
  CHECK_THAT(ddp.output, Contains("mode ddp, 2 process(es)") && Contains("64 samples per step, 8 steps per epoch"));
  // Only rank 0 reports.
  CHECK(ddp.output.find("[rank 1]") == std::string::npos);
  // Gradient accumulation in DDP (no_sync on the first micro-batch): 2 x 16 per rank, the same steps.
  REQUIRE_SUCCESS(run(launch + " --batch-size 16 --grad-accum 2 --workers 1" + common + (tmp / "accum.bin")));
  // Another seed ends elsewhere: the comparisons below are not trivially true.
  REQUIRE_SUCCESS(run(kBin + "/train_fashion_mnist --batch-size 64 --limit 512 --epochs 1 --seed 4 --save-params " +
                      (tmp / "other.bin")));
  const auto single = read_params(tmp / "single.bin");
  CHECK(max_abs_difference(single, read_params(tmp / "other.bin")) > 0.01);
  CHECK(max_abs_difference(single, read_params(tmp / "ddp.bin")) < 1e-5);
  CHECK(max_abs_difference(single, read_params(tmp / "accum.bin")) < 1e-5);
}

TEST_CASE("DDP with --resume after an interruption mid-epoch ends where an uninterrupted run does",
          "[training][ddp]") {
  TempDir tmp;
  // 512 samples, 2 ranks x 32: 8 steps per epoch. The interrupted run checkpoints at steps 5 and 10
  // (mid-epoch), and at 8 (end of epoch 1); it stops at step 11, the resumed run goes on from step 10.
  const std::string program = kBin + "/ddp_launch --nproc_per_node 2 --master_port 0 " + kBin +
                              "/train_fashion_mnist --mode ddp --limit 512 --epochs 2 --batch-size 32 --seed 5";
  REQUIRE_SUCCESS(run(program + " --save-params " + (tmp / "whole.bin")));
  const std::string checkpoints = " --checkpoint-dir " + (tmp / "ck");
  REQUIRE_SUCCESS(run(program + checkpoints + " --checkpoint-every 5 --max-steps 11"));
  CHECK(fs::exists(tmp.path / "ck" / "step-000000000010" / "MANIFEST"));
  CHECK(fs::exists(tmp.path / "ck" / "step-000000000008" / "MANIFEST"));
  const Run resumed = run(program + checkpoints + " --resume --save-params " + (tmp / "resumed.bin"));
  REQUIRE_SUCCESS(resumed);
  CHECK_THAT(resumed.output, Contains("step-000000000010 (epoch 2, step 10)"));
  CHECK(fs::exists(tmp.path / "ck" / "step-000000000016" / "MANIFEST"));
  CHECK(max_abs_difference(read_params(tmp / "whole.bin"), read_params(tmp / "resumed.bin")) < 1e-6);
}

TEST_CASE("--diloco 1 with outer lr 1 and no momentum is DDP; a resumed DiLoCo run ends where a whole one does",
          "[training][ddp][diloco]") {
  TempDir tmp;
  // Plain SGD (no inner momentum): the mean of the ranks' steps is DDP's step on the mean gradient.
  const std::string program = kBin + "/ddp_launch --nproc_per_node 2 --master_port 0 " + kBin +
                              "/train_fashion_mnist --mode ddp --limit 512 --batch-size 32 --seed 6";
  const std::string plain = " --epochs 1 --momentum 0 --save-params ";
  REQUIRE_SUCCESS(run(program + plain + (tmp / "ddp.bin")));
  const Run h1 = run(program + plain + (tmp / "h1.bin") + " --diloco 1 --outer-lr 1 --outer-momentum 0");
  REQUIRE_SUCCESS(h1);
  CHECK_THAT(h1.output, Contains("DiLoCo: 8 outer steps over 8 inner steps"));
  const auto ddp = read_params(tmp / "ddp.bin");
  CHECK(max_abs_difference(ddp, read_params(tmp / "h1.bin")) < 1e-5);
  // Streaming DiLoCo with Nesterov momentum in int8: the outer state (momentum, global parameters,
  // schedule) must come back from the checkpoint of step 8, or the resumed run ends elsewhere.
  const std::string diloco = program + " --epochs 2 --diloco 4 --diloco-fragments 2 --outer-dtype int8";
  REQUIRE_SUCCESS(run(diloco + " --save-params " + (tmp / "whole.bin")));
  const std::string checkpoints = " --checkpoint-dir " + (tmp / "ck");
  REQUIRE_SUCCESS(run(diloco + checkpoints + " --max-steps 11"));
  REQUIRE(fs::exists(tmp.path / "ck" / "step-000000000008" / "diloco.pt"));
  const Run resumed = run(diloco + checkpoints + " --resume --save-params " + (tmp / "resumed.bin"));
  REQUIRE_SUCCESS(resumed);
  CHECK_THAT(resumed.output, Contains("step-000000000008 (epoch 2, step 8)"));
  const auto whole = read_params(tmp / "whole.bin");
  CHECK(max_abs_difference(whole, read_params(tmp / "resumed.bin")) < 1e-6);
  // Without the outer state the resumed run goes elsewhere (and says so): the check above can fail.
  fs::remove(tmp.path / "ck" / "step-000000000016" / "MANIFEST");
  fs::remove(tmp.path / "ck" / "step-000000000008" / "diloco.pt");
  const Run afresh = run(diloco + checkpoints + " --resume --save-params " + (tmp / "afresh.bin"));
  REQUIRE_SUCCESS(afresh);
  CHECK_THAT(afresh.output, Contains("the outer optimizer starts afresh"));
  CHECK(max_abs_difference(whole, read_params(tmp / "afresh.bin")) > 1e-4);
}

TEST_CASE("--resume names every checkpoint it skips; none valid stops the run unless --allow-fresh-start",
          "[training]") {
  TempDir tmp;
  const std::string ck = tmp / "ck";
  const std::string program = kBin + "/train_fashion_mnist --mode single --limit 128 --epochs 2 --batch-size 32 "
                              "--checkpoint-dir " + ck;
  REQUIRE_SUCCESS(run(program));  // checkpoints at steps 4 and 8
  const fs::path step4 = fs::path(ck) / "step-000000000004";
  const fs::path step8 = fs::path(ck) / "step-000000000008";
  REQUIRE(fs::exists(step4 / "MANIFEST"));
  REQUIRE(fs::exists(step8 / "MANIFEST"));
  // A newer folder without MANIFEST and a corrupt newest checkpoint: both named, step 4 resumed.
  fs::create_directories(fs::path(ck) / "step-000000000012");
  fs::resize_file(step8 / "model.pt", 100);
  const Run skipped = run(program + " --resume --epochs 2");
  REQUIRE_SUCCESS(skipped);
  CHECK_THAT(skipped.output, Contains("warning: skipping " + ck + "/step-000000000012: has no MANIFEST"));
  CHECK_THAT(skipped.output, Contains("warning: skipping " + (step8 / "model.pt").string()) &&
                                 Contains("truncated"));
  CHECK_THAT(skipped.output, Contains("resuming from " + step4.string()));
  // None valid: one line per checkpoint, then an error and a non-zero exit.
  for (const auto& entry : fs::directory_iterator(ck)) {
    if (fs::exists(entry.path() / "model.pt")) fs::resize_file(entry.path() / "model.pt", 100);
  }
  const Run refused = run(program + " --resume");
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.output, Contains("none of the 3 checkpoint folders in " + ck + " is valid") &&
                                 Contains("--allow-fresh-start"));
  CHECK(std::count(refused.output.begin(), refused.output.end(), '\n') == 4);
  CHECK_THAT(refused.output, Contains("step-000000000012: has no MANIFEST") &&
                                 Contains((step8 / "model.pt").string()) && Contains((step4 / "model.pt").string()));
  const Run fresh = run(program + " --resume --allow-fresh-start --epochs 1");
  REQUIRE_SUCCESS(fresh);
  CHECK_THAT(fresh.output, Contains("no valid checkpoint in " + ck + ": starting from scratch"));
}

TEST_CASE("bad command lines and missing data: one clear line and an exit code", "[training]") {
  struct Case {
    std::string arguments, message;
  };
  const std::vector<Case> cases = {
      {"train_fashion_mnist --mode turbo", "train_fashion_mnist: error: --mode must be single, dp or ddp, not 'turbo'\n"},
      {"train_fashion_mnist --batch-size -3", "--batch-size must be at least 1"},
      {"train_fashion_mnist --no-such-flag", "no-such-flag"},
      {"train_fashion_mnist --resume", "--resume needs --checkpoint-dir"},
      {"train_fashion_mnist --checkpoint-dir /tmp/x --allow-fresh-start", "--allow-fresh-start needs --resume"},
      {"train_cifar10 --model vgg --data-dir /tmp", "--model must be lenet or resnet18"},
      {"train_cifar10", "--data-dir is required"},
      {"train_fashion_mnist --batch-policy elastic", "--batch-policy must be per-rank or global, not 'elastic'"},
      {"train_fashion_mnist --batch-policy global", "--batch-policy global needs --global-batch-size N"},
      {"train_fashion_mnist --global-batch-size 64", "--global-batch-size needs --batch-policy global"},
      {"train_fashion_mnist --diloco 8", "--diloco needs --mode ddp"},
      {"train_fashion_mnist --outer-lr 0.5", "--outer-lr needs --diloco H"},
      {"train_fashion_mnist --mode ddp --diloco 8 --outer-dtype int4", "--outer-dtype must be fp32, bf16, fp16 or int8, not 'int4'"},
      {"train_fashion_mnist --mode ddp --diloco 8 --comm-hook powersgd", "DiLoCo sends no gradients"},
      {"train_fashion_mnist --mode ddp --diloco 8 --diloco-fragments 4 --diloco-delay 2", "--diloco-delay 2 must be less than"},
      {"train_fashion_mnist --mode ddp --diloco 10 --diloco-fragments 3 --diloco-delay 3", "(10 / 3 = 3 steps)"},
      {"train_fashion_mnist --batch-policy global --global-batch-size 100 --grad-accum 3 --limit 64",
       "--global-batch-size 100 does not divide among 1 rank(s) x 3 micro-batch(es)"},
  };
  for (const Case& c : cases) {
    const Run r = run(kBin + "/" + c.arguments);
    INFO(c.arguments);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains(c.message));
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  }
  TempDir empty;
  const Run r = run(kBin + "/train_fashion_mnist --data-dir " + empty.path.string());
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains(empty / "train-images-idx3-ubyte.gz") && Contains("missing"));
}

TEST_CASE("train_cifar10 trains LeNet and ResNet-18 on generated files in the CIFAR-10 format", "[training]") {
  TempDir data, tmp;
  write_cifar10(data.path, 100);
  const std::string program = kBin + "/train_cifar10 --data-dir " + data.path.string();
  Run r = run(program + " --epochs 3 --batch-size 25 --lr 0.02 --metrics-json " + (tmp / "m.json"));
  REQUIRE_SUCCESS(r);
  CHECK_THAT(r.output, Contains("on 500 training samples"));
  const auto losses = json_numbers(read_text(tmp / "m.json"), "epoch_train_loss");
  REQUIRE(losses.size() == 3);
  CHECK(losses[2] < losses[0]);
  r = run(program + " --model resnet18 --limit 64 --epochs 1 --batch-size 32 --metrics-json " + (tmp / "r.json"));
  REQUIRE_SUCCESS(r);
  CHECK_THAT(read_text(tmp / "r.json"), Contains("\"model\": \"resnet18\""));
}

TEST_CASE("mode ddp with no launcher at all: a world of size 1, said once", "[training][ddp]") {
  // The same binary as under ddp_launch, started alone (See Note [Launch sources]).
  const Run alone = run("env -i PATH=/usr/bin:/bin OMP_NUM_THREADS=1 " + kBin +
                        "/train_fashion_mnist --mode ddp --limit 256 --epochs 1 --batch-size 64");
  REQUIRE_SUCCESS(alone);
  CHECK_THAT(alone.output, Contains("no launcher variables (RANK/WORLD_SIZE, Slurm's, MPI's): running alone, a world "
                                    "of size 1"));
  CHECK_THAT(alone.output, Contains("1 process(es)"));
  // A partial set is still an error.
  const Run partial = run("env -i PATH=/usr/bin:/bin RANK=0 " + kBin + "/train_fashion_mnist --mode ddp --limit 64");
  CHECK(partial.exit_code != 0);
  CHECK_THAT(partial.output, Contains("WORLD_SIZE is not set but RANK is"));
}

TEST_CASE("checkpoint on SIGUSR1: ddp_launch forwards SIGUSR1, every rank checkpoints at one step and stops",
          "[training][ddp]") {
  TempDir tmp;
  // 50 epochs: the run cannot end before the signal; it stops at the step after it (exit 128 + 10).
  const std::string log = tmp / "run.log";
  const std::string launch = kBin + "/ddp_launch --nproc_per_node 2 --signals_to_handle SIGTERM,SIGUSR1 " + kBin +
                             "/train_fashion_mnist --mode ddp --limit 512 --epochs 50 --batch-size 32 --checkpoint-dir " +
                             (tmp / "ck") + " --checkpoint-on-signal USR1";
  const Run stopped = run("sh -c '" + launch + " >" + log + " 2>&1 & pid=$!; i=0; " +
                          "until grep -q \"steps per epoch\" " + log + " || [ $i -ge 1200 ]; do sleep 0.1; i=$((i+1)); done; " +
                          "kill -USR1 $pid; wait $pid; status=$?; cat " + log + "; exit $status'");
  INFO(stopped.output);
  CHECK(stopped.exit_code == 128 + 10);
  CHECK_THAT(stopped.output, Contains("received SIGUSR1: forwarding it to 2 workers"));
  REQUIRE_THAT(stopped.output, Contains("signal USR1: checkpoint of step "));
  const std::string after = stopped.output.substr(stopped.output.find("checkpoint of step ") + 19);
  const int step = std::stoi(after);
  char folder[32];
  std::snprintf(folder, sizeof folder, "step-%012d", step);
  CHECK(fs::exists(tmp.path / "ck" / folder / "MANIFEST"));
  CHECK_THAT(stopped.output, !Contains("epoch 50/50"));
}
