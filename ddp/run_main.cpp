#include "ddp/run_main.h"

#include <cxxabi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <typeinfo>

#include "ddp/json.h"
#include "ddp/base/str.h"

namespace ddp {
namespace {

std::string demangled_type(const std::exception& error) {
  const char* mangled = typeid(error).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                              std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(mangled);
}

}  // namespace

std::string error_file_json(const std::string& type, const std::string& what, long long unix_seconds) {
  return torchelastic_error_json(what, type + ": " + what, unix_seconds);
}

bool write_error_file(const std::string& path, const std::exception& error) {
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  std::ofstream out(path, std::ios::trunc);
  out << error_file_json(demangled_type(error), error.what(), now);
  out.close();
  if (!out) {
    std::cerr << "could not write the error file " << path << "\n";
    return false;
  }
  return true;
}

int run_main(int argc, char** argv, std::function<int(int, char**)> main_fn) {
  try {
    return main_fn(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    if (const char* path = std::getenv("TORCHELASTIC_ERROR_FILE"); path != nullptr && *path != '\0') {
      write_error_file(path, error);
    }
    return 1;
  } catch (...) {
    std::cerr << "error: unknown exception\n";
    if (const char* path = std::getenv("TORCHELASTIC_ERROR_FILE"); path != nullptr && *path != '\0') {
      write_error_file(path, std::runtime_error("unknown exception (not derived from std::exception)"));
    }
    return 1;
  }
}

}  // namespace ddp
