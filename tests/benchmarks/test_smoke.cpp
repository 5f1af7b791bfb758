// Smoke run of build/bin/ddp_bench and build/bin/allreduce_bench: world size 2 through ddp_launch,
// tiny sizes and a few iterations. Checks the outputs are well-formed (columns, one row per
// configuration, JSON that parses), the correctness column says OK and the figures are positive
// numbers. No timing assertions.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/temp_dir.h"  // a scoped temporary folder

namespace {

const std::string kBin = DDP_TEST_BIN_DIR;

using ddp::testing::TempDir;

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> cells;
  std::stringstream stream(line);
  std::string cell;
  while (std::getline(stream, cell, sep)) cells.push_back(cell);
  if (!line.empty() && line.back() == sep) cells.emplace_back();
  return cells;
}

// The CSV as rows of cells (no quoted cells are expected in these outputs).
std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) rows.push_back(split(line, ','));
  return rows;
}

std::string cell(const std::vector<std::vector<std::string>>& rows, std::size_t row, const std::string& column) {
  const auto& header = rows.front();
  for (std::size_t i = 0; i < header.size(); ++i) {
    if (header[i] == column) return rows.at(row).at(i);
  }
  FAIL("no column " << column);
  return "";
}

int run(const std::string& command) {
  INFO(command);
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The JSON parses and its rows have exactly the CSV's columns, in order (checked by Python's json).
void check_json(const std::string& json, const std::string& csv) {
  std::string python = DDP_TEST_PYTHON;
  if (python.empty()) python = "python3";
  const std::string script =
      "import csv, json, sys\n"
      "doc = json.load(open(sys.argv[1]))\n"
      "header = next(csv.reader(open(sys.argv[2])))\n"
      "assert doc['rows'], 'no rows'\n"
      "for row in doc['rows']: assert list(row) == header, (list(row), header)\n";
  TempDir dir;
  std::ofstream(dir / "check.py") << script;
  CHECK(run(python + " " + dir / "check.py" + " " + json + " " + csv) == 0);
}

bool positive_number(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  return !text.empty() && end == text.c_str() + text.size() && value > 0;
}

// Numbers separated by single spaces, `count` of them, all positive.
bool positive_numbers(const std::string& text, std::size_t count) {
  std::stringstream stream(text);
  std::string item;
  std::size_t n = 0;
  while (std::getline(stream, item, ' ')) {
    if (!positive_number(item)) return false;
    ++n;
  }
  return n == count;
}

bool non_negative_number(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  return !text.empty() && end == text.c_str() + text.size() && value >= 0;
}

}  // namespace

TEST_CASE("ddp_bench: 2 ranks, lenet, two batch sizes -> CSV, JSON and Markdown") {
  TempDir dir;
  const std::string csv = dir / "train.csv", json = dir / "train.json", out = dir / "out.txt";
  REQUIRE(run(kBin + "/ddp_launch --nproc_per_node 2 --master_port 0 " + kBin +
              "/ddp_bench --model lenet --mode ddp --batch 4,8 --warmup 1 --iters 3 --pool-batches 2 --csv " + csv +
              " --json " + json + " > " + out + " 2>&1") == 0);
  const auto rows = read_csv(csv);
  REQUIRE(rows.size() == 3);  // header + 2 batch sizes
  for (const char* column : {"model", "mode", "world_size", "it_per_s", "samples_per_s", "data_ms", "forward_ms",
                             "backward_compute_ms", "comm_wait_ms", "optimizer_ms", "peak_mem_mib", "scaling_eff",
                             "final_loss"}) {
    CHECK(std::find(rows[0].begin(), rows[0].end(), column) != rows[0].end());
  }
  for (std::size_t r = 1; r < rows.size(); ++r) {
    CHECK(rows[r].size() == rows[0].size());
    CHECK(cell(rows, r, "mode") == "ddp");
    CHECK(cell(rows, r, "world_size") == "2");
    CHECK(positive_number(cell(rows, r, "samples_per_s")));
    CHECK(positive_number(cell(rows, r, "peak_mem_mib")));
    CHECK(positive_numbers(cell(rows, r, "peak_mem_per_rank_mib"), 2));
    CHECK(positive_number(cell(rows, r, "final_loss")));
  }
  CHECK(cell(rows, 1, "global_batch") == "8");
  CHECK(cell(rows, 2, "global_batch") == "16");
  check_json(json, csv);
  std::ifstream printed(out);
  std::stringstream text;
  text << printed.rdbuf();
  CHECK(text.str().find("| model | data | mode |") != std::string::npos);  // the Markdown table, printed once
  CHECK(text.str().find("| model | data | mode |", text.str().find("| model | data | mode |") + 1) == std::string::npos);
}

