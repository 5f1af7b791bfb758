#pragma once
// Note [Uncaught exceptions in a worker]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An exception that leaves main() ends a C++ program through std::terminate: abort(), exit code 134,
// and nothing in the error file, so the launcher's failure summary says only "SIGABRT". Python
// prints the traceback and exits 1, and torchrun's summary shows the message. A port must not have
// to wrap main in ddp::run_main to get that, so init_process_group installs a terminate handler
// that, when an exception is in flight, does what run_main does: prints "error: <what>" on stderr,
// writes the error file (TORCHELASTIC_ERROR_FILE, see Note [Error file] in ddp/runtime/run_main.h) and
// exits with 1. Terminations without an exception (a noexcept violation, a joinable std::thread
// destroyed) go to the handler that was installed before, unchanged. The handler is process-wide
// by nature (std::set_terminate); installing it twice is harmless, and a handler the program set
// itself after init_process_group wins. run_main stays: it also catches exceptions of programs that
// never call init_process_group.
namespace ddp {

// Installs the handler of Note [Uncaught exceptions in a worker] (idempotent, thread-safe).
void install_uncaught_exception_handler();

}  // namespace ddp
