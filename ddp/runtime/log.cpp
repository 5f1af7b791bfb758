// The only translation unit that includes spdlog: see Note [Logging facade] in ddp/CMakeLists.txt.
#include "ddp/runtime/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace ddp {
namespace {

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::info;
}

}  // namespace

std::optional<LogLevel> parse_log_level(std::string_view text) {
  if (text == "trace") return LogLevel::kTrace;
  if (text == "debug") return LogLevel::kDebug;
  if (text == "info") return LogLevel::kInfo;
  if (text == "warn" || text == "warning") return LogLevel::kWarn;
  if (text == "error") return LogLevel::kError;
  if (text == "off") return LogLevel::kOff;
  return std::nullopt;
}

Logger::Logger(std::string tag, LogLevel level) : tag_(std::move(tag)) {
  // Loggers are not registered in spdlog's global registry: each handle owns its logger, so that
  // two libraries (or two tests) in one process cannot clash on a name.
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>(spdlog::color_mode::never);
  impl_ = std::make_shared<spdlog::logger>(tag_, std::move(sink));
  impl_->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
  impl_->set_level(to_spdlog(level));
  impl_->flush_on(spdlog::level::warn);
}

Logger Logger::for_rank(int rank, LogLevel level) {
  return Logger("rank " + std::to_string(rank), level);
}

void Logger::log(LogLevel level, std::string_view message) const {
  impl_->log(to_spdlog(level), "{}", message);
}

bool Logger::enabled(LogLevel level) const { return impl_->should_log(to_spdlog(level)); }

void Logger::set_level(LogLevel level) { impl_->set_level(to_spdlog(level)); }

}  // namespace ddp
