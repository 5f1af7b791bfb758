#include "ddp/distributed/detail/collective_log.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "ddp/base/detail/files.h"
#include "ddp/base/detail/json_text.h"
#include "ddp/base/detail/store_values.h"
#include "ddp/base/str.h"

namespace ddp {

const char* to_string(CollectiveState state) {
  switch (state) {
    case CollectiveState::kStarted: return "started";
    case CollectiveState::kCompleted: return "completed";
    case CollectiveState::kFailed: return "failed";
  }
  return "?";
}

}  // namespace ddp

namespace ddp::detail {

const char* to_string(WaitMode mode) { return mode == WaitMode::kStreamOrdered ? "stream-ordered" : "blocking"; }

CollectiveLog::CollectiveLog(std::size_t capacity) : slots_(capacity) {}

CollectiveRecord* CollectiveLog::slot_of(std::int64_t seq) {
  if (slots_.empty() || seq <= 0 || seq > last_seq_) return nullptr;
  CollectiveRecord& slot = slots_[static_cast<std::size_t>(seq - 1) % slots_.size()];
  return slot.seq == seq ? &slot : nullptr;
}

const CollectiveRecord* CollectiveLog::slot_of(std::int64_t seq) const {
  return const_cast<CollectiveLog*>(this)->slot_of(seq);
}

std::int64_t CollectiveLog::begin(CollectiveRecord record) {
  std::lock_guard<std::mutex> lock(mutex_);
  record.seq = ++last_seq_;
  record.state = CollectiveState::kStarted;
  if (!slots_.empty()) slots_[static_cast<std::size_t>(record.seq - 1) % slots_.size()] = record;
  return record.seq;
}

void CollectiveLog::attach(std::int64_t seq, const void* work) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (CollectiveRecord* slot = slot_of(seq)) slot->work = work;
}

bool CollectiveLog::finish(std::int64_t seq, CollectiveState state) {
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveRecord* slot = slot_of(seq);
  if (slot == nullptr) return false;
  slot->state = state;
  slot->end_unix_us = unix_now_us();
  return true;
}

std::int64_t CollectiveLog::oldest_held() const {
  return last_seq_ - std::min<std::int64_t>(last_seq_, static_cast<std::int64_t>(slots_.size())) + 1;
}

std::optional<std::int64_t> CollectiveLog::find_started(const void* work) const {
  std::lock_guard<std::mutex> lock(mutex_);
  // Newest first: a work object's address may be reused by a later one once the first is freed.
  for (std::int64_t seq = last_seq_; seq >= oldest_held(); --seq) {
    const CollectiveRecord* slot = slot_of(seq);
    if (slot != nullptr && slot->work == work && slot->state == CollectiveState::kStarted) return seq;
  }
  return std::nullopt;
}

std::optional<CollectiveRecord> CollectiveLog::find(std::int64_t seq) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const CollectiveRecord* slot = slot_of(seq);
  if (slot == nullptr) return std::nullopt;
  return *slot;
}

std::int64_t CollectiveLog::last_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::int64_t seq = last_seq_; seq >= oldest_held(); --seq) {
    if (slot_of(seq)->state == CollectiveState::kCompleted) return seq;
  }
  return 0;
}

std::vector<CollectiveRecord> CollectiveLog::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CollectiveRecord> out;
  const std::int64_t oldest = oldest_held();
  out.reserve(static_cast<std::size_t>(last_seq_ - oldest + 1));
  for (std::int64_t seq = oldest; seq <= last_seq_; ++seq) out.push_back(*slot_of(seq));
  return out;
}

std::int64_t CollectiveLog::last_seq() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_seq_;
}

std::int64_t unix_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", value, units[unit]);
  }
  return buf;
}

