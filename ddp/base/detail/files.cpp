#include "ddp/base/detail/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "ddp/base/error.h"

namespace ddp::detail {
namespace {

[[noreturn]] void throw_errno(const std::string& what, const std::string& path) {
  const int saved = errno;
  throw IoError(str(what, " ", path, ": ", std::strerror(saved)));
}

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// A name no other writer picks: pid, a per-process counter and random bits.
std::string temporary_sibling(const std::string& path) {
  static std::atomic<unsigned long long> counter{0};
  thread_local std::mt19937_64 random{std::random_device{}()};
  return str(path, ".tmp-", ::getpid(), "-", counter.fetch_add(1), "-", std::hex, random() & 0xffffffu);
}

}  // namespace

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

FileDescriptor create_new_file(const std::string& path, mode_t mode, bool append) {
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | (append ? O_APPEND : 0);
  int fd;
  do {
    fd = ::open(path.c_str(), flags, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == EEXIST) {
      throw IoError(str("cannot create ", path, ": something of that name is already there (a file or a link "
                        "another user made?); remove it or use another folder"));
    }
    throw_errno("cannot create", path);
  }
  return FileDescriptor(fd);
}

void write_all(int fd, const void* data, std::size_t size, const std::string& path_for_errors) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::write(fd, bytes, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot write", path_for_errors);
    }
    bytes += written;
    size -= static_cast<std::size_t>(written);
  }
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open", path);
  const int result = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (result != 0) throw_errno("cannot fsync", path);
}

TemporaryFile create_temporary_sibling(const std::string& path, mode_t mode) {
  TemporaryFile file;
  file.path = temporary_sibling(path);
  file.fd = create_new_file(file.path, mode);
  return file;
}

void write_file_atomically(const std::string& path, std::string_view contents, mode_t mode, bool durable) {
  const std::string temporary = temporary_sibling(path);
  try {
    FileDescriptor fd = create_new_file(temporary, mode);
    write_all(fd.get(), contents.data(), contents.size(), temporary);
    if (durable && ::fsync(fd.get()) != 0) throw_errno("cannot fsync", temporary);
    const int raw = fd.release();
    if (::close(raw) != 0) throw_errno("cannot close", temporary);
    if (::rename(temporary.c_str(), path.c_str()) != 0) throw_errno(str("cannot rename ", temporary, " to"), path);
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  if (durable) fsync_path(parent_of(path));
}

bool try_write_file_atomically(const std::string& path, std::string_view contents, mode_t mode) noexcept {
  try {
    write_file_atomically(path, contents, mode);
    return true;
  } catch (...) {
    return false;
  }
}

std::string make_private_dir(const std::string& parent, const std::string& prefix) {
  if (::mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("cannot create the folder", parent);
  std::string pattern = (parent == "/" ? std::string() : parent) + "/" + prefix + "XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw_errno("cannot create a private folder in", parent);
  return pattern;
}

std::string read_file(const std::string& path, std::size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO nobody writes to would wait forever; it is refused below instead
  // (the flag changes nothing for a regular file).
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) throw_errno("cannot open", path);
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) throw_errno("cannot stat", path);
  if (!S_ISREG(info.st_mode)) throw IoError(str(path, " is not a regular file"));
  if (static_cast<unsigned long long>(info.st_size) > max_bytes) {
    throw IoError(str(path, " is ", info.st_size, " bytes, more than the ", max_bytes, " allowed"));
  }
  std::string data;
  char buffer[65536];
  for (;;) {
    const ssize_t got = ::read(fd.get(), buffer, sizeof buffer);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot read", path);
    }
    if (got == 0) break;
    data.append(buffer, static_cast<std::size_t>(got));
    if (data.size() > max_bytes) throw IoError(str(path, " grew past the ", max_bytes, " bytes allowed while read"));
  }
  return data;
}

}  // namespace ddp::detail
