#pragma once
// JSON string escaping, shared by run_main's error file and the launcher (torch-free, header-only).
#include <cstdio>
#include <string>

namespace ddp {

// Escapes text for use inside a JSON string literal (quotes, backslashes, control characters).
inline std::string json_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
          out += buffer;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

// The error file of a failed worker in torchrun's format (TORCHELASTIC_ERROR_FILE), which
// ddp_launch's and torchrun's failure summaries read:
//   {"message": {"message": M, "extraInfo": {"py_callstack": C, "timestamp": "T"}}}
inline std::string torchelastic_error_json(const std::string& message, const std::string& callstack,
                                           long long unix_seconds) {
  return "{\"message\": {\"message\": \"" + json_escape(message) + "\", \"extraInfo\": {\"py_callstack\": \"" +
         json_escape(callstack) + "\", \"timestamp\": \"" + std::to_string(unix_seconds) + "\"}}}\n";
}

}  // namespace ddp
