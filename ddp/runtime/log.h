#pragma once
// Logging for the library, the examples and the benchmarks: every line carries the rank.
// Backed by spdlog in log.cpp only; see Note [Logging facade] in ddp/CMakeLists.txt.
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace spdlog {
class logger;
}

namespace ddp {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// Parses "trace", "debug", "info", "warn", "error" or "off"; nullopt for anything else.
std::optional<LogLevel> parse_log_level(std::string_view text);

// A cheap, copyable handle on a named logger. Lines look like
//   [2026-11-21 04:25:45.123] [rank 3] [info] message
class Logger {
 public:
  // tag is what stands in the second bracket, e.g. "rank 3" or "launcher".
  explicit Logger(std::string tag, LogLevel level = LogLevel::kInfo);
  // The logger of a training process: tag "rank N".
  static Logger for_rank(int rank, LogLevel level = LogLevel::kInfo);

  void log(LogLevel level, std::string_view message) const;
  void trace(std::string_view message) const { log(LogLevel::kTrace, message); }
  void debug(std::string_view message) const { log(LogLevel::kDebug, message); }
  void info(std::string_view message) const { log(LogLevel::kInfo, message); }
  void warn(std::string_view message) const { log(LogLevel::kWarn, message); }
  void error(std::string_view message) const { log(LogLevel::kError, message); }

  bool enabled(LogLevel level) const;
  void set_level(LogLevel level);
  const std::string& tag() const { return tag_; }

 private:
  std::string tag_;
  std::shared_ptr<spdlog::logger> impl_;
};

}  // namespace ddp
