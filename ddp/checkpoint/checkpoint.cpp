// The checkpoint folder protocol: writing a folder with its MANIFEST atomically, verifying, listing,
// choosing, loading and pruning checkpoints. See Note [Checkpoint layout] in checkpoint.h. The files'
// formats live in state_dict.cpp / torch_zip.cpp (model.pt), trainer_state.cpp (trainer.pt) and
// checkpoint_manifest.cpp (MANIFEST).
#include "ddp/checkpoint/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <utility>

#include "ddp/base/error.h"
#include "ddp/base/detail/files.h"
#include "ddp/base/str.h"
#include "ddp/checkpoint/detail/checkpoint_manifest.h"
#include "ddp/runtime/log.h"
#include "ddp/distributed/process_group.h"
#include "ddp/checkpoint/detail/torch_zip.h"
#include "ddp/checkpoint/detail/trainer_state.h"

namespace ddp {
namespace fs = std::filesystem;

namespace {

constexpr const char* kModelFile = "model.pt";
constexpr const char* kTrainerFile = "trainer.pt";

bool is_checkpoint_name(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  return name.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

// Note [Checkpoint folder ownership]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint root is often shared (a team's scratch folder). The MANIFEST's checksums only catch
// accidents: anyone who can write a folder can recompute them. So a checkpoint is trusted only if its
// folder is a real folder (not a symlink) owned by the user running the job and not writable by
// others; another user's step-* folder, even a newer one with a perfect MANIFEST, is refused and
// never pruned. The folders a job makes are 0700 and its files 0600 (ddp/base/detail/files.h).
void check_folder_is_ours(const fs::path& folder) {
  struct stat info {};
  if (::lstat(folder.c_str(), &info) != 0) {
    throw IoError(str(folder.string(), ": cannot stat: ", std::strerror(errno)));
  }
  if (S_ISLNK(info.st_mode)) throw IoError(str(folder.string(), ": is a symbolic link: refused"));
  if (!S_ISDIR(info.st_mode)) throw IoError(str(folder.string(), ": is not a folder"));
  if (info.st_uid != ::geteuid()) {
    throw IoError(str(folder.string(), ": owned by uid ", info.st_uid, ", not by this user (uid ", ::geteuid(),
                      "): refused, another user may have planted it"));
  }
  if ((info.st_mode & S_IWOTH) != 0) {
    throw IoError(str(folder.string(), ": writable by every user: refused (chmod o-w to trust it)"));
  }
}

bool is_ours(const fs::path& folder) {
  try {
    check_folder_is_ours(folder);
    return true;
  } catch (const IoError&) {
    return false;
  }
}

// verify_checkpoint(), returning the whole MANIFEST.
detail::Manifest verify_manifest_and_files(const fs::path& checkpoint) {
  check_folder_is_ours(checkpoint);
  detail::Manifest manifest = detail::read_manifest(checkpoint);
  // Unlisted files would be read unchecked.
  for (const char* name : {kModelFile, kTrainerFile}) {
    const bool listed = std::any_of(manifest.files.begin(), manifest.files.end(),
                                    [name](const detail::ManifestFile& file) { return file.name == name; });
    if (!listed) {
      throw IoError(str((checkpoint / detail::kManifestName).string(), ": does not list ", name,
                        ": corrupt MANIFEST, or not a checkpoint written by save_checkpoint"));
    }
  }
  for (const auto& file : manifest.files) {
    const fs::path path = checkpoint / file.name;
    std::error_code error;
    const auto status = fs::symlink_status(path, error);
    if (!error && !fs::is_regular_file(status)) {
      throw IoError(str(path.string(), ": listed in the MANIFEST but not a regular file"));
    }
    const auto size = fs::file_size(path, error);
    if (error) throw IoError(str(path.string(), ": listed in the MANIFEST but unreadable: ", error.message()));
    if (size != file.digest.size) {
      throw IoError(str(path.string(), ": ", size, " bytes, the MANIFEST says ", file.digest.size,
                        size < file.digest.size ? ": the file is truncated" : ": the file was changed"));
    }
    if (detail::digest_file(path, manifest.checksum_kind()).checksum != file.digest.checksum) {
      throw IoError(str(path.string(), ": checksum mismatch: the file is corrupt"));
    }
  }
  return manifest;
}

struct StepFolder {
  fs::path path;
  int64_t step = 0;  // from the name
  bool has_manifest = false;
};

// The step-* folders under root, newest step first; none when root is not a folder.
std::vector<StepFolder> step_folders(const fs::path& root) {
  std::vector<StepFolder> result;
  std::error_code error;
  if (!fs::is_directory(root, error)) return result;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (!is_checkpoint_name(name)) continue;
    StepFolder folder{entry.path(), 0, fs::exists(fs::symlink_status(entry.path() / detail::kManifestName, error))};
    try {
      folder.step = std::stoll(name.substr(5));
    } catch (const std::out_of_range&) {
      continue;  // more digits than any step: not ours
    }
    result.push_back(std::move(folder));
  }
  std::sort(result.begin(), result.end(), [](const StepFolder& a, const StepFolder& b) { return a.step > b.step; });
  return result;
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  DDP_CHECK_GE(step, 0, "checkpoint steps are counted from 0");
  char name[32];
  std::snprintf(name, sizeof name, "step-%012" PRId64, step);
  return name;
}

fs::path write_checkpoint_directory(const fs::path& root, const std::string& name,
                                    const std::vector<CheckpointFile>& files,
                                    const CheckpointInfo& info) {
  std::error_code error;
  if (!fs::is_directory(root, error) && root.has_parent_path()) fs::create_directories(root.parent_path(), error);
  // make_private_dir creates root (0700) when missing, and a 0700 folder with a random suffix.
  const fs::path temporary = detail::make_private_dir(root.string(), str(".tmp-", name, "-"));
  const fs::path final_path = root / name;
  try {
    std::vector<detail::ManifestFile> written;
    for (const auto& file : files) {
      detail::OutputFile out(temporary / file.name);
      file.write([&out](const void* data, size_t size) { out.write(data, size); });
      out.commit();
      written.push_back({file.name, out.digest()});
    }
    const std::string manifest = detail::format_manifest(info, written);
    detail::OutputFile out(temporary / detail::kManifestName);
    out.write(manifest.data(), manifest.size());
    out.commit();
    detail::fsync_path(temporary.string());
    if (fs::exists(fs::symlink_status(final_path, error))) {
      // Same step saved again: move the old one aside first (rename cannot replace a folder that is
      // not empty); rename(2) replaces the new empty folder `old`.
      const fs::path old = detail::make_private_dir(root.string(), str(".old-", name, "-"));
      detail::rename_or_throw(final_path, old);
      detail::rename_or_throw(temporary, final_path);
      fs::remove_all(old, error);
    } else {
      detail::rename_or_throw(temporary, final_path);
    }
    detail::fsync_path(root.string());
  } catch (...) {
    fs::remove_all(temporary, error);
    throw;
  }
  return final_path;
}

fs::path save_checkpoint(const fs::path& root, const torch::nn::Module& model,
                         const torch::optim::Optimizer* optimizer, const TrainingProgress& progress,
                         int rank, const std::function<void()>& barrier,
                         const CheckpointOptions& options) {
  const std::string name = checkpoint_name(progress.step);
  std::exception_ptr failure;
  if (rank == 0) {
    try {
      const StateDict model_state = state_dict(model);
      const std::vector<CheckpointFile> files = {
          {kModelFile, [&](const ByteSink& sink) { detail::write_state_dict(model_state, sink); }},
          {kTrainerFile,
           [&](const ByteSink& sink) { detail::write_trainer_state(optimizer, progress, options.rng_state, sink); }}};
      write_checkpoint_directory(root, name, files,
                                 {root / name, progress.epoch, progress.step, options.world_size});
      if (options.keep_last > 0) prune_checkpoints(root, options.keep_last);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (barrier) {
    try {
      barrier();
    } catch (...) {
      if (!failure) throw;  // rank 0's own error says more than the barrier's
    }
  }
  if (failure) std::rethrow_exception(failure);
  return root / name;
}

fs::path save_checkpoint(const fs::path& root, const torch::nn::Module& model,
                         const torch::optim::Optimizer* optimizer, const TrainingProgress& progress,
                         ProcessGroup& group, CheckpointOptions options) {
  options.world_size = group.size();
  fs::path path;
  // Rank 0 writes; the others wait for its "ok" (or its error) and then do nothing.
  main_process_first(group, [&] {
    path = save_checkpoint(root, model, optimizer, progress, group.rank(), nullptr, options);
  });
  return path;
}

CheckpointInfo verify_checkpoint(const fs::path& checkpoint) {
  return verify_manifest_and_files(checkpoint).info;
}

TrainingProgress load_checkpoint(const fs::path& checkpoint, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer, const CheckpointOptions& options) {
  verify_manifest_and_files(checkpoint);
  load_state_dict(model, load_state_dict_file(checkpoint / kModelFile), options.strict);
  const auto parameters = model.parameters();
  const torch::Device device = options.map_location ? *options.map_location
                               : parameters.empty() ? torch::Device(torch::kCPU)
                                                    : parameters.front().device();
  return detail::read_trainer_state(checkpoint / kTrainerFile, optimizer, device, options.rng_state);
}

std::vector<CheckpointInfo> list_checkpoints(const fs::path& root) {
  std::vector<CheckpointInfo> result;
  for (const StepFolder& folder : step_folders(root)) {
    if (!folder.has_manifest) continue;
    CheckpointInfo info;
    try {
      info = detail::read_manifest(folder.path).info;
    } catch (const IoError&) {
      // Listed anyway (the name says which step); verify_checkpoint() reports what is wrong.
      info.path = folder.path;
      info.step = folder.step;
    }
    result.push_back(info);
  }
  std::stable_sort(result.begin(), result.end(),
                   [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step > b.step; });
  return result;
}

std::vector<CheckpointCandidate> inspect_checkpoints(const fs::path& root, bool stop_at_first_valid) {
  std::vector<CheckpointCandidate> result;
  for (const StepFolder& folder : step_folders(root)) {
    CheckpointCandidate candidate;
    candidate.path = folder.path;
    candidate.step = folder.step;
    if (!folder.has_manifest) {
      candidate.problem = str(folder.path.string(), ": has no MANIFEST: an incomplete or foreign folder");
    } else {
      try {
        candidate.info = verify_checkpoint(folder.path);
        candidate.valid = true;
      } catch (const IoError& e) {
        candidate.problem = e.what();
      }
    }
    result.push_back(std::move(candidate));
    if (stop_at_first_valid && result.back().valid) break;
  }
  return result;
}

std::optional<CheckpointInfo> find_latest_valid_checkpoint(const fs::path& root) {
  for (const auto& candidate : inspect_checkpoints(root, /*stop_at_first_valid=*/true)) {
    if (candidate.valid) return candidate.info;
    Logger("checkpoint").warn(str("skipping checkpoint ", candidate.path.string(), ": ", candidate.problem));
  }
  return std::nullopt;
}

void prune_checkpoints(const fs::path& root, int keep_last) {
  DDP_CHECK_GE(keep_last, 0, "keep_last counts checkpoints to keep; 0 keeps all");
  std::error_code error;
  std::vector<CheckpointInfo> checkpoints = list_checkpoints(root);
  // Another user's folders neither count nor go: see Note [Checkpoint folder ownership].
  checkpoints.erase(std::remove_if(checkpoints.begin(), checkpoints.end(),
                                   [](const CheckpointInfo& info) { return !is_ours(info.path); }),
                    checkpoints.end());
  for (size_t i = static_cast<size_t>(keep_last); keep_last > 0 && i < checkpoints.size(); ++i) {
    fs::remove_all(checkpoints[i].path, error);
  }
  if (!fs::is_directory(root, error)) return;
  std::vector<fs::path> leftovers;  // temporary folders of writers that died
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if ((name.rfind(".tmp-step-", 0) == 0 || name.rfind(".old-step-", 0) == 0) && is_ours(entry.path())) {
      leftovers.push_back(entry.path());
    }
  }
  for (const auto& path : leftovers) fs::remove_all(path, error);
}

}  // namespace ddp
