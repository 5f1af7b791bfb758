#include "ddp/runtime/run_main.h"

#include <cxxabi.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <typeinfo>

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/worker_variables.h"
#include "ddp/base/detail/error_file.h"

namespace ddp {
namespace {

std::string demangled_type(const std::exception& error) {
  const char* mangled = typeid(error).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                              std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(mangled);
}

detail::WorkerError worker_error(const std::string& type, const std::string& what, long long unix_seconds) {
  detail::WorkerError error;
  error.message = what;
  error.callstack = type + ": " + what;
  error.timestamp = unix_seconds;
  return error;
}

int report_failure(const std::exception& error) {
  write_error_file_if_requested(error);
  return 1;
}

}  // namespace

std::string error_file_json(const std::string& type, const std::string& what, long long unix_seconds) {
  return detail::format_error_json(worker_error(type, what, unix_seconds));
}

bool write_error_file(const std::string& path, const std::exception& error) {
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  if (!detail::write_error_file(path, worker_error(demangled_type(error), error.what(), now))) {
    std::cerr << "could not write the error file " << path << "\n";
    return false;
  }
  return true;
}

void write_error_file_if_requested(const std::exception& error) {
  if (const auto path = process_environment()(env::kErrorFile); path && !path->empty()) {
    write_error_file(*path, error);
  }
}

int run_main(int argc, char** argv, std::function<int(int, char**)> main_fn) {
  try {
    return main_fn(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    return report_failure(error);
  } catch (...) {
    std::cerr << "error: unknown exception\n";
    return report_failure(std::runtime_error("unknown exception (not derived from std::exception)"));
  }
}

}  // namespace ddp
