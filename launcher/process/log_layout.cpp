#include "launcher/process/log_layout.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ddp/base/error.h"
#include "ddp/base/detail/files.h"
#include "ddp/base/detail/report_files.h"

namespace ddp::launcher::process {

// Note [Log folders]
// ~~~~~~~~~~~~~~~~~~
// Log folders are often shared (/tmp, a team's log directory), so nothing a run writes may be
// redirected by another user, and two runs must never mix or overwrite each other's files:
// - each run makes a folder of its own, <log dir>/<run id>_<random>, with mkdtemp (0700, a new name
//   every time): a folder another user made, or a symlink planted where a fixed path would be, is
//   never used, and reusing a --log_dir keeps the previous runs' logs;
// - the parent must be a folder where only its owner can rename or delete our run folder: owned by
//   us or by root, and sticky (like /tmp) when others may write it. Otherwise another user could
//   swap the run folder for a symlink after we made it;
// - below the run folder every folder is made with mkdir and every file with O_CREAT|O_EXCL|
//   O_NOFOLLOW (ddp/base/detail/files.h create_new_file): an existing name is an error, never followed;
// - each attempt gets new folders, so an error file of an earlier attempt or run can never be read
//   as a new failure's message (the error file's path does not exist before the attempt starts).

std::string attempt_dir(const std::string& run_folder, int attempt) {
  return run_folder + "/attempt_" + std::to_string(attempt);
}

WorkerFiles worker_files(const std::string& run_folder, int attempt, int rank) {
  WorkerFiles f;
  f.dir = attempt_dir(run_folder, attempt) + "/" + std::to_string(rank);
  f.stdout_log = f.dir + "/" + detail::kStdoutLogName;
  f.stderr_log = f.dir + "/" + detail::kStderrLogName;
  f.error_file = f.dir + "/" + detail::kErrorFileName;
  return f;
}

namespace {

// mkdir -p (0755 for what it makes: only the run folder below holds anything private).
void make_parents(const std::string& path, const std::string& flag) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      throw UsageError(ddp::str(flag, ": cannot create the folder ", prefix, ": ", std::strerror(errno)));
    }
  }
}

}  // namespace

std::string create_run_folder(const std::string& parent_in, const std::string& prefix, const std::string& flag) {
  std::string parent = std::filesystem::absolute(parent_in).lexically_normal().string();
  while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
  make_parents(parent, flag);
  struct stat st {};
  if (::stat(parent.c_str(), &st) != 0) {
    throw UsageError(ddp::str(flag, " ", parent, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) throw UsageError(ddp::str(flag, " ", parent, " is not a folder"));
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    throw UsageError(ddp::str(flag, " ", parent, " belongs to user ", st.st_uid,
                              ", who could swap this run's folder for a link: use a folder of your own"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    throw UsageError(ddp::str(flag, " ", parent, " is writable by other users and not sticky, so they could swap "
                              "this run's folder for a link: use a folder only you can write (chmod go-w), or a "
                              "sticky one like /tmp"));
  }
  try {
    return ddp::detail::make_private_dir(parent, prefix);
  } catch (const ddp::IoError& e) {
    throw UsageError(ddp::str(flag, ": ", e.what()));
  }
}

void make_new_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0) {
    throw ddp::IoError(ddp::str("cannot create the folder ", path, ": ", std::strerror(errno),
                                errno == EEXIST ? " (it must be new: something made it before this run)" : ""));
  }
}

}  // namespace ddp::launcher::process
