// examples/mnist_port/mnist_port.cpp, built against the installed package by tests/package (the
// fixture mnist_port_built), on generated MNIST files: it trains under ddp_launch --standalone on 2
// ranks with the same parameters on every rank, its '\r' progress keeps a rank prefix per update,
// an uncaught exception reaches the launcher's failure summary, and it runs alone.
#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"

using ddp::testing::run_command;
using ddp::testing::TempDir;

namespace {

const std::string kLaunch = DDP_LAUNCH_BIN;
const std::string kPort = DDP_MNIST_PORT_BIN;

void write_u32(std::ofstream& out, uint32_t v) {
  const char bytes[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                         static_cast<char>(v)};
  out.write(bytes, 4);
}

// n learnable images: digit d is a bright 6x6 square at a place of its own, over faint noise.
void write_mnist(const std::string& dir, const std::string& prefix, uint32_t n) {
  std::ofstream images(dir + "/" + prefix + "-images-idx3-ubyte", std::ios::binary);
  std::ofstream labels(dir + "/" + prefix + "-labels-idx1-ubyte", std::ios::binary);
  write_u32(images, 0x803);
  write_u32(images, n);
  write_u32(images, 28);
  write_u32(images, 28);
  write_u32(labels, 0x801);
  write_u32(labels, n);
  uint32_t state = 12345;
  for (uint32_t i = 0; i < n; ++i) {
    const int digit = static_cast<int>(i % 10);
    std::vector<char> pixels(28 * 28);
    for (auto& p : pixels) {
      state = state * 1664525u + 1013904223u;
      p = static_cast<char>(state >> 27);  // 0..31
    }
    const int row = 2 + (digit / 5) * 12, col = 1 + (digit % 5) * 5;
    for (int r = row; r < row + 6; ++r) {
      for (int c = col; c < col + 6 && c < 28; ++c) pixels[r * 28 + c] = static_cast<char>(230);
    }
    images.write(pixels.data(), static_cast<std::streamsize>(pixels.size()));
    labels.put(static_cast<char>(digit));
  }
}

std::string data_folder(const TempDir& dir) {
  const std::string data = dir / "data";
  std::filesystem::create_directory(data);
  write_mnist(data, "train", 1600);  // 13 batches of 64 per rank on 2 ranks: 2 progress updates each
  write_mnist(data, "t10k", 200);
  return data;
}

// `command` run in `dir` (the program reads ./data), through sh: timeout(1) runs programs, not `cd`.
std::string in_dir(const TempDir& dir, const std::string& command) {
  return "sh -c 'cd " + dir.path.string() + " && " + command + "'";
}

// Splits at '\n' and '\r'.
std::vector<std::string> pieces(const std::string& text) {
  std::vector<std::string> out(1);
  for (char c : text) {
    if (c == '\n' || c == '\r') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("mnist port: trains on 2 ranks under ddp_launch --standalone, every rank with the same parameters",
          "[examples][mnist_port]") {
  TempDir dir;
  data_folder(dir);
  const auto run = run_command(in_dir(dir, kLaunch + " --standalone --nproc_per_node 2 " + kPort));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  // Each rank evaluates its own model on the whole test set after each epoch: equal lines mean
  // equal parameters (different ones give a different loss in the 4th decimal).
  std::map<std::string, std::vector<std::string>> tests;
  int progress = 0;
  for (const auto& piece : pieces(run.output)) {
    for (const std::string rank : {"[rank 0]: ", "[rank 1]: "}) {
      if (piece.rfind(rank + "Test set:", 0) == 0) tests[rank].push_back(piece.substr(rank.size()));
    }
    // Every '\r' update keeps its prefix (See Note [Progress lines]).
    if (piece.find("Train Epoch") != std::string::npos) {
      CHECK(piece.rfind("[rank ", 0) == 0);
      CHECK(piece.find("Train Epoch") == piece.rfind("Train Epoch"));
      ++progress;
    }
  }
  CHECK(tests["[rank 0]: "].size() == 3);
  CHECK(tests["[rank 0]: "] == tests["[rank 1]: "]);
  CHECK(progress >= 2 * 3 * 2);  // 2 ranks, 3 epochs, 2 updates each
}

TEST_CASE("mnist port: an uncaught exception reaches the launcher's failure summary", "[examples][mnist_port]") {
  TempDir dir;  // no data: the dataset throws, nothing in the program catches it
  const auto run = run_command(in_dir(dir, kLaunch + " --standalone --nproc_per_node 1 " + kPort));
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("message   : cannot open ./data/train-images-idx3-ubyte") != std::string::npos);
}

// Needs init_process_group() without launcher variables to give a world of one (issue 19).
TEST_CASE("mnist port: the same binary runs alone, without a launcher", "[alone]") {
  TempDir dir;
  data_folder(dir);
  const auto run = run_command(in_dir(dir, "env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT " + kPort));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  int tests = 0;
  for (const auto& piece : pieces(run.output)) tests += piece.rfind("Test set:", 0) == 0;
  CHECK(tests == 3);
}
