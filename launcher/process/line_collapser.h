#pragma once
// --collapse_lines: a line that several ranks print alike, printed once. See Note [Collapsed lines]
// in line_collapser.cpp.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher::process {

class LineCollapser {
 public:
  using Clock = std::chrono::steady_clock;
  // Lines go to console_fd; `ranks` is how many ranks write here (a line all of them printed goes
  // out at once); one held longer than `window` goes out with the ranks it has.
  LineCollapser(int console_fd, int ranks, std::chrono::milliseconds window);
  LineCollapser(const LineCollapser&) = delete;
  LineCollapser& operator=(const LineCollapser&) = delete;
  ~LineCollapser() { flush_all(); }

  // `line` ends with '\n' (or is a last piece without one); `single_prefix` is the rank's own
  // prefix, used when no other rank printed the same.
  void add(int rank, std::string_view line, const std::string& single_prefix, Clock::time_point now);
  // Prints the held lines that are complete or older than the window, oldest first.
  void flush_due(Clock::time_point now);
  void flush_all();
  // How long until the oldest held line is due (the supervisor's poll timeout); -1: none held.
  int ms_until_due(Clock::time_point now) const;

 private:
  struct Group {
    std::uint64_t id = 0;
    std::string text;
    std::vector<int> ranks;
    std::string single_prefix;  // the first rank's
    Clock::time_point first_seen;
  };
  void print_front();

  int console_fd_;
  int ranks_;
  std::chrono::milliseconds window_;
  std::deque<Group> held_;
  std::map<int, std::uint64_t> last_group_;  // each rank's latest group: its next line goes after it
  std::uint64_t next_id_ = 1;
};

// "0-3,5,7-8": sorted ranks, runs of consecutive ones as ranges.
std::string format_rank_ranges(std::vector<int> ranks);

}  // namespace ddp::launcher::process
