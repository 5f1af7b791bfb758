#include <catch2/catch.hpp>

#include "ddp/log.h"

TEST_CASE("log levels parse from their names and reject others") {
  CHECK(ddp::parse_log_level("debug") == ddp::LogLevel::debug);
  CHECK(ddp::parse_log_level("warning") == ddp::LogLevel::warn);
  CHECK(ddp::parse_log_level("off") == ddp::LogLevel::off);
  CHECK_FALSE(ddp::parse_log_level("loud").has_value());
  CHECK_FALSE(ddp::parse_log_level("").has_value());
}

TEST_CASE("a rank logger carries the rank and honours its level") {
  auto logger = ddp::Logger::for_rank(3, ddp::LogLevel::warn);
  CHECK(logger.tag() == "rank 3");
  CHECK_FALSE(logger.enabled(ddp::LogLevel::info));
  CHECK(logger.enabled(ddp::LogLevel::error));
  logger.set_level(ddp::LogLevel::debug);
  CHECK(logger.enabled(ddp::LogLevel::debug));
}
