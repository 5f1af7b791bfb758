// launcher/process/line_splitter.h and launcher/process/terminal_progress.h: '\r' progress updates (See Note
// [Progress lines]); launcher/process/line_collapser.h: --collapse_lines.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "launcher/process/line_collapser.h"
#include "launcher/process/line_splitter.h"
#include "launcher/process/terminal_progress.h"

using ddp::launcher::process::is_progress_piece;
using ddp::launcher::process::LineSplitter;

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

TEST_CASE("live progress: one line per rank at the bottom, whole lines printed above it", "[launcher][output]") {
  using ddp::launcher::process::TerminalProgress;
  TerminalProgress live(/*width=*/12);
  // Rank 1's first update: the block is one row.
  CHECK(live.update(1, "[rank 1]: 10%") == "[rank 1]: 1\x1b[K\n");  // cut to width - 1
  // Rank 0's update: erase the block (1 row up, erase below), draw both rows in rank order.
  CHECK(live.update(0, "[rank 0]: 5%") == "\x1b[1A\x1b[J[rank 0]: 5\x1b[K\n[rank 1]: 1\x1b[K\n");
  // Rank 0 updates in place: the other rank's row stays.
  CHECK(live.update(0, "[r0]: 6%") == "\x1b[2A\x1b[J[r0]: 6%\x1b[K\n[rank 1]: 1\x1b[K\n");
  // A whole line of rank 0 ends its live row: erase, (the line), redraw what is left.
  const auto around = live.line(0);
  CHECK(around.before == "\x1b[2A\x1b[J");
  CHECK(around.after == "[rank 1]: 1\x1b[K\n");
  // A line of a rank without a live row still goes above the block.
  const auto other = live.line(3);
  CHECK(other.before == "\x1b[1A\x1b[J");
  CHECK(other.after == "[rank 1]: 1\x1b[K\n");
  // Once no rank has a live row, lines cost nothing extra.
  live.line(1);
  const auto plain = live.line(1);
  CHECK(plain.before.empty());
  CHECK(plain.after.empty());
}

TEST_CASE("the log line prefix: torchrun's template, expanded as Python's safe_substitute", "[launcher][logs]") {
  using ddp::launcher::process::line_prefix;
  const ddp::launcher::process::LinePrefixFields fields{"trainer", 12, 3, "node7"};
  CHECK(line_prefix("", fields) == "[rank 12]: ");
  CHECK(line_prefix("[${role_name}${local_rank}]:", fields) == "[trainer3]:");
  CHECK(line_prefix("[$rank|$local_rank@${hostname}] ", fields) == "[12|3@node7] ");
  CHECK(line_prefix("$rank_x ${rankx} $Rank", fields) == "$rank_x ${rankx} $Rank");  // unknown names stay
  CHECK(line_prefix("$$rank ${rank", fields) == "$rank ${rank");                    // $$ is $; unclosed stays
  CHECK(line_prefix("cost $5 $ ${} $", fields) == "cost $5 $ ${} $");                // not a name: as written
  CHECK(line_prefix("${rank}${rank}", fields) == "1212");
}

TEST_CASE("--collapse_lines: a line several ranks print alike leaves once, each rank's lines in order",
          "[launcher][logs]") {
  using ddp::launcher::process::format_rank_ranges;
  using ddp::launcher::process::LineCollapser;
  CHECK(format_rank_ranges({5, 0, 1, 2, 3, 7, 8}) == "0-3,5,7-8");
  CHECK(format_rank_ranges({4}) == "4");
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const auto read_all = [&] {
    std::string out;
    char buf[4096];
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    return out;
  };
  const auto t0 = LineCollapser::Clock::now();
  const auto prefix = [](int rank) { return "[rank " + std::to_string(rank) + "]: "; };
  {
    LineCollapser c(fds[1], 4, std::chrono::milliseconds(300));
    c.add(0, "epoch 1\n", prefix(0), t0);
    c.add(2, "epoch 1\n", prefix(2), t0);
    c.add(1, "only me\n", prefix(1), t0);
    CHECK(read_all().empty());  // held: waiting for its twins
    CHECK(c.ms_until_due(t0) > 0);
    c.add(1, "epoch 1\n", prefix(1), t0);  // after its own "only me": a group of its own, not the first
    c.add(3, "epoch 1\n", prefix(3), t0);
    c.flush_due(t0 + std::chrono::milliseconds(301));
    CHECK(read_all() == "[ranks 0,2-3]: epoch 1\n[rank 1]: only me\n[rank 1]: epoch 1\n");
    c.add(0, "done\n", prefix(0), t0);
    c.add(1, "done\n", prefix(1), t0);
    c.add(2, "done\n", prefix(2), t0);
    c.add(3, "done\n", prefix(3), t0);  // every rank: out at once, no waiting
    CHECK(read_all() == "[ranks 0-3]: done\n");
    CHECK(c.ms_until_due(t0) == -1);
    c.add(2, "last words\n", prefix(2), t0);
  }  // destroyed: what is held goes out
  CHECK(read_all() == "[rank 2]: last words\n");
  ::close(fds[0]);
  ::close(fds[1]);
}