std::string collectives_json(const CollectiveDumpHeader& header, const std::vector<CollectiveRecord>& records) {
  // The layout (a header of three lines, one collective per line) is the documented format; the
  // values come from nlohmann-json (see Note [JSON through nlohmann-json] in ddp/base/detail/json_text.h).
  std::string out = str("{\"rank\": ", header.rank, ", \"world_size\": ", header.world_size,
                        ", \"backend\": ", json_string(header.backend), ", \"last_seq\": ", header.last_seq,
                        ", \"capacity\": ", header.capacity, ", \"written_unix_us\": ", unix_now_us(),
                        ",\n \"reason\": ", json_string(header.reason), ",\n \"collectives\": [");
  for (std::size_t i = 0; i < records.size(); ++i) {
    const CollectiveRecord& r = records[i];
    out += str(i == 0 ? "\n" : ",\n", "  {\"seq\": ", r.seq, ", \"op\": ", json_string(r.op),
               ", \"what\": ", json_string(r.what), ", \"bucket\": ", r.bucket, ", \"numel\": ", r.numel,
               ", \"dtype\": ", json_string(r.dtype), ", \"bytes\": ", r.bytes,
               ", \"start_unix_us\": ", r.start_unix_us, ", \"end_unix_us\": ", r.end_unix_us,
               ", \"state\": ", json_string(to_string(r.state)), ", \"algorithm\": ", json_string(r.algorithm),
               ", \"wait\": ", json_string(r.wait), "}");
  }
  out += records.empty() ? "]}\n" : "\n ]}\n";
  return out;
}

std::optional<std::string> write_collectives_file(const std::string& dir, int rank, const std::string& text) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  const std::string path = (std::filesystem::path(dir) / collectives_file_name(rank)).string();
  if (!try_write_file_atomically(path, text, kReportFileMode)) return std::nullopt;
  return path;
}

// --- Naming the ranks that did not arrive -------------------------------------------------------

// Note [Naming the ranks that did not arrive]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A collective that times out says only "timed out" on the ranks that arrived: the backend does not
// know who is missing. Asking costs nothing on the normal path: no store round trip per collective,
// only the per-group sequence number that every collective carries anyway (CollectiveLog). When a
// collective times out, the rank publishes "I am at seq N" under arrival/<rank> in the process
// group's store (a PrefixStore of its own), then polls the other ranks' keys for a short window,
// min(timeout, 2 s): the ranks that arrived at the same collective time out at about the same
// moment and publish too. The value is "<seq> <what>", so that ranks stuck under the same number in
// different collectives (a desync) are told apart from a stalled backend. The rank that hosts the
// store (rank 0, TCPStore) must not take the store away from ranks that timed out a little later (on
// a loaded machine the ranks' timeouts fire hundreds of milliseconds apart): it stays for its whole
// window, and then until every rank that reported has also said it finished reading
// (arrival_done/<rank>), kArrivalLingerSlack at most. A silent rank is not waited for, so a lone hung
// peer costs the host no more than the window. Should the store still go away during a rank's
// window, the report says how long it answered rather than that it never did.
// A rank whose key is still missing after the window is not inside any collective of this group (it
// hangs in computation, or is gone). A rank that published a lower number is stuck in an earlier
// collective: if that one completed here, it is still inside it, waiting for another rank (Note
// [Collectives end unevenly]); otherwise a desync (it skipped or reordered one). A higher number means
// this rank is behind: with ranks missing, the other finished the collective this one waits in; with
// none, a desync. The store calls run on a helper thread and are abandoned after the window plus 1 s,
// so a dead store (rank 0 gone) cannot turn a timeout into a hang. Keys are overwritten by later
// timeouts; after a timeout the group is unusable anyway.

std::string arrival_key(int rank) { return str("arrival/", rank); }

std::string arrival_done_key(int rank) { return str("arrival_done/", rank); }

ArrivalReport classify_arrivals(int self, const Arrival& mine, const std::vector<std::optional<Arrival>>& reported) {
  ArrivalReport report;
  report.what = mine.what;
  for (int r = 0; r < static_cast<int>(reported.size()); ++r) {
    if (r == self) continue;
    const auto& other = reported[static_cast<std::size_t>(r)];
    if (!other) {
      report.silent.push_back(r);
    } else if (other->seq < mine.seq) {
      report.behind.emplace_back(r, other->seq);
    } else if (other->seq > mine.seq) {
      report.ahead.emplace_back(r, other->seq);
    } else if (other->what != mine.what) {
      report.mismatched.emplace_back(r, other->what);
    }
  }
  return report;
}

