// Joining a job (ddp/distributed/detail/join_wait.h, See Note [Waiting is never silent]): the join timeout from the
// environment, the sliced wait with notices, the notice lines, and init_process_group's waits for
// an unreachable master and for missing ranks (one process, a short join timeout).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "ddp/base/error.h"
#include "ddp/distributed/detail/join_wait.h"
#include "ddp/distributed/process_group.h"
#include "launcher/process/net.h"
#include "tests/support/env_of.h"
#include "tests/support/temp_dir.h"

using namespace std::chrono_literals;
using std::chrono::milliseconds;

using ddp::testing::env_of;

namespace {

// Runs f with this process's stderr going to a file; returns what was written there.
template <class F>
std::string capture_stderr(F&& f) {
  ddp::testing::TempDir dir;
  const std::string path = dir / "stderr.txt";
  std::fflush(stderr);
  const int saved = ::dup(2);
  std::FILE* file = std::fopen(path.c_str(), "w");
  ::dup2(::fileno(file), 2);
  try {
    f();
  } catch (...) {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    std::fclose(file);
    throw;
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(file);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("join timeout: DDP_JOIN_TIMEOUT in seconds, else 600 s; a bad value names the variable", "[join]") {
  CHECK(ddp::detail::join_timeout_from_environment(env_of({})) == 600s);
  CHECK(ddp::detail::join_timeout_from_environment(env_of({{"DDP_JOIN_TIMEOUT", "42.5"}})) == 42500ms);
  for (const char* bad : {"abc", "0", "-3", "5s"}) {
    INFO(bad);
    try {
      ddp::detail::join_timeout_from_environment(env_of({{"DDP_JOIN_TIMEOUT", bad}}));
      FAIL("accepted");
    } catch (const ddp::InvalidArgument& error) {
      CHECK(std::string(error.what()).find("DDP_JOIN_TIMEOUT='") == 0);
    }
  }
}

TEST_CASE("join wait: slices of at most the notice interval, one notice after each failed slice", "[join]") {
  int attempts = 0, notices = 0;
  const bool joined = ddp::detail::wait_with_notices(
      1h, 5s,
      [&](milliseconds slice) {
        CHECK(slice <= 5s);
        return ++attempts == 4;
      },
      [&](milliseconds) { ++notices; });
  CHECK(joined);
  CHECK(attempts == 4);
  CHECK(notices == 3);
  // Never successful: false once the timeout has passed, each slice bounded by what is left.
  int longer = 0;
  const bool never = ddp::detail::wait_with_notices(
      20ms, 5s,
      [&](milliseconds slice) {
        longer += slice > 20ms;
        std::this_thread::sleep_for(slice);
        return false;
      },
      [](milliseconds) {});
  CHECK_FALSE(never);
  CHECK(longer == 0);
}

TEST_CASE("join wait: the notices say who waits for whom, where, how long and what to check", "[join]") {
  const auto unreachable = ddp::detail::master_unreachable_notice(3, "10.0.0.1:29500", 20s, 600s);
  CHECK(unreachable.find("rank 3 has waited 20 s for the master (rank 0) at 10.0.0.1:29500") == 0);
  CHECK(unreachable.find("join timeout 600 s") != std::string::npos);
  CHECK(unreachable.find("DDP_JOIN_TIMEOUT") != std::string::npos);
  CHECK(unreachable.find("MASTER_PORT") != std::string::npos);
  const auto missing = ddp::detail::waiting_for_ranks_notice({1, 3}, 4, "127.0.0.1:29500", 10s, 600s);
  CHECK(missing.find("rank 0 (the master, at 127.0.0.1:29500) has waited 10 s for ranks 1, 3 of 4 to join") == 0);
  std::vector<int> many;
  for (int r = 1; r < 40; ++r) many.push_back(r);
  CHECK(ddp::detail::waiting_for_ranks_notice(many, 40, "h:1", 10s, 600s).find("16 and 23 more of 40") != std::string::npos);
  CHECK(ddp::detail::waiting_for_rank0_notice(2, "h:1", 10s, 600s).find("rank 2 has waited 10 s for rank 0 to join at h:1") ==
        0);
}

TEST_CASE("init_process_group: an unreachable master and a missing rank are reported while waiting", "[join]") {
  ddp::InitOptions options;
  options.backend = "gloo";
  options.world_size = 2;
  options.join_timeout = 1500ms;
  options.wait_notice_interval = 100ms;
  options.timeout = 30s;
  // Rank `rank` of 2 joins alone on a free port; returns {the error it failed with, its stderr}.
  const auto join_alone = [&](int rank, int port) {
    options.init_method = "tcp://127.0.0.1:" + std::to_string(port);
    options.rank = rank;
    std::string error;
    const std::string err = capture_stderr([&] {
      try {
        ddp::init_process_group(options);
      } catch (const ddp::Error& e) {
        error = e.what();
      }
    });
    return std::make_pair(error, err);
  };
  const int port1 = ddp::launcher::process::pick_free_port("127.0.0.1");  // nothing listens there
  const auto [error1, err1] = join_alone(1, port1);
  CHECK(error1.find("within the join timeout of 1.5 s") != std::string::npos);
  CHECK(err1.find("rank 1 has waited") != std::string::npos);
  CHECK(err1.find("for the master (rank 0) at 127.0.0.1:" + std::to_string(port1)) != std::string::npos);
  const int port0 = ddp::launcher::process::pick_free_port("127.0.0.1");
  const auto [error0, err0] = join_alone(0, port0);
  CHECK(error0.find("rank 0 waited 1.5 s for rank 1 to join") != std::string::npos);
  CHECK(err0.find("rank 0 (the master, at 127.0.0.1:" + std::to_string(port0) + ") has waited") != std::string::npos);
  CHECK(err0.find("for rank 1 of 2 to join") != std::string::npos);
}
