// launcher/line_splitter.h: '\r' progress updates (See Note [Progress lines]).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "launcher/line_splitter.h"

using ddp::launcher::is_progress_piece;
using ddp::launcher::LineSplitter;

namespace {

std::vector<std::string> split(const std::vector<std::string>& reads) {
  LineSplitter splitter(64);
  std::vector<std::string> pieces;
  const LineSplitter::Emit emit = [&](std::string_view p) { pieces.emplace_back(p); };
  for (const auto& r : reads) splitter.feed(r, emit);
  splitter.flush(emit);
  return pieces;
}

}  // namespace

TEST_CASE("progress updates: each '\\r' ends a piece, so each update gets its own prefix", "[launcher][output]") {
  // As a training loop prints: "\r" before each update, a newline after the epoch.
  const auto pieces = split({"\rTrain 1 [64/512]\rTrain 1 [512/512]\nTest set: 0.5\n"});
  CHECK(pieces == std::vector<std::string>{"Train 1 [64/512]\r", "Train 1 [512/512]\n", "Test set: 0.5\n"});
  CHECK(is_progress_piece(pieces[0]));
  CHECK_FALSE(is_progress_piece(pieces[1]));
}

TEST_CASE("progress updates: \"\\r\\n\" stays one line end, also across reads", "[launcher][output]") {
  CHECK(split({"a\r\nb\r\n"}) == std::vector<std::string>{"a\r\n", "b\r\n"});
  CHECK(split({"a\r", "\nb\n"}) == std::vector<std::string>{"a\r\n", "b\n"});
  // A '\r' at the end of a read followed by text: an update after all.
  CHECK(split({"a\r", "b\r", "c"}) == std::vector<std::string>{"a\r", "b\r", "c\n"});
  // A last update at EOF still ends its line.
  CHECK(split({"x\rdone\r"}) == std::vector<std::string>{"x\r", "done\r\n"});
}

TEST_CASE("progress updates: byte by byte gives the same pieces", "[launcher][output]") {
  const std::string text = "\rstep 1\rstep 2\r\nend\n\r\rlast";
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  CHECK(split(bytes) == split({text}));
  CHECK(split({text}) == std::vector<std::string>{"step 1\r", "step 2\r\n", "end\n", "last\n"});
}
