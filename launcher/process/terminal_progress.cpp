#include "launcher/process/terminal_progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

namespace ddp::launcher::process {

std::string TerminalProgress::erase() {
  if (drawn_ == 0) return "";
  std::string out = "\x1b[" + std::to_string(drawn_) + "A\x1b[J";  // up to the block's first row, erase below
  drawn_ = 0;
  return out;
}

std::string TerminalProgress::draw() {
  std::string out;
  for (const auto& [rank, text] : lines_) {
    // One row each: cut to the width (by bytes; a cut multi-byte character only costs a glyph).
    out.append(text, 0, width_ > 1 ? std::min(text.size(), width_ - 1) : text.size());
    out += "\x1b[K\n";
  }
  drawn_ = lines_.size();
  return out;
}

std::string TerminalProgress::update(int rank, std::string_view text) {
  std::string out = erase();
  lines_[rank] = std::string(text);
  return out + draw();
}

TerminalProgress::Around TerminalProgress::line(int rank) {
  Around around;
  around.before = erase();
  lines_.erase(rank);
  around.after = draw();
  return around;
}

std::size_t terminal_width(int fd) {
  winsize size{};
  if (::isatty(fd) != 1 || ::ioctl(fd, TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_col;
}

}  // namespace ddp::launcher::process