TEST_CASE("ddp_bench: DDP's options reach DDP and are recorded in the ddp_options column") {
  TempDir dir;
  const std::string csv = dir / "options.csv";
  REQUIRE(run(kBin + "/ddp_launch --nproc_per_node 2 --master_port 0 " + kBin +
              "/ddp_bench --model lenet --mode ddp --batch 8 --warmup 1 --iters 3 --pool-batches 2 --no-markdown "
              "--bucket-cap-mb 0.05 --gradient-as-bucket-view --comm-hook bf16_compress --csv " + csv + " > " +
              dir / "out.txt 2>&1") == 0);
  const auto rows = read_csv(csv);
  REQUIRE(rows.size() == 2);
  CHECK(cell(rows, 1, "ddp_options") ==
        "bucket_cap_mb=0.05 gradient_as_bucket_view=1 comm_hook=bf16_compress broadcast_buffers=1");
  CHECK(positive_number(cell(rows, 1, "final_loss")));
  // Single-process modes have no DDP options.
  const std::string single = dir / "single.csv";
  REQUIRE(run(kBin + "/ddp_bench --model lenet --mode single --batch 8 --warmup 0 --iters 1 --pool-batches 1 "
              "--no-markdown --csv " + single + " > " + dir / "out1.txt 2>&1") == 0);
  CHECK(cell(read_csv(single), 1, "ddp_options").empty());
}

TEST_CASE("ddp_bench --data fashion-mnist: 2 ranks through the examples' pipeline, peak memory of each rank") {
  TempDir dir;
  const std::string csv = dir / "real.csv";
  REQUIRE(run(kBin + "/ddp_launch --nproc_per_node 2 --master_port 0 " + kBin +
              "/ddp_bench --model lenet --mode ddp --batch 16 --warmup 1 --iters 3 --data fashion-mnist --no-markdown "
              "--csv " + csv + " > " + dir / "out.txt 2>&1") == 0);
  const auto rows = read_csv(csv);
  REQUIRE(rows.size() == 2);
  CHECK(cell(rows, 1, "data") == "fashion-mnist");
  CHECK(positive_number(cell(rows, 1, "data_ms")));
  CHECK(positive_numbers(cell(rows, 1, "peak_mem_per_rank_mib"), 2));
  CHECK(positive_number(cell(rows, 1, "final_loss")));
  // A missing data folder: a clear error naming the file, not a crash.
  CHECK(run(kBin + "/ddp_bench --model lenet --mode single --iters 1 --data fashion-mnist --data-dir " + dir / "none" +
            " > " + dir / "err.txt 2>&1") != 0);
  std::ifstream err(dir / "err.txt");
  std::stringstream text;
  text << err.rdbuf();
  CHECK(text.str().find(std::string(dir / "none")) != std::string::npos);
}

TEST_CASE("ddp_bench alone: single, dp and ddp at world size 1, with scaling efficiency against single") {
  TempDir dir;
  const std::string csv = dir / "one.csv";
  REQUIRE(run(kBin + "/ddp_bench --model lenet --batch 4 --warmup 1 --iters 2 --pool-batches 1 --no-markdown --csv " +
              csv) == 0);
  const auto rows = read_csv(csv);
  REQUIRE(rows.size() == 4);
  CHECK(cell(rows, 1, "mode") == "single");
  CHECK(cell(rows, 2, "mode") == "dp");
  CHECK(cell(rows, 3, "mode") == "ddp");
  CHECK(positive_number(cell(rows, 3, "scaling_eff")));
}

TEST_CASE("allreduce_bench: 2 ranks, 4 B to 4 KiB, correct everywhere") {
  TempDir dir;
  const std::string csv = dir / "ar.csv", json = dir / "ar.json";
  REQUIRE(run(kBin + "/ddp_launch --nproc_per_node 2 --master_port 0 " + kBin +
              "/allreduce_bench --max-bytes 4096 --warmup 1 --iters 2 --no-markdown --csv " + csv + " --json " + json) ==
          0);
  const auto rows = read_csv(csv);
  REQUIRE(rows.size() == 1 + 11);  // 4, 8, ..., 4096
  for (std::size_t r = 1; r < rows.size(); ++r) {
    CHECK(cell(rows, r, "size_bytes") == std::to_string(4 << (r - 1)));
    CHECK(cell(rows, r, "correct") == "OK");
    CHECK(positive_number(cell(rows, r, "time_us")));
    CHECK(non_negative_number(cell(rows, r, "algbw_GBps")));  // 4 B in ~0.1 ms prints as 0.000040
    CHECK(non_negative_number(cell(rows, r, "busbw_GBps")));
  }
  check_json(json, csv);
}

