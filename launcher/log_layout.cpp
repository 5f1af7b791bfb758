#include "launcher/log_layout.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "ddp/base/error.h"
#include "ddp/base/report_files.h"

namespace ddp::launcher {

std::string run_dir(const std::string& base, const std::string& run_id) { return base + "/" + run_id; }

std::string attempt_dir(const std::string& base, const std::string& run_id, int attempt) {
  return run_dir(base, run_id) + "/attempt_" + std::to_string(attempt);
}

WorkerFiles worker_files(const std::string& base, const std::string& run_id, int attempt, int rank) {
  WorkerFiles f;
  f.dir = attempt_dir(base, run_id, attempt) + "/" + std::to_string(rank);
  f.stdout_log = f.dir + "/" + kStdoutLogName;
  f.stderr_log = f.dir + "/" + kStderrLogName;
  f.error_file = f.dir + "/" + kErrorFileName;
  return f;
}

void make_dirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      throw ddp::IoError(ddp::str("cannot create folder ", prefix, ": ", std::strerror(errno)));
    }
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw ddp::IoError(ddp::str(path, " is not a folder"));
  }
}

}  // namespace ddp::launcher
