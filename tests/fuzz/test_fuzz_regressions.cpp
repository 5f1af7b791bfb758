// The fuzz targets' entry points in the normal build: the seed corpus (real data) parses, every input
// under tests/fuzz/regressions/<target>/ (crashes the fuzzers found, and hand-made malformed files)
// parses or is rejected with a one-line ddp::Error, and the hand-made ones are rejected for the
// reason they were made for.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "examples/data/fashion_mnist.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using ddp::testing::TempDir;
using namespace ddp::fuzz;

namespace {

const fs::path kRegressions = DDP_FUZZ_REGRESSIONS_DIR;

std::vector<fs::path> files_in(const fs::path& folder) {
  std::vector<fs::path> files;
  if (!fs::is_directory(folder)) return files;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (entry.is_regular_file() && entry.path().filename().string().front() != '.') files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// What a hand-made input under regressions/ must be rejected with (a part of the message).
const std::map<std::string, std::string> kExpectedErrors = {
    {"idx/truncated-header", "truncated"},
    {"idx/wrong-magic", "wrong magic number"},
    {"idx/dims-overflow-size", "the header promises"},
    {"idx/dims-overflow-size-gzip", "the header promises"},
    {"idx/corrupt-gzip", "gzip"},
    {"cifar10/empty", "empty"},
    {"cifar10/half-record", "truncated"},
    {"cifar10/label-10", "label 10 of record 1"},
    {"checkpoint/manifest-path-escape", "not a plain file name"},
    {"checkpoint/manifest-no-model", "does not list model.pt"},
    {"checkpoint/manifest-bad-size", "malformed"},
    {"checkpoint/model-not-zip", "truncated or corrupt"},
    {"checkpoint/pickle-numel-overflow", "the pickle promises"},
    {"checkpoint/pickle-size-overflow", "runs past its storage"},
    {"checkpoint/pickle-deep-nesting", "is not a tensor by name"},
    {"checkpoint/pickle-self-cycle", "contain itself"},
    {"checkpoint/trainer-not-zip", "cannot load the training state"},
    {"checkpoint/manifest-v2-cut", "cut or edited"},
    {"checkpoint/manifest-v2-end-count", "counts 99 lines"},
    {"checkpoint/manifest-body-bad-size", "malformed"},
    {"checkpoint/manifest-body-upper-hex", "malformed"},
    {"checkpoint/optimizer-no-groups", "0 param groups, the optimizer 1"},
    {"checkpoint/optimizer-missing-lr", "'lr' is missing"},
    {"checkpoint/optimizer-params-mismatch", "does not list the optimizer's 2 parameters"},
    {"checkpoint/optimizer-state-not-tensor", "'momentum_buffer' is not a tensor"},
    {"checkpoint/optimizer-betas-not-pair", "'betas' is not a pair of numbers"},
    {"checkpoint/trainer-no-epoch", "entry 'epoch' is missing"},
    {"checkpoint/trainer-reduce-system", "Python object of type posix.system"},
    {"hostfile/hosts-control-bytes", "--hosts 'note1hosts\\x0ano\\x00"},
    {"store_values/members-leading-zero", "not a member list"},
    {"rdzv_conf/unknown-key-with-newline", "--rdzv_conf: unknown key 'keep_alive_\\x0aax_attempt'"},
};

}  // namespace

TEST_CASE("the seed corpus made from real data parses in every fuzz target", "[fuzz]") {
  TempDir corpus;
  TempDir scratch;
  write_seed_corpus(corpus.path, ddp::examples::data::kFashionMnistDefaultDir);
  for (const std::string& target : target_names()) {
    const auto seeds = files_in(corpus.path / target);
    CHECK(seeds.size() >= 2);
    for (const auto& seed : seeds) {
      INFO(target << " seed " << seed.filename().string());
      const Outcome outcome = run_entry(target, read_file(seed), scratch.path);
      CHECK(outcome.error == "");
      CHECK(outcome.parsed);
    }
  }
}

TEST_CASE("every regression input parses or is rejected with a one-line ddp::Error", "[fuzz]") {
  TempDir scratch;
  size_t checked = 0;
  for (const std::string& target : target_names()) {
    for (const auto& file : files_in(kRegressions / target)) {
      const std::string name = target + "/" + file.filename().string();
      INFO("input " << name);
      Outcome outcome;
      // Anything but ddp::Error escapes (std::logic_error: a parsed result that breaks an invariant).
      REQUIRE_NOTHROW(outcome = run_entry(target, read_file(file), scratch.path));
      const auto expected = kExpectedErrors.find(name);
      if (expected != kExpectedErrors.end()) {
        CHECK_FALSE(outcome.parsed);
        CHECK_THAT(outcome.error, Catch::Matchers::Contains(expected->second));
      }
      ++checked;
    }
  }
  // Every hand-made input is there (a renamed file would silently check nothing).
  for (const auto& [name, error] : kExpectedErrors) {
    INFO("hand-made input " << name);
    CHECK(fs::is_regular_file(kRegressions / name));
  }
  CHECK(checked >= kExpectedErrors.size());
}
