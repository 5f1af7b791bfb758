#pragma once
// The error file a worker writes when it fails (TORCHELASTIC_ERROR_FILE), in torchrun's format:
//   {"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "1700000000"}}}
// A plain string message ({"message": "..."}) is accepted too.
#include <optional>
#include <string>

namespace ddp {

struct WorkerError {
  std::string message;
  std::string callstack;                 // extraInfo.py_callstack, if any
  std::optional<long long> timestamp;    // extraInfo.timestamp (seconds since the epoch), if any
};

// Parses an error file's text. Returns nullopt when it is not one (not JSON, no "message").
std::optional<WorkerError> parse_error_json(const std::string& text);

// Reads and parses the file; nullopt when it is missing, empty or malformed.
std::optional<WorkerError> read_error_file(const std::string& path);

// The JSON text torchrun's readers understand.
std::string format_error_json(const WorkerError& error);

// Writes format_error_json() to path atomically (write to a temporary, then rename).
// Returns false when it cannot.
bool write_error_file(const std::string& path, const WorkerError& error);

}  // namespace ddp
