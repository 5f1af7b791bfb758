#include "launcher/process/plugin_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <utility>
#include <vector>

#include "ddp/base/error.h"

#ifndef DDP_RDZV_PLUGIN_RELDIR
#define DDP_RDZV_PLUGIN_RELDIR "../lib"
#endif

namespace ddp::launcher::process {

std::string SharedLibrary::find_plugin(const std::string& file_name, const std::string& needed_for) {
  char exe[PATH_MAX] = {0};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string dir = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string(".");
  dir = dir.substr(0, dir.rfind('/'));
  const std::vector<std::string> candidates{dir + "/" DDP_RDZV_PLUGIN_RELDIR "/" + file_name,
                                            dir + "/../lib/" + file_name};
  for (const auto& c : candidates) {
    if (::access(c.c_str(), R_OK) == 0) return c;
  }
  throw ddp::Error(ddp::str(needed_for, " needs the plugin ", file_name, ", looked for ", candidates.front(), " and ",
                            candidates.back(), ": build or install it with ddp_launch"));
}

SharedLibrary SharedLibrary::load_plugin(const std::string& file_name, const std::string& needed_for) {
  return load(find_plugin(file_name, needed_for),
              ddp::str("not a ddp_launch plugin for ", needed_for, ", or one of another version"));
}

SharedLibrary SharedLibrary::load(const std::string& path, std::string missing_symbol_hint) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    throw ddp::Error(ddp::str("cannot load ", path, ": ", why != nullptr ? why : "dlopen failed"));
  }
  return SharedLibrary(handle, path, std::move(missing_symbol_hint));
}

SharedLibrary::SharedLibrary(void* handle, std::string path, std::string hint)
    : handle_(handle), path_(std::move(path)), missing_symbol_hint_(std::move(hint)) {}

SharedLibrary::SharedLibrary(SharedLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      path_(std::move(other.path_)),
      missing_symbol_hint_(std::move(other.missing_symbol_hint_)),
      keep_(other.keep_) {}

SharedLibrary& SharedLibrary::operator=(SharedLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr && !keep_) ::dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    path_ = std::move(other.path_);
    missing_symbol_hint_ = std::move(other.missing_symbol_hint_);
    keep_ = other.keep_;
  }
  return *this;
}

SharedLibrary::~SharedLibrary() {
  if (handle_ != nullptr && !keep_) ::dlclose(handle_);
}

void* SharedLibrary::lookup(const char* name) const { return handle_ == nullptr ? nullptr : ::dlsym(handle_, name); }

void* SharedLibrary::required(const char* name) const {
  void* p = lookup(name);
  if (p == nullptr) throw ddp::Error(ddp::str(path_, " lacks ", name, ": ", missing_symbol_hint_));
  return p;
}

}  // namespace ddp::launcher::process
