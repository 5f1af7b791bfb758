#include "ddp/base/detail/error_file.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "ddp/base/error.h"
#include "ddp/base/detail/files.h"
#include "ddp/base/detail/json_text.h"
#include "ddp/base/detail/report_files.h"

namespace ddp::detail {
namespace {

using Json = nlohmann::json;

std::optional<long long> whole_seconds(double seconds) {
  if (!(std::fabs(seconds) < 9e18)) return std::nullopt;  // NaN, or beyond long long
  return static_cast<long long>(seconds);
}

// torchrun writes the timestamp as a string of seconds; a number is accepted too.
std::optional<long long> to_timestamp(const Json& value) {
  if (value.is_number()) return whole_seconds(value.get<double>());
  if (!value.is_string()) return std::nullopt;
  try {
    std::size_t used = 0;
    const double seconds = std::stod(value.get_ref<const std::string&>(), &used);
    if (used == 0) return std::nullopt;
    return whole_seconds(seconds);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<WorkerError> parse_error_json(const std::string& text) {
  const Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) return std::nullopt;  // discarded (not JSON) or not an object
  const auto message = root.find("message");
  if (message == root.end()) return std::nullopt;
  WorkerError error;
  if (message->is_string()) {
    error.message = message->get<std::string>();
    return error;
  }
  if (!message->is_object()) return std::nullopt;
  const auto inner = message->find("message");
  if (inner == message->end() || !inner->is_string()) return std::nullopt;
  error.message = inner->get<std::string>();
  if (const auto extra = message->find("extraInfo"); extra != message->end() && extra->is_object()) {
    if (const auto stack = extra->find("py_callstack"); stack != extra->end() && stack->is_string()) {
      error.callstack = stack->get<std::string>();
    }
    if (const auto stamp = extra->find("timestamp"); stamp != extra->end()) error.timestamp = to_timestamp(*stamp);
  }
  return error;
}

std::optional<WorkerError> read_error_file(const std::string& path) {
  try {
    return parse_error_json(read_file(path, kMaxErrorFileBytes));
  } catch (const IoError&) {
    return std::nullopt;
  }
}

std::string format_error_json(const WorkerError& error) {
  return str("{\"message\": {\"message\": ", json_string(error.message), ", \"extraInfo\": {\"py_callstack\": ",
             json_string(error.callstack), ", \"timestamp\": ", json_string(std::to_string(error.timestamp.value_or(0))),
             "}}}\n");
}

bool write_error_file(const std::string& path, const WorkerError& error) noexcept {
  try {
    return try_write_file_atomically(path, format_error_json(error), kReportFileMode);
  } catch (...) {
    return false;  // formatting ran out of memory: the caller is failing already
  }
}

}  // namespace ddp::detail
