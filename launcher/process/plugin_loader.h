#pragma once
// Loading shared libraries at run time (dlopen): ddp_launch's plugins (found next to the executable)
// and the NVIDIA driver's NVML, so that the launcher links none of them. Every failure is one line.
#include <string>

namespace ddp::launcher::process {

class SharedLibrary {
 public:
  // Where ddp_launch's plugin `file_name` is: <dir of ddp_launch>/<bin->lib path of the install
  // layout>/file_name, else <dir>/../lib/file_name (the build tree). Throws ddp::Error naming both
  // places and `needed_for` (the flag that needs it) when it is in neither.
  static std::string find_plugin(const std::string& file_name, const std::string& needed_for);
  // find_plugin() and load().
  static SharedLibrary load_plugin(const std::string& file_name, const std::string& needed_for);
  // dlopen(RTLD_NOW | RTLD_LOCAL) of a path or a soname. `missing_symbol_hint` ends the error of a
  // symbol() that is not there. Throws ddp::Error "cannot load PATH: <dlerror>".
  static SharedLibrary load(const std::string& path, std::string missing_symbol_hint);

  SharedLibrary(SharedLibrary&& other) noexcept;
  SharedLibrary& operator=(SharedLibrary&& other) noexcept;
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;
  ~SharedLibrary();  // dlclose(), unless keep_loaded()

  // A symbol the caller cannot do without: throws ddp::Error "PATH lacks NAME: <hint>".
  template <class F>
  F symbol(const char* name) const {
    return reinterpret_cast<F>(required(name));
  }
  // A symbol the caller can do without: nullptr when absent.
  template <class F>
  F optional_symbol(const char* name) const {
    return reinterpret_cast<F>(lookup(name));
  }
  // Never unload (LibTorch, which the rendezvous plugin links, does not support being unloaded;
  // a plugin whose threads were joined gains nothing by it either).
  void keep_loaded() { keep_ = true; }
  const std::string& path() const { return path_; }

 private:
  SharedLibrary(void* handle, std::string path, std::string hint);
  void* lookup(const char* name) const;
  void* required(const char* name) const;

  void* handle_ = nullptr;
  std::string path_;
  std::string missing_symbol_hint_;
  bool keep_ = false;
};

}  // namespace ddp::launcher::process
