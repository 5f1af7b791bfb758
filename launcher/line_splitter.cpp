#include "launcher/line_splitter.h"

namespace ddp::launcher {

std::string rank_prefix(int global_rank) { return "[rank " + std::to_string(global_rank) + "]: "; }

void LineSplitter::feed(std::string_view bytes, const Emit& emit) {
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    if (nl == std::string_view::npos) {
      pending_.append(bytes.data(), bytes.size());
      while (pending_.size() >= max_line_) {
        emit(pending_.substr(0, max_line_) + '\n');
        pending_.erase(0, max_line_);
      }
      return;
    }
    if (pending_.empty()) {
      emit(bytes.substr(0, nl + 1));
    } else {
      pending_.append(bytes.data(), nl + 1);
      emit(pending_);
      pending_.clear();
    }
    bytes.remove_prefix(nl + 1);
  }
}

void LineSplitter::flush(const Emit& emit) {
  if (pending_.empty()) return;
  pending_ += '\n';
  emit(pending_);
  pending_.clear();
}

}  // namespace ddp::launcher
