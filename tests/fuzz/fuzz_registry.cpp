// The fuzz targets by name, for the regression test and the seed tool.
#include <stdexcept>

#include "tests/fuzz/fuzz_entries.h"

namespace ddp::fuzz {

const std::vector<std::string>& target_names() {
  static const std::vector<std::string> names = {"idx",       "cifar10",     "checkpoint",     "hostfile",    "ddp_env",
                                                 "rdzv_conf", "environment", "agent_datagram", "store_values"};
  return names;
}

Outcome run_entry(const std::string& target, const std::vector<uint8_t>& input,
                  const std::filesystem::path& scratch) {
  if (target == "idx") return idx_entry(input.data(), input.size(), scratch);
  if (target == "cifar10") return cifar10_entry(input.data(), input.size(), scratch);
  if (target == "checkpoint") return checkpoint_entry(input.data(), input.size(), scratch);
  if (target == "hostfile") return hostfile_entry(input.data(), input.size(), scratch);
  if (target == "ddp_env") return ddp_env_entry(input.data(), input.size(), scratch);
  if (target == "rdzv_conf") return rdzv_conf_entry(input.data(), input.size(), scratch);
  if (target == "environment") return environment_entry(input.data(), input.size(), scratch);
  if (target == "agent_datagram") return agent_datagram_entry(input.data(), input.size(), scratch);
  if (target == "store_values") return store_values_entry(input.data(), input.size(), scratch);
  throw std::invalid_argument("unknown fuzz target '" + target + "'");
}

void write_seed_corpus(const std::filesystem::path& corpus, const std::string& fashion_mnist_dir) {
  write_reader_seeds(corpus, fashion_mnist_dir);
  write_checkpoint_seeds(corpus, corpus / ".scratch");
  write_launcher_seeds(corpus);
  std::filesystem::remove_all(corpus / ".scratch");
}

}  // namespace ddp::fuzz
