#pragma once
// Turns a worker's byte stream into prefixed console lines. Pure: tests feed it bytes.
#include <functional>
#include <string>
#include <string_view>

namespace ddp::launcher {

// The one console prefix of a worker's lines: "[rank 3]: ".
std::string rank_prefix(int global_rank);

class LineSplitter {
 public:
  // emit receives each whole line including its '\n' (a flushed partial line gets one added).
  using Emit = std::function<void(std::string_view)>;

  // Lines longer than max_line are emitted in pieces, so memory stays bounded.
  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line) {}

  void feed(std::string_view bytes, const Emit& emit);
  // At EOF: the unfinished last line, if any, with a '\n' added.
  void flush(const Emit& emit);

 private:
  std::string pending_;
  size_t max_line_;
};

}  // namespace ddp::launcher
