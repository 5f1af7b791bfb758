// ddp/runtime/uncaught_exception.h (See Note [Uncaught exceptions in a worker]): in a forked child, an
// exception that leaves the program after the handler is installed exits 1 and lands in the error
// file; a termination without an exception still aborts.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "ddp/base/detail/error_file.h"
#include "ddp/runtime/uncaught_exception.h"
#include "tests/support/temp_dir.h"

namespace {

// Runs body in a child process; returns its wait status.
template <class F>
int in_child(F&& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(2);                 // the child's messages are not the test's output
    ::signal(SIGABRT, SIG_DFL);  // Catch's fatal-signal handler is the parent's business
    body();
    std::_Exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

void throw_uncaught(const std::string& message) {
  ddp::install_uncaught_exception_handler();
  ddp::install_uncaught_exception_handler();  // idempotent
  // On a thread of its own nothing catches it (on this one, Catch would): std::terminate.
  std::thread([message] { throw std::runtime_error(message); }).join();
}

}  // namespace

TEST_CASE("uncaught exception: exit code 1 and the message in the error file", "[uncaught]") {
  ddp::testing::TempDir dir;
  const std::string error_file = dir / "error.json";
  const int status = in_child([&] {
    ::setenv("TORCHELASTIC_ERROR_FILE", error_file.c_str(), 1);
    throw_uncaught("Error opening images file at ./data/train-images-idx3-ubyte");
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  const auto error = ddp::detail::read_error_file(error_file);
  REQUIRE(error);
  CHECK(error->message == "Error opening images file at ./data/train-images-idx3-ubyte");
  CHECK(error->callstack.find("std::runtime_error") == 0);
}

TEST_CASE("uncaught exception: std::terminate without an exception still aborts", "[uncaught]") {
  const int status = in_child([] {
    ddp::install_uncaught_exception_handler();
    std::terminate();
  });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
}
