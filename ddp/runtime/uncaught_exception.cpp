#include "ddp/runtime/uncaught_exception.h"


#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <stdexcept>

#include "ddp/runtime/run_main.h"

namespace ddp {
namespace {

// The handler that was installed before ours: the one process-wide slot std::set_terminate has,
// kept so that terminations without an exception behave as they did.
std::atomic<std::terminate_handler> previous_handler{nullptr};

[[noreturn]] void on_terminate() {
  if (const std::exception_ptr in_flight = std::current_exception()) {
    try {
      std::rethrow_exception(in_flight);
    } catch (const std::exception& error) {
      std::cerr << "error: uncaught exception: " << error.what() << std::endl;
      write_error_file_if_requested(error);
    } catch (...) {
      std::cerr << "error: uncaught exception (not derived from std::exception)" << std::endl;
      write_error_file_if_requested(std::runtime_error("uncaught exception (not derived from std::exception)"));
    }
    std::fflush(nullptr);
    std::_Exit(1);
  }
  if (const std::terminate_handler previous = previous_handler.load()) previous();
  std::abort();
}

}  // namespace

void install_uncaught_exception_handler() {
  const std::terminate_handler current = std::get_terminate();
  if (current == &on_terminate) return;
  previous_handler.store(current);
  std::set_terminate(&on_terminate);
}

}  // namespace ddp
