#include "launcher/process/line_splitter.h"

namespace ddp::launcher {

std::string rank_prefix(int global_rank) { return "[rank " + std::to_string(global_rank) + "]: "; }

bool is_progress_piece(std::string_view piece) { return !piece.empty() && piece.back() == '\r'; }

void LineSplitter::emit_piece(std::string_view piece, const Emit& emit) {
  if (piece == "\r") return;  // nothing before the '\r': See Note [Progress lines]
  emit(piece);
}

void LineSplitter::feed(std::string_view bytes, const Emit& emit) {
  while (!bytes.empty()) {
    // A '\r' kept from the previous read: a line end if this read starts with '\n', else an update.
    if (!pending_.empty() && pending_.back() == '\r') {
      if (bytes.front() == '\n') {
        pending_ += '\n';
        bytes.remove_prefix(1);
      }
      emit_piece(pending_, emit);
      pending_.clear();
      continue;
    }
    size_t end = bytes.find_first_of("\r\n");
    // A '\r' ending this read may be the first half of "\r\n": keep it until the next byte comes.
    if (end != std::string_view::npos && bytes[end] == '\r' && end + 1 == bytes.size()) end = std::string_view::npos;
    if (end == std::string_view::npos) {
      pending_.append(bytes.data(), bytes.size());
      while (pending_.size() >= max_line_) {
        emit(pending_.substr(0, max_line_) + '\n');
        pending_.erase(0, max_line_);
      }
      return;
    }
    if (bytes[end] == '\r' && bytes[end + 1] == '\n') ++end;  // "\r\n": one line end
    if (pending_.empty()) {
      emit_piece(bytes.substr(0, end + 1), emit);
    } else {
      pending_.append(bytes.data(), end + 1);
      emit_piece(pending_, emit);
      pending_.clear();
    }
    bytes.remove_prefix(end + 1);
  }
}

void LineSplitter::flush(const Emit& emit) {
  if (pending_.empty()) return;
  pending_ += '\n';  // a last progress update ends its line too
  emit_piece(pending_, emit);
  pending_.clear();
}

}  // namespace ddp::launcher
