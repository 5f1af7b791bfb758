#pragma once
// trainer.pt: the training progress, the optimizer state in Python's optimizer.state_dict() layout,
// and the RNG states, in PyTorch's zip format. See Note [Trainer state]. Internal to the ddp library
// (and its tests and fuzzers); get_rng_state()/set_rng_state() are public in ddp/checkpoint/checkpoint.h.
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <filesystem>
#include <string>

#include "ddp/checkpoint/checkpoint.h"
#include "ddp/checkpoint/detail/pickle_reader.h"

namespace ddp::detail {

// Note [Trainer state]
// ~~~~~~~~~~~~~~~~~~~~
// trainer.pt is a PyTorch zip file (ddp/checkpoint/detail/torch_zip.h) holding one dict:
//   {"ddp_trainer_version": 2, "epoch": int, "step": int,
//    "sampler": {"epoch": int, "position": int, "num_replicas": int,
//                "offset": int (the epoch's samples done by all ranks; absent in older files)},
//    "optimizer": None or {"state": {param index: {name: tensor or number}},
//                          "param_groups": [{"lr": ..., <the options>, "params": [param indices]}]},
//    "rng": None or {"cpu": uint8 tensor, "cuda": [uint8 tensor per device]},
//    "grad_scaler": None or GradScaler.state_dict()'s dict (ddp/amp/grad_scaler.h; absent in older files)}
// "optimizer" is Python's optimizer.state_dict() layout, with parameters numbered across the
// groups in order, and PyTorch's names for the options and per-parameter state (SGD, Adam, AdamW,
// Adagrad, RMSprop; other optimizers are refused when saving), so that Python reads the whole
// checkpoint with torch.load(path, weights_only=True). It is read back through the safe pickle
// reader: earlier versions wrote a torch::serialize archive, i.e. TorchScript, whose loader can run
// code from a planted file (see Note [Reading PyTorch pickles]); such a trainer.pt is refused.
// Restoring is all or nothing: the optimizer is changed only once the whole state has been read.

// The optimizer's state in Python's optimizer.state_dict() layout, tensors on the CPU. Throws
// ddp::InvalidArgument for an optimizer type it does not know.
c10::IValue optimizer_state_dict(const torch::optim::Optimizer& optimizer);

// Restores what optimizer_state_dict() gave (or Python's optimizer.state_dict() of the same
// optimizer type and parameter shapes), state tensors moved to `device`. Throws ddp::IoError naming
// `file` when the state does not fit the optimizer or is malformed; the optimizer is then unchanged.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const PickleValue& state,
                               const torch::Device& device, const std::string& file);

// Writes trainer.pt's bytes (see Note [Trainer state]).
void write_trainer_state(const torch::optim::Optimizer* optimizer, const TrainingProgress& progress,
                         bool with_rng, const ByteSink& sink);

// Reads trainer.pt, restores the optimizer (if not null) and the RNG states (if restore_rng and
// saved). Throws ddp::IoError "<file>: cannot load the training state: ..." on one line.
TrainingProgress read_trainer_state(const std::filesystem::path& file, torch::optim::Optimizer* optimizer,
                                    const torch::Device& device, bool restore_rng);

}  // namespace ddp::detail
