#pragma once
// Note [Error file]
// ~~~~~~~~~~~~~~~~~
// torchrun-compatible launchers (ddp_launch, torchrun) set TORCHELASTIC_ERROR_FILE for each worker
// and, when a worker fails, print the message found in that file in their failure summary.
// run_main writes it when main throws, in torchrun's format:
//   {"message": {"message": "<what>", "extraInfo": {"py_callstack": "<type>: <what>",
//                                                   "timestamp": "<unix seconds>"}}}
// atomically (a launcher that reads it while the worker dies sees all of it or nothing); the format,
// the writer and the reader live in ddp/base/detail/error_file.h, the variable's name in ddp/base/worker_variable_names.h.
#include <exception>
#include <functional>
#include <string>

namespace ddp {

// Optional since init_process_group reports uncaught exceptions too (See Note [Uncaught exceptions
// in a worker] in ddp/runtime/uncaught_exception.h); run_main also covers a failure before it.
// Runs main_fn(argc, argv) and returns its exit code. When it throws, logs the error to stderr,
// writes the error file (if TORCHELASTIC_ERROR_FILE is set) and returns 1.
int run_main(int argc, char** argv, std::function<int(int, char**)> main_fn);

// Writes the error file for `error` when the launcher asked for one (TORCHELASTIC_ERROR_FILE is set),
// as run_main and the handler of Note [Uncaught exceptions in a worker] (ddp/runtime/uncaught_exception.h) do.
void write_error_file_if_requested(const std::exception& error);

// The JSON document run_main writes for an exception of (demangled) type `type` and message `what`.
std::string error_file_json(const std::string& type, const std::string& what, long long unix_seconds);

// Writes error_file_json to `path` atomically; returns false (and says why on stderr) when it cannot.
bool write_error_file(const std::string& path, const std::exception& error);

}  // namespace ddp
