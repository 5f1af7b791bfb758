#pragma once
// Diagnostics of a process group's collectives: the per-rank ring buffer of the last collectives
// (see Note [Collective ring buffer]), its file, and the check that names the ranks that did not
// arrive at a collective that timed out (see Note [Naming the ranks that did not arrive]).
// Torch-free: ProcessGroup feeds it, the tests drive it directly with a map as the store.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/base/detail/report_files.h"
#include "ddp/distributed/collective_record.h"

namespace ddp::detail {

// How a collective is waited for: the host blocks (bounded by the timeout) or only the CUDA stream
// waits. See Note [Which waits block the host] in ddp/runtime/detail/cuda_support.h.
enum class WaitMode { kBlocking, kStreamOrdered };  // kBlocking first: WaitMode{} in process_group.h
const char* to_string(WaitMode mode);  // "blocking", "stream-ordered"

// Note [Collective ring buffer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each process group keeps its last `capacity` collectives (64 by default) in a fixed ring: begin()
// overwrites the oldest slot, so the cost per collective is one short lock and a copy of a small
// struct, and memory never grows. Sequence numbers are assigned whatever the capacity (0 included,
// which keeps no record), because the arrival check needs them. On a timeout or communication error
// the ring is written to <log dir>/collectives-rank<R>.json (collectives_json); the files of two
// ranks side by side show where they diverged: the same seq with a different op or size is a desync,
// a rank whose last seq is lower did not arrive.
class CollectiveLog {
 public:
  explicit CollectiveLog(std::size_t capacity = 64);

  // Assigns the next sequence number to `record`, stores it (started) and returns the number.
  std::int64_t begin(CollectiveRecord record);
  // Remembers the backend's work object of collective seq, for find_started().
  void attach(std::int64_t seq, const void* work);
  // Marks collective seq completed or failed; false when it is no longer held (overwritten).
  bool finish(std::int64_t seq, CollectiveState state);
  // The sequence number of the newest started collective whose work object is `work`.
  std::optional<std::int64_t> find_started(const void* work) const;
  // A copy of the record of seq, if still held.
  std::optional<CollectiveRecord> find(std::int64_t seq) const;
  // The newest completed collective held (0: none).
  std::int64_t last_completed() const;

  // The records held, oldest first.
  std::vector<CollectiveRecord> snapshot() const;
  // The last sequence number assigned (0 before the first collective).
  std::int64_t last_seq() const;
  std::size_t capacity() const { return slots_.size(); }

 private:
  CollectiveRecord* slot_of(std::int64_t seq);
  const CollectiveRecord* slot_of(std::int64_t seq) const;
  // The oldest sequence number still in the ring (last_seq_ + 1 when empty); the caller holds mutex_.
  std::int64_t oldest_held() const;