namespace {

// An arrival key's value: "<seq> <what>".
std::string format_arrival(const Arrival& arrival) { return str(arrival.seq, " ", arrival.what); }

std::optional<Arrival> parse_arrival(const std::string& text) {
  std::size_t used = 0;
  Arrival arrival;
  try {
    arrival.seq = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  arrival.what = used < text.size() ? text.substr(used + 1) : std::string();
  return arrival;
}

}  // namespace

// Note [Collectives end unevenly]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A collective does not end at the same moment on every rank: a rank returns once it holds every
// byte it needs, and a peer may still wait in the same collective for a third rank. So when rank 2
// is cut off during all-reduce #18, rank 0 can complete #18 and time out in #19 while rank 1 times
// out in #18. Rank 1 did arrive at #18 (rank 0 could not have completed it otherwise), so rank 0 must
// not name it among the ranks that did not arrive, and rank 1 must not call rank 0's #19 a desync:
// both name rank 2 alone, rank 0 adds that rank 1 is still inside #18, and rank 1 that rank 0 finished
// it. Before this, rank 0 said "rank(s) 1, 2 did not arrive" (hosts.partition, once in 32 runs of a
// soak, 2026-12-07). Whether a collective completed here is known only to this rank's CollectiveLog,
// so the caller separates those ranks after the pure classification (separate_still_inside).

void separate_still_inside(ArrivalReport& report, const std::function<bool(std::int64_t)>& completed_here) {
  const auto inside = std::stable_partition(report.behind.begin(), report.behind.end(),
                                            [&](const auto& entry) { return !completed_here(entry.second); });
  report.still_inside.insert(report.still_inside.end(), inside, report.behind.end());
  report.behind.erase(inside, report.behind.end());
}

ArrivalReport in_global_ranks(ArrivalReport report, const std::function<int(int)>& global_rank) {
  for (int& rank : report.silent) rank = global_rank(rank);
  for (auto& entry : report.behind) entry.first = global_rank(entry.first);
  for (auto& entry : report.still_inside) entry.first = global_rank(entry.first);
  for (auto& entry : report.ahead) entry.first = global_rank(entry.first);
  for (auto& entry : report.mismatched) entry.first = global_rank(entry.first);
  return report;
}

std::string describe_arrivals(const ArrivalReport& report) {
  std::vector<int> missing = report.silent;
  for (const auto& [rank, seq] : report.behind) missing.push_back(rank);
  std::sort(missing.begin(), missing.end());
  std::vector<std::string> details;
  for (const auto& [rank, seq] : report.behind) details.push_back(str("rank ", rank, " last entered collective #", seq));
  if (!report.silent.empty()) {
    // Whole tenths: "1.6 s", not "1.634 s".
    const auto answered = std::chrono::round<std::chrono::duration<std::int64_t, std::deci>>(report.answered);
    details.push_back(str(report.silent.size() == 1 ? "rank " : "ranks ", join(report.silent, ", "),
                          !report.store_failed ? str(" sent no report within ", seconds_of(report.window), " s")
                          : report.answered >= std::chrono::milliseconds(100)
                              ? str(" sent no report within ", seconds_of(answered),
                                    " s (then the store stopped answering: its host left)")
                              : std::string(": the store did not answer"),
                          ": not inside any collective of this group (busy, hung, or gone)",
                          report.last_completed > 0 ? str("; #", report.last_completed, " was the last to complete here")
                                                    : std::string()));
  }
  std::string out;
  if (!missing.empty()) out = str("rank(s) ", join(missing, ", "), " did not arrive (", join(details, "; "), ")");
  if (!report.mismatched.empty()) {
    std::vector<std::string> other;
    for (const auto& [rank, what] : report.mismatched) other.push_back(str("rank ", rank, " is in ", what));
    out += str(out.empty() ? "" : "; ", join(other, ", "), " under the same number, this rank in ", report.what,
               " (a desync: the ranks issued different collectives; compare their collectives-rank*.json)");
  }
  if (!report.still_inside.empty()) {
    std::vector<std::string> inside;
    for (const auto& [rank, seq] : report.still_inside) inside.push_back(str("rank ", rank, " is still inside collective #", seq));
    out += str(out.empty() ? "" : "; ", join(inside, ", "),
               ", which completed here (it arrived there and waits for another rank)");
  }
  if (!report.ahead.empty()) {
    std::vector<std::string> ahead;
    for (const auto& [rank, seq] : report.ahead) ahead.push_back(str("rank ", rank, " is at collective #", seq));
    // See Note [Collectives end unevenly]: with a rank missing, the rank ahead finished this collective.
    out += str(out.empty() ? "" : "; ", join(ahead, ", "),
               missing.empty() ? " (this rank is behind: a desync)"
                               : " (it finished this collective, which still waits here for the rank(s) that did not arrive)");
  }
  if (out.empty()) out = "every rank reported this collective: the backend itself stalled";
  return out;
}

ArrivalReport check_arrivals(const ArrivalStore& store, int rank, int world_size, const Arrival& mine,
                             std::chrono::milliseconds window, bool linger) {
  using Clock = std::chrono::steady_clock;
  struct Shared {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    bool failed = false;
    Clock::time_point answered_until;  // the end of the last poll of every rank that the store answered
    std::vector<std::optional<Arrival>> reported;
  };
  auto shared = std::make_shared<Shared>();
  shared->reported.assign(static_cast<std::size_t>(world_size), std::nullopt);
  shared->reported[static_cast<std::size_t>(rank)] = mine;
  const auto start = Clock::now();
  shared->answered_until = start;
  const auto window_end = start + window;
  const auto deadline = window_end + (linger ? kArrivalLingerSlack : std::chrono::milliseconds(0));
  // Detached: if the store hangs, this thread is abandoned (it owns copies of everything it uses).
  std::thread([shared, store, rank, world_size, mine, window_end, deadline, linger] {
    bool failed = false;
    try {
      store.set(arrival_key(rank), format_arrival(mine));
      std::vector<bool> finished_reading(static_cast<std::size_t>(world_size), false);
      finished_reading[static_cast<std::size_t>(rank)] = true;
      while (true) {
        bool all = true;
        bool readers_finished = true;  // the host waits only for ranks that reported: a silent one reads nothing
        for (int r = 0; r < world_size; ++r) {
          const auto index = static_cast<std::size_t>(r);
          bool arrived = false;
          {
            std::lock_guard<std::mutex> lock(shared->mutex);
            arrived = shared->reported[index].has_value();
          }
          if (!arrived) {
            std::optional<Arrival> value;
            if (const auto text = store.get(arrival_key(r))) value = parse_arrival(*text);
            arrived = value.has_value();
            std::lock_guard<std::mutex> lock(shared->mutex);
            shared->reported[index] = std::move(value);
          }
          all = all && arrived;
          if (linger && arrived && !finished_reading[index]) {
            finished_reading[index] = store.get(arrival_done_key(r)).has_value();
          }
          readers_finished = readers_finished && (!arrived || finished_reading[index]);
        }
        const auto now = Clock::now();
        {
          std::lock_guard<std::mutex> lock(shared->mutex);
          shared->answered_until = now;
        }
        if (!linger && (all || now >= window_end)) break;
        if (linger && now >= window_end && (readers_finished || now >= deadline)) break;
        std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - now));
      }
    } catch (const std::exception&) {
      failed = true;
    }
    if (!failed && !linger) {
      try {
        store.set(arrival_done_key(rank), "1");  // the host may leave now, as far as this rank goes
      } catch (const std::exception&) {
        // The report is complete; the host leaves after its slack instead.
      }
    }
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->failed = failed;
    shared->done = true;
    shared->done_cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->mutex);
  const bool finished =
      shared->done_cv.wait_until(lock, deadline + std::chrono::seconds(1), [&] { return shared->done; });
  ArrivalReport report = classify_arrivals(rank, mine, shared->reported);
  report.window = window;
  report.store_failed = shared->failed || !finished;
  if (report.store_failed) {
    report.answered = std::chrono::duration_cast<std::chrono::milliseconds>(shared->answered_until - start);
  }
  return report;
}

}  // namespace ddp::detail
