#pragma once
// Where a run's files go: every run gets a folder of its own, <log dir>/<run id>_<random> (0700),
// holding attempt_<k>/<rank>/{stdout.log, stderr.log, error.json}. See Note [Log folders].
#include <string>

namespace ddp::launcher::process {

struct WorkerFiles {
  std::string dir;
  std::string stdout_log;
  std::string stderr_log;
  std::string error_file;
};

// Paths below a run folder (pure: nothing is created).
std::string attempt_dir(const std::string& run_folder, int attempt);
WorkerFiles worker_files(const std::string& run_folder, int attempt, int rank);

// Makes this run's own new folder <parent>/<prefix><random> (mkdtemp, 0700) and returns its absolute
// path. `parent` (made with its missing ancestors when absent) must be a folder that no other user
// can rename entries of: owned by this user or root, and sticky when others may write it. Throws
// UsageError naming `flag` and the folder when it cannot. See Note [Log folders].
std::string create_run_folder(const std::string& parent, const std::string& prefix, const std::string& flag);

// Makes a new folder (0700) that must not exist yet: a name already taken (a symlink included) is an
// error, never followed. Throws IoError naming it.
void make_new_dir(const std::string& path);

}  // namespace ddp::launcher::process
