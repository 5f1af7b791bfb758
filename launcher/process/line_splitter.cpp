#include "launcher/process/line_splitter.h"

#include <cctype>
#include <optional>

namespace ddp::launcher::process {

std::string rank_prefix(int global_rank) { return "[rank " + std::to_string(global_rank) + "]: "; }

// Note [Log line prefix]
// ~~~~~~~~~~~~~~~~~~~~~~
// torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (and our --log_line_prefix_template, which wins)
// is a Python string.Template that torchrun expands with safe_substitute: ${name} or $name (name:
// a letter or '_', then letters, digits, '_') becomes role_name, rank or local_rank (and here also
// hostname); $$ becomes $; anything else, an unknown name included, stays as written. The result
// precedes each line with nothing in between, as torchrun's header does ("[${rank}]:" gives
// "[3]:line"). Without a template the prefix is "[rank N]: ".
std::string line_prefix(const std::string& line_template, const LinePrefixFields& fields) {
  if (line_template.empty()) return rank_prefix(fields.rank);
  const auto value = [&](const std::string& name) -> std::optional<std::string> {
    if (name == "role_name") return fields.role_name;
    if (name == "rank") return std::to_string(fields.rank);
    if (name == "local_rank") return std::to_string(fields.local_rank);
    if (name == "hostname") return fields.hostname;
    return std::nullopt;
  };
  const auto starts_name = [](char ch) { return std::isalpha(static_cast<unsigned char>(ch)) || ch == '_'; };
  const auto in_name = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  std::string out;
  for (std::size_t i = 0; i < line_template.size(); ++i) {
    const char ch = line_template[i];
    if (ch != '$' || i + 1 == line_template.size()) {
      out += ch;
      continue;
    }
    const char next = line_template[i + 1];
    if (next == '$') {
      out += '$';
      ++i;
      continue;
    }
    std::size_t begin = i + 1;
    std::size_t end = begin;
    bool braced = false;
    if (next == '{') {
      braced = true;
      begin = end = i + 2;
    }
    if (end < line_template.size() && starts_name(line_template[end])) {
      while (end < line_template.size() && in_name(line_template[end])) ++end;
    }
    const bool closed = !braced || (end < line_template.size() && line_template[end] == '}');
    const std::optional<std::string> replacement =
        end > begin && closed ? value(line_template.substr(begin, end - begin)) : std::nullopt;
    if (!replacement) {
      out += ch;  // safe_substitute: left as written
      continue;
    }
    out += *replacement;
    i = braced ? end : end - 1;
  }
  return out;
}

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

}  // namespace ddp::launcher::process
