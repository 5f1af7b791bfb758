#pragma once
// A communication hook's state in a checkpoint (CommHookInterface::state(): PowerSGD's error
// buffers, P and Q, iteration and random state). The state differs between ranks, so every rank
// writes its own file into the checkpoint folder save_checkpoint returned:
// <checkpoint>/comm_hook-rank<R>.pt, a state dict (save_state_dict: atomic; torch.load reads it).
// It is outside the MANIFEST, which rank 0 writes before the other ranks' files exist.
//   auto folder = ddp::save_checkpoint(root, *model.module(), &optimizer, progress, pg);
//   ddp::save_comm_hook_state(model.comm_hook(), folder, pg->rank());
//   ...
//   ddp::load_comm_hook_state(model.comm_hook(), folder, pg->rank());
#include <filesystem>
#include <string>

#include "ddp/algorithms/comm.h"

namespace ddp {

std::filesystem::path comm_hook_state_file(const std::filesystem::path& checkpoint, int rank);

// Writes the hook's state (nothing for a stateless hook). Throws ddp::IoError when the folder does
// not exist on this host (ranks on other hosts need a shared file system) or the write fails.
void save_comm_hook_state(const CommHookInterface& hook, const std::filesystem::path& checkpoint, int rank);

// Restores it; false when the checkpoint has no state for this rank (saved without a hook, with a
// stateless one, or by fewer ranks): the hook then starts afresh. Throws ddp::IoError for an
// unreadable file, ddp::InvalidArgument when the state is not this hook's.
bool load_comm_hook_state(CommHookInterface& hook, const std::filesystem::path& checkpoint, int rank);

}  // namespace ddp
