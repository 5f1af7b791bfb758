#pragma once
// The error file a worker writes when it fails (TORCHELASTIC_ERROR_FILE), in torchrun's format:
//   {"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "1700000000"}}}
// A plain string message ({"message": "..."}) is accepted too. The one writer (atomic, through
// ddp/base/detail/files.h) and the one reader: run_main writes it, ddp_launch's failure summary reads it.
// See Note [Error file] in ddp/runtime/run_main.h.
#include <cstddef>
#include <optional>
#include <string>

namespace ddp::detail {

struct WorkerError {
  std::string message;
  std::string callstack;                 // extraInfo.py_callstack, if any
  std::optional<long long> timestamp;    // extraInfo.timestamp (seconds since the epoch), if any
};

// The largest error file read_error_file reads (a Python traceback fits many times over); a larger
// one is treated as malformed rather than read into memory.
inline constexpr std::size_t kMaxErrorFileBytes = 4u << 20;

// Parses an error file's text. Returns nullopt when it is not one (not JSON, no "message").
std::optional<WorkerError> parse_error_json(const std::string& text);

// Reads and parses the file; nullopt when it is missing, empty, malformed, not a regular file or
// larger than kMaxErrorFileBytes.
std::optional<WorkerError> read_error_file(const std::string& path);

// The JSON text torchrun's readers understand (a missing timestamp is written as "0").
std::string format_error_json(const WorkerError& error);

// Writes format_error_json() to path atomically (write_file_atomically: readers see the whole file
// or none, a planted symlink is replaced, never followed). Returns false when it cannot.
bool write_error_file(const std::string& path, const WorkerError& error) noexcept;

}  // namespace ddp::detail
