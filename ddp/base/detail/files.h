#pragma once
// Files that other users may share a folder with: created new (never through a planted symlink,
// never over somebody else's file), written atomically, folders made private. Torch-free; the one
// home of these steps for the ddp library, ddp_launch, the examples and the benchmarks.
// See Note [Creating files in shared folders].
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace ddp::detail {

// Note [Creating files in shared folders]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A job often writes below a folder that other users can write too (/tmp, a shared checkpoint or
// log directory). Anything opened with O_CREAT|O_TRUNC there follows a symlink another user planted
// and overwrites whatever it points to with the job's rights. So every file is created with
// O_CREAT|O_EXCL|O_NOFOLLOW (a name that already exists is an error, a symlink is never followed),
// replacing a file goes through a fresh temporary in the same folder and rename(2), which replaces
// the name and never writes through it, and the folders a job makes for itself are 0700.

// An open file descriptor that closes itself.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Creates `path`, which must not exist yet (O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC), for writing.
// `append` adds O_APPEND. Throws IoError naming the path (and saying so when the name was taken).
FileDescriptor create_new_file(const std::string& path, mode_t mode = 0600, bool append = false);

// A new file beside `path` with a name no other writer picks (the kind write_file_atomically()
// uses), for writers that stream into it and then rename it over `path` themselves.
struct TemporaryFile {
  std::string path;
  FileDescriptor fd;
};
TemporaryFile create_temporary_sibling(const std::string& path, mode_t mode = 0600);

// Writes all of `data` (retrying short writes and EINTR); throws IoError naming `path_for_errors`.
void write_all(int fd, const void* data, std::size_t size, const std::string& path_for_errors);

// fsync(2) of a file or a folder; throws IoError naming the path.
void fsync_path(const std::string& path);

// Replaces `path` with `contents` atomically: a new temporary beside it (created as above), written,
// fsynced when `durable`, renamed over `path` (and the folder fsynced when `durable`). Readers see the
// old or the new file, never a part. Throws IoError naming `path`.
void write_file_atomically(const std::string& path, std::string_view contents, mode_t mode = 0600,
                           bool durable = false);

// The same, returning false instead of throwing (for writers on an error path that must not throw).
bool try_write_file_atomically(const std::string& path, std::string_view contents, mode_t mode = 0600) noexcept;

// Makes a new private folder (0700) `<parent>/<prefix>XXXXXX` with a random suffix (mkdtemp) and
// returns its path. `parent` is created (0700) when missing. Throws IoError naming the folder.
std::string make_private_dir(const std::string& parent, const std::string& prefix);

// Reads a whole regular file of at most max_bytes; throws IoError naming the path when it cannot,
// when it is larger, or when it is not a regular file.
std::string read_file(const std::string& path, std::size_t max_bytes);

}  // namespace ddp::detail
