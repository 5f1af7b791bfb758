#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/runtime/version.h"

TEST_CASE("str concatenates mixed values and join separates them") {
  CHECK(ddp::str("rank ", 3, " of ", 4.5) == "rank 3 of 4.5");
  CHECK(ddp::str() == "");
  CHECK(ddp::join(std::vector<int>{1, 2, 3}, ", ") == "1, 2, 3");
  CHECK(ddp::join(std::vector<int>{}, ", ") == "");
}

TEST_CASE("comparison checks print both values and the message") {
  const int world_size = 4;
  const int rank = 7;
  try {
    DDP_CHECK_LT(rank, world_size, "rank must be below the world size");
    FAIL("DDP_CHECK_LT did not throw");
  } catch (const ddp::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("rank < world_size") != std::string::npos);
    CHECK(what.find("(7 vs. 4)") != std::string::npos);
    CHECK(what.find("rank must be below the world size") != std::string::npos);
  }
  CHECK_NOTHROW([&] { DDP_CHECK_EQ(world_size, 4); }());
  CHECK_THROWS_AS([&] { DDP_CHECK(world_size == 5); }(), ddp::Error);
}

TEST_CASE("the hierarchy lets callers catch every project error as ddp::Error") {
  CHECK_THROWS_AS(throw ddp::TimeoutError("waited 30 s"), ddp::Error);
  CHECK_THROWS_AS(throw ddp::InvalidArgument("bad flag"), std::runtime_error);
}

TEST_CASE("version strings are filled in at build time") {
  CHECK(ddp::version() == DDP_TEST_EXPECTED_VERSION);
  CHECK(ddp::torch_version().rfind("2.", 0) == 0);
  // What LibTorch's CMake config said (CAFFE2_USE_CUDA): a CUDA wheel reports CUDA without a GPU.
  CHECK(ddp::built_with_cuda() == DDP_TEST_EXPECTED_CUDA);
  CHECK(ddp::built_with_nccl() == DDP_TEST_EXPECTED_CUDA);
}
