#pragma once
// Runs a shell command line under timeout(1) (a hung run fails the test instead of blocking it)
// and returns its exit code and its output (stdout and stderr together).
#include <sys/wait.h>

#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

namespace ddp::testing {

#ifdef DDP_TEST_BIN_DIR
// The build's bin folder (the programs a test runs), in the targets that define it.
inline const std::string kBinDir = DDP_TEST_BIN_DIR;
#endif

struct CommandRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

inline CommandRun run_command(const std::string& command, int timeout_seconds = 120) {
  const std::string line = "timeout -k 5 " + std::to_string(timeout_seconds) + " " + command + " 2>&1";
  FILE* pipe = popen(line.c_str(), "r");
  REQUIRE(pipe != nullptr);
  CommandRun result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace ddp::testing
