#include <catch2/catch.hpp>

#include "ddp/runtime/log.h"

TEST_CASE("log levels parse from their names and reject others") {
  CHECK(ddp::parse_log_level("debug") == ddp::LogLevel::kDebug);
  CHECK(ddp::parse_log_level("warning") == ddp::LogLevel::kWarn);
  CHECK(ddp::parse_log_level("off") == ddp::LogLevel::kOff);
  CHECK_FALSE(ddp::parse_log_level("loud").has_value());
  CHECK_FALSE(ddp::parse_log_level("").has_value());
}

TEST_CASE("a rank logger carries the rank and honours its level") {
  auto logger = ddp::Logger::for_rank(3, ddp::LogLevel::kWarn);
  CHECK(logger.tag() == "rank 3");
  CHECK_FALSE(logger.enabled(ddp::LogLevel::kInfo));
  CHECK(logger.enabled(ddp::LogLevel::kError));
  logger.set_level(ddp::LogLevel::kDebug);
  CHECK(logger.enabled(ddp::LogLevel::kDebug));
}
