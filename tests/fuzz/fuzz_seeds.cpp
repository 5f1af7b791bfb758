// fuzz_seeds <corpus folder> <Fashion-MNIST folder>: writes the seed corpus of every fuzz target
// into <corpus folder>/<target>/ (scripts/fuzz.sh).
#include <exception>
#include <iostream>

#include "tests/fuzz/fuzz_entries.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fuzz_seeds <corpus folder> <Fashion-MNIST folder>\n";
    return 2;
  }
  try {
    ddp::fuzz::write_seed_corpus(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "fuzz_seeds: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