TEST_CASE("bad flags: one line, exit code 2") {
  TempDir dir;
  CHECK(run(kBin + "/ddp_bench --model vgg 2> " + dir / "err.txt") == 2);
  CHECK(run(kBin + "/allreduce_bench --max-bytes 2 2> " + dir / "err2.txt") == 2);
  std::ifstream err(dir / "err.txt");
  std::string first, second;
  std::getline(err, first);
  CHECK(first.find("unknown value 'vgg'") != std::string::npos);
  CHECK_FALSE(std::getline(err, second));
}

TEST_CASE("collective_log_bench, ddp_micro_bench, launch_startup_bench: the harness's table, correct OK") {
  TempDir dir;
  const std::string csv = dir / "log.csv", json = dir / "log.json";
  REQUIRE(run(kBin + "/collective_log_bench --iters 2000 --warmup 10 --no-markdown --csv " + csv + " --json " + json) == 0);
  auto rows = read_csv(csv);
  REQUIRE(rows.size() == 3);  // header, the ring buffer's record, the all-reduce
  for (std::size_t r = 1; r < rows.size(); ++r) {
    CHECK(cell(rows, r, "correct") == "OK");
    CHECK(positive_number(cell(rows, r, "ns_per_op")));
  }
  check_json(json, csv);

  const std::string micro = dir / "micro.csv";
  REQUIRE(run(kBin + "/ddp_launch --nproc_per_node 2 --master_port 0 " + kBin +
              "/ddp_micro_bench overlap --layers 3 --width 32 --batch 4 --iters 2 --rounds 1 --registration reversed "
              "--no-markdown --csv " + micro + " > /dev/null 2>&1") == 0);
  rows = read_csv(micro);
  REQUIRE(rows.size() == 3);  // header, static and rebuilt buckets
  for (std::size_t r = 1; r < rows.size(); ++r) {
    CHECK(cell(rows, r, "correct") == "OK");  // both layouts reach the same loss
    CHECK(positive_number(cell(rows, r, "step_ms")));
  }

  // launch_startup_bench needs torchrun: the venv's, where there is one.
  std::string python = DDP_TEST_PYTHON;
  const std::string torchrun = python.empty() ? "" : std::filesystem::path(python).parent_path() / "torchrun";
  if (torchrun.empty() || ::access(torchrun.c_str(), X_OK) != 0) return;
  const std::string startup = dir / "startup.csv";
  REQUIRE(run(kBin + "/launch_startup_bench --reps 1 --warmup 0 --nproc 1 --torchrun " + torchrun +
              " --no-markdown --csv " + startup + " > /dev/null") == 0);
  rows = read_csv(startup);
  REQUIRE(rows.size() == 3);  // header, ddp_launch, torchrun
  CHECK(cell(rows, 1, "launcher") == "ddp_launch");
  CHECK(cell(rows, 1, "correct") == "OK");
  CHECK(cell(rows, 2, "correct") == "OK");
}

TEST_CASE("bad flags of the harness's other programs: one line naming the flag, exit code 2") {
  TempDir dir;
  const auto one_line = [&](const std::string& command, const std::string& expected) {
    const std::string err = dir / "err.txt";
    CHECK(run(command + " > /dev/null 2> " + err) == 2);
    std::ifstream in(err);
    std::string first, second;
    std::getline(in, first);
    CHECK_THAT(first, Catch::Contains(expected));
    CHECK_FALSE(std::getline(in, second));
  };
  one_line(kBin + "/collective_log_bench --numel 0", "--numel must be >= 1");
  one_line(kBin + "/collective_log_bench --iters x", "--iters: 'x' is not an integer");
  one_line(kBin + "/ddp_micro_bench overlap --registration sideways", "--registration: unknown value 'sideways'");
  one_line(kBin + "/ddp_micro_bench warp", "unknown benchmark 'warp'");
  one_line(kBin + "/launch_startup_bench --nproc 0", "--nproc must be >= 1");
  one_line(kBin + "/launch_startup_bench --torchrun /nonexistent/torchrun", "no torchrun at /nonexistent/torchrun");
  one_line(kBin + "/gpu_bench --mode warp", "--mode: unknown value 'warp'");
}
