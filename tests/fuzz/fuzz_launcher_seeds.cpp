// Writes the launcher fuzz targets' seeds into CORPUS/<target>/ (scripts/fuzz.sh, before fuzzing them).
#include <cstdio>

#include "tests/fuzz/fuzz_entries.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_launcher_seeds CORPUS\n");
    return 2;
  }
  ddp::fuzz::write_launcher_seeds(argv[1]);
  return 0;
}
