#pragma once
// The names of the files a worker leaves in its report folder (ddp_launch --log_dir: one folder per
// rank and attempt, DIR/<run id>/attempt_<k>/<rank>/). The ddp library writes some, ddp_launch
// writes the others and looks for them; both take the names from here.
#include <sys/types.h>

#include <string>

namespace ddp::detail {

// The mode the reports are created with (before the umask): readable by whoever may read the job's
// log folder, as the files a worker prints to. The folders decide who that is.
inline constexpr mode_t kReportFileMode = 0644;

// The worker's error file (TORCHELASTIC_ERROR_FILE points at it; see Note [Error file] in
// ddp/runtime/run_main.h).
inline constexpr char kErrorFileName[] = "error.json";
// What the worker printed, when ddp_launch --redirects sends it to files.
inline constexpr char kStdoutLogName[] = "stdout.log";
inline constexpr char kStderrLogName[] = "stderr.log";
// A rank's last collectives, written on a collective's failure (see Note [Collective ring buffer] in
// ddp/distributed/detail/collective_log.h): collectives-rank<R>.json in the rank's diagnostics folder.
inline constexpr char kCollectivesFilePrefix[] = "collectives-rank";
inline constexpr char kCollectivesFileSuffix[] = ".json";

// "collectives-rank<R>.json"
inline std::string collectives_file_name(int rank) {
  return kCollectivesFilePrefix + std::to_string(rank) + kCollectivesFileSuffix;
}

// Whether a file name is one of the collectives files.
inline bool is_collectives_file_name(const std::string& name) {
  return name.rfind(kCollectivesFilePrefix, 0) == 0;
}

}  // namespace ddp::detail
