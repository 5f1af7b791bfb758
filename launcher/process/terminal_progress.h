#pragma once
// One live progress line per rank at the bottom of a terminal. Pure: it returns the bytes to write.
#include <cstddef>
#include <map>
#include <string>
#include <string_view>

namespace ddp::launcher::process {

// Note [Progress on a terminal]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With several ranks printing '\r' progress (See Note [Progress lines] in line_splitter.h) to one
// terminal, redrawing "the current line" makes the ranks overwrite each other. When the launcher's
// stdout is a terminal, the attempt's workers share one TerminalProgress instead: it keeps each rank's
// latest update (prefix included) in a block of lines at the bottom of the screen, one line per rank,
// redrawn in place; a whole line from any rank is printed above the block (the block is erased,
// the line written, the block drawn again), and a rank's whole line also ends its live line, as the
// newline after the last update of an epoch does on a single terminal. Lines are cut to the terminal's
// width, so that each takes exactly one row and the cursor arithmetic (ANSI "cursor up", "erase
// below") stays right. Output that bypasses it (the launcher's own log lines) can leave a stale
// copy of the block on screen; nothing is lost, the logs keep every byte.
class TerminalProgress {
 public:
  // The bytes to write around a whole line: `before` on the terminal, then the line on its stream,
  // then `after` on the terminal.
  struct Around {
    std::string before;
    std::string after;
  };

  // `width`: the terminal's columns (0: do not cut).
  explicit TerminalProgress(std::size_t width = 0) : width_(width) {}

  // A progress update of `rank` (the prefixed text, without its '\r'): the bytes that redraw the block.
  std::string update(int rank, std::string_view text);
  // A whole line of `rank` is about to be written: it ends the rank's live line.
  Around line(int rank);

 private:
  std::string erase();
  std::string draw();

  std::size_t width_;
  std::map<int, std::string> lines_;  // rank -> its latest update, in rank order on screen
  std::size_t drawn_ = 0;             // rows of the block on screen now; the cursor is below them
};

// The columns of the terminal `fd` refers to; 0 when it is not a terminal.
std::size_t terminal_width(int fd);

}  // namespace ddp::launcher::process
