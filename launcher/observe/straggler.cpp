#include "launcher/observe/straggler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "ddp/base/str.h"

namespace ddp::launcher::observe {

void StragglerDetector::add(int rank, const StepTiming& timing) {
  auto& steps = timings_[rank];
  steps[timing.step] = timing;
  const std::size_t keep = 4 * static_cast<std::size_t>(std::max(1, options_.window));
  while (steps.size() > keep) steps.erase(steps.begin());
}

void StragglerDetector::forget(int rank) { timings_.erase(rank); }

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The median of `sorted` without its element at `skip`: one sort for every rank's "the others'"
// (standings() runs every 100 ms in every launcher, over every rank of the job).
double median_without(const std::vector<double>& sorted, std::size_t skip) {
  const std::size_t n = sorted.size() - 1;
  const auto at = [&](std::size_t i) { return sorted[i < skip ? i : i + 1]; };
  return n % 2 == 1 ? at(n / 2) : (at(n / 2 - 1) + at(n / 2)) / 2;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(separator, begin), text.size());
    parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

// A whole decimal number of at most 18 digits, or nullopt.
std::optional<std::int64_t> whole_number(const std::string& text) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::strtoll(text.c_str(), nullptr, 10);
}

}  // namespace

std::vector<RankStanding> StragglerDetector::standings() const {
  const auto window = static_cast<std::size_t>(std::max(1, options_.window));
  std::int64_t newest = 0;
  for (const auto& [rank, steps] : timings_) {
    if (!steps.empty()) newest = std::max(newest, steps.rbegin()->first);
  }
  std::vector<const std::map<std::int64_t, StepTiming>*> current;  // See Note [Stragglers]: current ranks
  std::vector<int> ranks;
  for (const auto& [rank, steps] : timings_) {
    if (steps.empty() || steps.rbegin()->first < newest - static_cast<std::int64_t>(window)) continue;
    if (steps.begin()->first > newest - static_cast<std::int64_t>(window) + 1) continue;  // joined less than a window ago
    current.push_back(&steps);
    ranks.push_back(rank);
  }
  if (current.size() < 2) return {};
  std::vector<std::int64_t> complete;  // the newest `window` steps every current rank reported
  for (auto it = current.front()->rbegin(); it != current.front()->rend() && complete.size() < window; ++it) {
    const bool everyone = std::all_of(current.begin() + 1, current.end(),
                                      [&](const auto* steps) { return steps->count(it->first) > 0; });
    if (everyone) complete.push_back(it->first);
  }
  if (complete.size() < window) return {};
  std::vector<std::vector<double>> busy(current.size());
  std::vector<int> last(current.size(), 0);
  for (const std::int64_t step : complete) {
    std::size_t least = 0;
    for (std::size_t k = 0; k < current.size(); ++k) {
      const StepTiming& t = current[k]->at(step);
      busy[k].push_back(t.busy_s);
      if (t.wait_s < current[least]->at(step).wait_s) least = k;
    }
    ++last[least];
  }
  std::vector<double> typical_busy;  // each rank's median over the window
  for (auto& b : busy) typical_busy.push_back(median(std::move(b)));
  std::vector<double> sorted = typical_busy;
  std::sort(sorted.begin(), sorted.end());
  std::vector<RankStanding> out;
  for (std::size_t k = 0; k < current.size(); ++k) {
    const auto position = static_cast<std::size_t>(
        std::lower_bound(sorted.begin(), sorted.end(), typical_busy[k]) - sorted.begin());
    const double typical = median_without(sorted, position);  // the other ranks' medians' median
    RankStanding s;
    s.rank = ranks[k];
    s.ratio = typical > 1e-9 ? typical_busy[k] / typical : 1.0;
    s.last_share = static_cast<double>(last[k]) / static_cast<double>(window);
    s.straggler = s.ratio >= options_.factor;
    s.first_step = complete.back();
    s.last_step = complete.front();
    out.push_back(s);
  }
  return out;
}

std::string describe_straggler(const RankStanding& s, int window, const std::string& rank_name) {
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.1f", s.ratio);
  return ddp::str(rank_name, ": steps ", ratio, "x the median for the last ", window, " (steps ", s.first_step, "-",
                  s.last_step, "); last to arrive in ",
                  std::lround(100 * s.last_share), "% of all-reduces");
}

std::string encode_timings(const std::vector<std::pair<int, StepTiming>>& timings) {
  std::string out;
  for (const auto& [rank, t] : timings) {
    if (!out.empty()) out += ',';
    out += ddp::str(rank, ":", t.step, ":", std::llround(t.busy_s * 1e6), ":", std::llround(t.wait_s * 1e6));
  }
  return out;
}

std::vector<std::pair<int, StepTiming>> decode_timings(const std::string& text) {
  std::vector<std::pair<int, StepTiming>> out;
  for (const std::string& item : split(text, ',')) {
    const std::vector<std::string> parts = split(item, ':');
    if (parts.size() != 4) continue;
    const auto rank = whole_number(parts[0]), step = whole_number(parts[1]);
    const auto busy = whole_number(parts[2]), wait = whole_number(parts[3]);
    if (!rank || !step || !busy || !wait || *rank > (1 << 24) || *step < 1) continue;
    out.push_back({static_cast<int>(*rank), {*step, static_cast<double>(*busy) / 1e6, static_cast<double>(*wait) / 1e6}});
  }
  return out;
}

}  // namespace ddp::launcher::observe
