#pragma once
// Portable, atomic training checkpoints: model state dict (readable by Python's torch.load),
// optimizer state, epoch, step, sampler position and RNG state.
//
// Note [Checkpoint layout]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint is a folder <root>/step-<step, 12 digits>/ holding
//   model.pt    the model's state dict: a plain dict name -> CPU tensor in PyTorch's zip format,
//               keys without the DDP "module." prefix (state_dict.cpp, torch_zip.cpp).
//   trainer.pt  the epoch, step, sampler state, the optimizer state in Python's
//               optimizer.state_dict() layout and the RNG states, in the same format
//               (see Note [Trainer state] in trainer_state.h).
//   MANIFEST    text: format version, epoch, step, world size, the size and XXH3-64 checksum of each
//               file above, and an end line that covers the MANIFEST itself
//               (see Note [MANIFEST format] in checkpoint_manifest.h). It is written last.
// Python reads both files with torch.load(path, weights_only=True); C++ reads them only through the
// project's safe pickle reader (see Note [Reading PyTorch pickles] in pickle_reader.h): nothing read
// from a checkpoint can run code. Rank 0 writes everything into <root>/.tmp-step-.../ (made 0700,
// files 0600; a root it creates is 0700 too), fsyncs the files and the folder, then renames the
// folder into place and fsyncs <root>: a folder named step-* with a MANIFEST is complete, and a
// crash at any point leaves the previous checkpoints untouched (leftover .tmp-* folders never count).
// The checksums turn a truncated or corrupted file into a clear ddp::IoError, which lets
// find_latest_valid_checkpoint() fall back to the previous checkpoint; a folder of another user is
// refused (see Note [Checkpoint folder ownership] in checkpoint.cpp). One job writes into a root:
// pruning removes its own temporary folders left by writers that died.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/amp/grad_scaler_state.h"
#include "ddp/base/error.h"
#include "samplers/distributed_sampler.h"

namespace ddp {

using StateDict = torch::OrderedDict<std::string, torch::Tensor>;

// ---- State dicts ---------------------------------------------------------------------------------

// The module's parameters and buffers by dotted name, detached, as PyTorch's module.state_dict()
// (registration order; keys without a "module." prefix).
StateDict state_dict(const torch::nn::Module& module);

// Removes `prefix` from every key that starts with it (PyTorch's consume_prefix_in_state_dict_if_present).
StateDict strip_prefix(const StateDict& state, const std::string& prefix = "module.");

// Copies `state` into the module's parameters and buffers (on their devices and dtypes), without
// recording gradients. A "module." prefix on the keys is stripped first. strict: missing or unexpected
// keys are an error listing them; a shape mismatch is always an error. Throws ddp::InvalidArgument.
void load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true);

// Writes a state dict in PyTorch's zip format, atomically (temporary file, fsync, rename), tensors
// moved to the CPU: torch.load(file) in Python gives a dict name -> tensor. Throws ddp::IoError.
void save_state_dict(const StateDict& state, const std::filesystem::path& file);

// Reads a state dict written by save_state_dict() or by Python's torch.save(model.state_dict())
// (an OrderedDict, also one of a DDP model with "module." keys, which are stripped). Tensors go to
// map_location (default: the CPU). A missing, truncated or corrupt file, or one that holds anything
// but tensors by name, is a ddp::IoError naming the file and what is wrong.
StateDict load_state_dict_file(const std::filesystem::path& file,
                               std::optional<torch::Device> map_location = std::nullopt);

// ---- RNG state ------------------------------------------------------------------------------------

// The default generators' states: CPU always, one per CUDA device when CUDA is available.
struct RngState {
  torch::Tensor cpu;
  std::vector<torch::Tensor> cuda;
};
RngState get_rng_state();
// Restores what get_rng_state() returned; CUDA states beyond this machine's devices are ignored.
void set_rng_state(const RngState& state);

// ---- Checkpoints ------------------------------------------------------------------------------------

// What a training loop needs to continue where it stopped, besides model and optimizer.
struct TrainingProgress {
  int64_t epoch = 0;
  int64_t step = 0;  // global step; names the checkpoint folder
  // From sampler.state(consumed); after loading, sampler.set_state(progress.sampler) resumes there,
  // also with another world size.
  samplers::SamplerState sampler;
  // The loss scaler's state (ddp/amp/grad_scaler.h), saved in trainer.pt under "grad_scaler" with
  // Python's keys; nullopt: no scaler (saved as None). Loading fills it when the checkpoint has one.
  std::optional<amp::GradScalerState> grad_scaler = std::nullopt;  // (initialised: aggregate inits may omit it)
};

struct CheckpointOptions {
  // How many complete checkpoints to keep under the root, newest by step (default 3; 0 keeps all).
  int keep_last = 3;
  // Save the RNG states with the checkpoint and restore them when loading (default true).
  bool rng_state = true;
  // Loading: every key of the model must be in the checkpoint and nothing else (default true).
  bool strict = true;
  // Loading: the device of the optimizer state (default: the device of the model's first parameter).
  std::optional<torch::Device> map_location;
  // Saving: the world size written into the MANIFEST for information (default 1).
  int world_size = 1;
};

// A complete checkpoint folder, as its MANIFEST describes it (see Note [Checkpoint layout]).
struct CheckpointInfo {
  std::filesystem::path path;
  int64_t epoch = 0;
  int64_t step = 0;
  int world_size = 1;
};

