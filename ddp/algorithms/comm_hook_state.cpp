#include "ddp/algorithms/comm_hook_state.h"

#include "ddp/base/error.h"

namespace ddp {

std::filesystem::path comm_hook_state_file(const std::filesystem::path& checkpoint, int rank) {
  return checkpoint / str("comm_hook-rank", rank, ".pt");
}

void save_comm_hook_state(const CommHookInterface& hook, const std::filesystem::path& checkpoint, int rank) {
  const StateDict state = hook.state();
  if (state.is_empty()) return;
  std::error_code error;
  if (!std::filesystem::is_directory(checkpoint, error)) {
    throw IoError(str(checkpoint.string(), ": no such checkpoint folder on this host; the communication hook's "
                      "state is written by every rank into the checkpoint folder, so ranks on several hosts need a "
                      "shared file system"));
  }
  save_state_dict(state, comm_hook_state_file(checkpoint, rank));
}

bool load_comm_hook_state(CommHookInterface& hook, const std::filesystem::path& checkpoint, int rank) {
  const auto file = comm_hook_state_file(checkpoint, rank);
  std::error_code error;
  if (!std::filesystem::exists(file, error)) return false;
  hook.load_state(load_state_dict_file(file));
  return true;
}

}  // namespace ddp