  mutable std::mutex mutex_;
  std::vector<CollectiveRecord> slots_;  // seq s lives in slots_[(s - 1) % capacity]
  std::int64_t last_seq_ = 0;
};

// Wall-clock microseconds since the epoch.
std::int64_t unix_now_us();
// Steady-clock nanoseconds: DDP's timings (a bucket's launch, HookWork::done_ns) on one clock.
std::int64_t now_ns();

// "580 B", "12.5 KiB", "1.2 MiB", "3.0 GiB".
std::string format_bytes(std::int64_t bytes);

// The JSON text of a ring buffer file (format in docs/faults.md): a header, then one collective per
// line, oldest first.
struct CollectiveDumpHeader {
  int rank = 0;
  int world_size = 1;
  std::string backend;
  std::string reason;  // the error that made the rank write the file
  std::int64_t last_seq = 0;
  std::size_t capacity = 0;
};
std::string collectives_json(const CollectiveDumpHeader& header, const std::vector<CollectiveRecord>& records);

// Writes text to dir/collectives_file_name(rank) (ddp/base/detail/report_files.h) atomically
// (write_file_atomically in ddp/base/detail/files.h), creating dir if needed. Returns the path, or nullopt when it cannot (the caller is already failing: a
// diagnostics file must not hide the real error).
std::optional<std::string> write_collectives_file(const std::string& dir, int rank, const std::string& text);

// --- Naming the ranks that did not arrive -------------------------------------------------------

// What a rank published: the sequence number and the purpose ("what") of the collective it is in.
struct Arrival {
  std::int64_t seq = 0;
  std::string what;
};

// Where the other ranks were when this rank's collective `seq` timed out.
struct ArrivalReport {
  std::vector<int> silent;                           // sent no report in the window
  std::vector<std::pair<int, std::int64_t>> behind;  // last entered an earlier collective (rank, seq)
  std::vector<std::pair<int, std::int64_t>> still_inside;  // behind, in one that completed here (rank, seq)
  std::vector<std::pair<int, std::int64_t>> ahead;   // already in a later one (rank, seq)
  std::vector<std::pair<int, std::string>> mismatched;  // the same seq, another collective (rank, what)
  std::string what;                                  // this rank's collective
  std::chrono::milliseconds window{0};               // how long reports were waited for
  bool store_failed = false;                         // the store did not answer (e.g. rank 0 is gone)
  std::chrono::milliseconds answered{0};             // with store_failed: how long it answered before
  std::int64_t last_completed = 0;                   // this rank's last completed collective (0: none)
  bool all_arrived() const { return silent.empty() && behind.empty() && still_inside.empty() && mismatched.empty(); }
};

// Pure: sorts the reports (reported[r] = what rank r published, nullopt if none) against this
// rank's collective (seq, what).
ArrivalReport classify_arrivals(int self, const Arrival& mine, const std::vector<std::optional<Arrival>>& reported);

// Moves each rank of report.behind whose collective completed on this rank (completed_here(seq)) to
// report.still_inside: it arrived there and waits for another rank (Note [Collectives end unevenly]).
void separate_still_inside(ArrivalReport& report, const std::function<bool(std::int64_t)>& completed_here);

// The report with every rank r replaced by global_rank(r): a sub-group's ranks named as in the world.
ArrivalReport in_global_ranks(ArrivalReport report, const std::function<int(int)>& global_rank);

// "rank(s) 1 did not arrive (rank 1 last entered collective #36)" and the like.
std::string describe_arrivals(const ArrivalReport& report);

// The store operations the check needs (c10d's store in process_group.cpp, a map in the tests). Each
// call may block or throw; check_arrivals bounds them.
struct ArrivalStore {
  std::function<void(const std::string& key, const std::string& value)> set;
  std::function<std::optional<std::string>(const std::string& key)> get;  // nullopt: not there (yet)
};

// How much later than the store's host another rank may time out in the same collective and still
// read the store for its whole window: after its window the host waits this long at most for the
// ranks that reported to finish reading.
inline constexpr std::chrono::milliseconds kArrivalLingerSlack{1000};
// How long a rank whose collective timed out waits for the others' reports: min(timeout, 2 s).
inline std::chrono::milliseconds arrival_window(std::chrono::milliseconds timeout) {
  return std::min(timeout, std::chrono::milliseconds(2000));
}

// Publishes this rank's collective and collects the others' within `window` (polling); then says
// that it finished reading. See Note [Naming the ranks that did not arrive]. `linger` (the rank
// that hosts the store, so that the others can still read it): stay for the whole window even when
// every rank has reported, then until each rank that reported finished reading, or
// kArrivalLingerSlack more. Returns within window (+ the slack when lingering) + 1 s whatever the
// store does.
ArrivalReport check_arrivals(const ArrivalStore& store, int rank, int world_size, const Arrival& mine,
                             std::chrono::milliseconds window, bool linger = false);

// The key under which rank publishes its sequence number.
std::string arrival_key(int rank);
// The key under which rank says that it finished reading the others' (the host may leave).
std::string arrival_done_key(int rank);

}  // namespace ddp::detail
