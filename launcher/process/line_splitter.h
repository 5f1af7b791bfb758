#pragma once
// Turns a worker's byte stream into prefixed console lines. Pure: tests feed it bytes.
#include <functional>
#include <string>
#include <string_view>

namespace ddp::launcher::process {

// The default console prefix of a worker's lines: "[rank 3]: ".
std::string rank_prefix(int global_rank);

// What a worker's console lines start with. See Note [Log line prefix] in line_splitter.cpp.
struct LinePrefixFields {
  std::string role_name;
  int rank = 0;
  int local_rank = 0;
  std::string hostname;
};
// The template expanded (empty: rank_prefix(fields.rank)).
std::string line_prefix(const std::string& line_template, const LinePrefixFields& fields);

// Note [Progress lines]
// ~~~~~~~~~~~~~~~~~~~~~
// Training programs print live progress by returning to the start of the line: printf("\rTrain
// Epoch: 1 [640/60000] Loss: 0.3"), a newline only at the end of the epoch. Split at '\n' only, a
// whole epoch of updates became one huge line behind one prefix. A '\r' therefore ends a piece too:
// each progress update is emitted on its own, keeping its '\r', so that it gets the rank's prefix
// and a terminal redraws it in place ("[rank 0]: Train Epoch ...\r" then the next update over it),
// while a log file keeps every update, each prefixed. "\r\n" stays one line end (a '\r' at the end
// of a read waits for the next byte to decide), and an empty piece before a '\r' is dropped.
class LineSplitter {
 public:
  // emit receives each piece including its end: '\n' (a line; a flushed partial line gets one
  // added), "\r\n", or '\r' (a progress update, see Note [Progress lines]).
  using Emit = std::function<void(std::string_view)>;

  // Lines longer than max_line are emitted in pieces, so memory stays bounded.
  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line) {}

  void feed(std::string_view bytes, const Emit& emit);
  // At EOF: the unfinished last line, if any, with a '\n' added.
  void flush(const Emit& emit);

 private:
  void emit_piece(std::string_view piece, const Emit& emit);
  std::string pending_;
  size_t max_line_;
};

// True when `piece` (from LineSplitter) is a progress update: it ends with a '\r' alone.
bool is_progress_piece(std::string_view piece);

}  // namespace ddp::launcher::process
