#pragma once
// Where a run's files go: DIR/<run id>/attempt_<k>/<rank>/{stdout.log, stderr.log, error.json}.
#include <string>

namespace ddp::launcher {

struct WorkerFiles {
  std::string dir;
  std::string stdout_log;
  std::string stderr_log;
  std::string error_file;
};

// base is --log_dir (or the per-run temporary folder).
std::string run_dir(const std::string& base, const std::string& run_id);
std::string attempt_dir(const std::string& base, const std::string& run_id, int attempt);
WorkerFiles worker_files(const std::string& base, const std::string& run_id, int attempt, int rank);

// mkdir -p; throws ddp::IoError naming the folder on failure.
void make_dirs(const std::string& path);

}  // namespace ddp::launcher
