#include "ddp/base/error_file.h"

#include "ddp/json.h"
#include "ddp/json_reader.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

namespace ddp {
namespace {

using ddp::Json;
using ddp::JsonParser;

std::optional<long long> to_timestamp(const Json* j) {
  if (j == nullptr || (j->type != Json::Type::kString && j->type != Json::Type::kNumber)) return std::nullopt;
  try {
    size_t used = 0;
    const double v = std::stod(j->text, &used);
    if (used == 0) return std::nullopt;
    return static_cast<long long>(v);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<WorkerError> parse_error_json(const std::string& text) {
  Json root;
  if (!JsonParser(text).parse(root)) return std::nullopt;
  const Json* message = root.field("message");
  if (message == nullptr) return std::nullopt;
  WorkerError error;
  if (message->type == Json::Type::kString) {
    error.message = message->text;
    return error;
  }
  if (message->type != Json::Type::kObject) return std::nullopt;
  const Json* inner = message->field("message");
  if (inner == nullptr || inner->type != Json::Type::kString) return std::nullopt;
  error.message = inner->text;
  if (const Json* extra = message->field("extraInfo")) {
    if (const Json* stack = extra->field("py_callstack"); stack && stack->type == Json::Type::kString) {
      error.callstack = stack->text;
    }
    error.timestamp = to_timestamp(extra->field("timestamp"));
  }
  return error;
}

std::optional<WorkerError> read_error_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream buf;
  buf << in.rdbuf();
  return parse_error_json(buf.str());
}

std::string format_error_json(const WorkerError& error) {
  return ddp::torchelastic_error_json(error.message, error.callstack, error.timestamp.value_or(0));
}

bool write_error_file(const std::string& path, const WorkerError& error) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out << format_error_json(error);
    if (!out.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace ddp