// All ranks call it. Rank 0 writes <root>/step-<step>/ atomically and removes checkpoints beyond
// keep_last; every rank then waits in `barrier`, so that none reads or overwrites the checkpoint
// early. If rank 0's write fails it still enters the barrier (nobody hangs), then rethrows.
// optimizer may be null. Returns the checkpoint folder (on every rank).
std::filesystem::path save_checkpoint(const std::filesystem::path& root,
                                      const torch::nn::Module& model,
                                      const torch::optim::Optimizer* optimizer,
                                      const TrainingProgress& progress, int rank,
                                      const std::function<void()>& barrier,
                                      const CheckpointOptions& options = {});

class ProcessGroup;

// The same with ddp::ProcessGroup: rank 0 writes while the others wait (bounded by the group's
// timeout) for it to report success through the group's store; if rank 0's write fails, it throws
// its error and every other rank throws ddp::CommunicationError quoting it (nobody hangs or goes on
// believing the checkpoint exists).
std::filesystem::path save_checkpoint(const std::filesystem::path& root,
                                      const torch::nn::Module& model,
                                      const torch::optim::Optimizer* optimizer,
                                      const TrainingProgress& progress, ProcessGroup& group,
                                      CheckpointOptions options = {});

// The same with anything else that has rank(), size() and barrier() (by reference or shared_ptr).
template <typename Group, typename = decltype(std::declval<Group&>().rank())>
std::filesystem::path save_checkpoint(const std::filesystem::path& root,
                                      const torch::nn::Module& model,
                                      const torch::optim::Optimizer* optimizer,
                                      const TrainingProgress& progress, Group& group,
                                      CheckpointOptions options = {}) {
  options.world_size = static_cast<int>(group.size());
  return save_checkpoint(root, model, optimizer, progress, static_cast<int>(group.rank()),
                         [&group] { group.barrier(); }, options);
}

template <typename Group>
std::filesystem::path save_checkpoint(const std::filesystem::path& root,
                                      const torch::nn::Module& model,
                                      const torch::optim::Optimizer* optimizer,
                                      const TrainingProgress& progress,
                                      const std::shared_ptr<Group>& group,
                                      const CheckpointOptions& options = {}) {
  DDP_CHECK(group != nullptr, "save_checkpoint: the process group is null");
  return save_checkpoint(root, model, optimizer, progress, *group, options);
}

// Loads a checkpoint folder into model (and optimizer, which may be null) on any rank and with any
// world size: parameters keep their devices, the optimizer state goes to options.map_location or
// the model's device; restores the RNG states if saved and options.rng_state. Verifies the folder
// (verify_checkpoint) first. Throws ddp::IoError (missing, truncated, corrupt or foreign files, or
// files that hold anything but data: nothing in them is ever run) or ddp::InvalidArgument (the model
// does not fit the state dict).
TrainingProgress load_checkpoint(const std::filesystem::path& checkpoint, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer,
                                 const CheckpointOptions& options = {});

// Complete checkpoints under root (folders step-* with a MANIFEST), newest step first. Does not
// verify the files; an empty list when root does not exist.
std::vector<CheckpointInfo> list_checkpoints(const std::filesystem::path& root);

// Checks that the folder is this user's (see Note [Checkpoint folder ownership] in checkpoint.cpp),
// that the MANIFEST is whole and lists model.pt and trainer.pt, and every listed file's size and
// checksum; throws ddp::IoError naming the file and what is wrong.
CheckpointInfo verify_checkpoint(const std::filesystem::path& checkpoint);

// One step-* folder under a root and whether it verifies.
struct CheckpointCandidate {
  std::filesystem::path path;
  int64_t step = 0;           // from the folder's name
  bool valid = false;
  CheckpointInfo info;        // when valid
  std::string problem;        // when not: one line naming the file and why (also "has no MANIFEST")
};

// Every step-* folder under root (with or without a MANIFEST), newest step first, each verified;
// with stop_at_first_valid, the list ends with the newest valid one (older ones are not read).
std::vector<CheckpointCandidate> inspect_checkpoints(const std::filesystem::path& root,
                                                     bool stop_at_first_valid = false);

// The newest checkpoint that verifies; the others (also folders without MANIFEST) are skipped with a
// warning naming them. nullopt if none.
std::optional<CheckpointInfo> find_latest_valid_checkpoint(const std::filesystem::path& root);

// Removes all but the newest `keep_last` complete checkpoints, and leftover temporary folders;
// folders of other users are neither counted nor removed.
void prune_checkpoints(const std::filesystem::path& root, int keep_last);

// ---- Building blocks (public for tests and custom checkpoint contents) -----------------------------

// Receives the bytes of one file, in order.
using ByteSink = std::function<void(const void* data, size_t size)>;

// One file of a checkpoint folder: its name and a function that writes its bytes into the sink.
struct CheckpointFile {
  std::string name;
  std::function<void(const ByteSink& sink)> write;
};

// Writes `files` and a MANIFEST (with `info`'s epoch, step and world size) into <root>/<name>/
// atomically, see Note [Checkpoint layout]. If a writer throws, the temporary folder is removed, an
// existing <root>/<name> is untouched, and the exception propagates. Returns <root>/<name>.
std::filesystem::path write_checkpoint_directory(const std::filesystem::path& root,
                                                 const std::string& name,
                                                 const std::vector<CheckpointFile>& files,
                                                 const CheckpointInfo& info);

// "step-000000001200": the folder name for a step.
std::string checkpoint_name(int64_t step);

}  // namespace ddp
