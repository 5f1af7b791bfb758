#include "launcher/process/line_collapser.h"

#include <algorithm>

#include "launcher/process/spawn.h"

namespace ddp::launcher::process {

// Note [Collapsed lines]
// ~~~~~~~~~~~~~~~~~~~~~~
// With 64 ranks, a line every rank prints ("epoch 1 ...") fills 64 lines of a console. With
// --collapse_lines the console shows it once, as "[ranks 0-63]: epoch 1 ...". Lines that differ keep
// their rank's own prefix. So a line is held up to the flag's window to meet its twins (0.3-1 s is
// enough where the ranks print in step; ranks out of step by more print the line in two groups), and
// leaves early once every rank of the stream has printed it, or when the workers end. The groups leave in the order they were
// first seen. A rank's line never joins a group older than that rank's previous line's group, so
// each rank's lines keep their order. Only the console is collapsed: the log files keep every line
// of every rank. A stream whose lines all differ is delayed by the window and otherwise unchanged.
LineCollapser::LineCollapser(int console_fd, int ranks, std::chrono::milliseconds window)
    : console_fd_(console_fd), ranks_(ranks), window_(window) {}

void LineCollapser::add(int rank, std::string_view line, const std::string& single_prefix, Clock::time_point now) {
  const auto last = last_group_.find(rank);
  const std::uint64_t after = last == last_group_.end() ? 0 : last->second;
  for (Group& g : held_) {
    if (g.id <= after || g.text != line) continue;
    if (std::find(g.ranks.begin(), g.ranks.end(), rank) != g.ranks.end()) continue;
    g.ranks.push_back(rank);
    last_group_[rank] = g.id;
    flush_due(now);
    return;
  }
  held_.push_back({next_id_, std::string(line), {rank}, single_prefix, now});
  last_group_[rank] = next_id_++;
  flush_due(now);
}

void LineCollapser::flush_due(Clock::time_point now) {
  while (!held_.empty() &&
         (static_cast<int>(held_.front().ranks.size()) >= ranks_ || now - held_.front().first_seen >= window_)) {
    print_front();
  }
}

void LineCollapser::flush_all() {
  while (!held_.empty()) print_front();
}

int LineCollapser::ms_until_due(Clock::time_point now) const {
  if (held_.empty()) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(held_.front().first_seen + window_ - now);
  return static_cast<int>(std::max<long long>(0, left.count() + 1));
}

void LineCollapser::print_front() {
  const Group& g = held_.front();
  const std::string prefix = g.ranks.size() == 1 ? g.single_prefix : "[ranks " + format_rank_ranges(g.ranks) + "]: ";
  write_or_drop(console_fd_, prefix + g.text);  // as a worker's line: a console gone drops it
  held_.pop_front();
}

std::string format_rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace ddp::launcher::process
