// fuzz_launcher_seeds CORPUS [FASHION_MNIST_DIR]: writes the seeds of the torch-free fuzz targets into
// CORPUS/<target>/: the launcher's, and with FASHION_MNIST_DIR the IDX and CIFAR-10 readers' (scripts/fuzz.sh,
// when no target needs LibTorch: fuzz_seeds writes the checkpoint's too, and needs the library).
#include <cstdio>
#include <exception>

#include "tests/fuzz/fuzz_entries.h"

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: fuzz_launcher_seeds CORPUS [FASHION_MNIST_DIR]\n");
    return 2;
  }
  try {
    ddp::fuzz::write_launcher_seeds(argv[1]);
    if (argc == 3) ddp::fuzz::write_reader_seeds(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_launcher_seeds: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
