// The fuzz targets by name, for the regression test and the seed tool.
#include <stdexcept>

#include "tests/fuzz/fuzz_entries.h"

namespace ddp::fuzz {

const std::vector<std::string>& target_names() {
  static const std::vector<std::string> names = {"idx", "cifar10", "checkpoint"};
  return names;
}

Outcome run_entry(const std::string& target, const std::vector<uint8_t>& input,
                  const std::filesystem::path& scratch) {
  if (target == "idx") return idx_entry(input.data(), input.size(), scratch);
  if (target == "cifar10") return cifar10_entry(input.data(), input.size(), scratch);
  if (target == "checkpoint") return checkpoint_entry(input.data(), input.size(), scratch);
  throw std::invalid_argument("unknown fuzz target '" + target + "'");
}

void write_seed_corpus(const std::filesystem::path& corpus, const std::string& fashion_mnist_dir) {
  write_reader_seeds(corpus, fashion_mnist_dir);
  write_checkpoint_seeds(corpus, corpus / ".scratch");
  std::filesystem::remove_all(corpus / ".scratch");
}

}  // namespace ddp::fuzz
