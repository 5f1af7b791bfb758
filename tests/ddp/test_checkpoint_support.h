#pragma once
// What the checkpoint tests share: a small model with a buffer, training steps, comparisons, files,
// and running the build's Python (DDP_PYTHON, empty when there is none).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/checkpoint/checkpoint.h"
#include "tests/support/temp_dir.h"

namespace ddp::testing::checkpoint {
namespace fs = std::filesystem;

struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Linear fc2{nullptr};
};

inline void train_steps(Mlp& model, torch::optim::Optimizer& optimizer, int steps, int seed) {
  torch::manual_seed(seed);
  for (int i = 0; i < steps; ++i) {
    optimizer.zero_grad();
    const auto x = torch::randn({6, 4});
    model.forward(x).pow(2).mean().backward();
    optimizer.step();
  }
}

inline void require_same_state(const ddp::StateDict& a, const ddp::StateDict& b) {
  REQUIRE(a.keys() == b.keys());
  for (const auto& item : a) {
    INFO(item.key());
    const torch::Tensor& other = b[item.key()];
    CHECK(item.value().dtype() == other.dtype());
    CHECK(item.value().sizes() == other.sizes());
    CHECK(torch::equal(item.value().cpu(), other.cpu()));
  }
}

inline std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), {});
}

inline void write_bytes(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<long>(bytes.size()));
}

// Runs `script` with DDP_PYTHON; its stdout goes into the returned string. nullopt: no Python.
inline std::optional<std::string> run_python(const std::string& script, const fs::path& folder) {
  const std::string python = DDP_PYTHON;
  if (python.empty()) return std::nullopt;
  const fs::path script_file = folder / "script.py";
  const fs::path output_file = folder / "python_output.txt";
  std::ofstream(script_file) << script;
  const std::string command =
      python + " " + script_file.string() + " > " + output_file.string() + " 2>/dev/null";
  if (std::system(command.c_str()) != 0) return std::nullopt;
  std::ifstream in(output_file);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Whether the build named a Python (DDP_PYTHON); tests that need one are skipped without.
inline bool have_python() { return !std::string(DDP_PYTHON).empty(); }

// The message of the ddp::IoError that f throws (other exceptions propagate and fail the test).
template <typename F>
inline std::string io_error_of(F&& f) {
  try {
    f();
  } catch (const ddp::IoError& e) {
    return e.what();
  }
  return "(no ddp::IoError was thrown)";
}

}  // namespace ddp::testing::checkpoint
