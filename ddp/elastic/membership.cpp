#include "ddp/elastic/membership.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <sstream>
#include <thread>

#include "ddp/base/error.h"
#include "ddp/base/detail/store_values.h"
#include "ddp/base/str.h"
#include "ddp/elastic/detail/membership_keys.h"
#include "ddp/runtime/log.h"

namespace ddp {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string key(std::uint64_t round, const std::string& name) { return detail::membership_keys::round_key(round, name); }

std::int64_t counter(c10d::Store& store, const std::string& name) { return store.add(name, 0); }

// One arrival of a round: "<m: member of the previous round, j: joiner> <previous rank> <member id>".
struct Arrival {
  bool member = false;
  int previous_rank = -1;
  std::string id;
  std::size_t slot = 0;
};

Arrival parse_arrival(const std::string& text, std::size_t slot) {
  Arrival arrival;
  std::istringstream in(text);
  char role = 0;
  in >> role >> arrival.previous_rank;
  arrival.member = role == 'm';
  std::getline(in >> std::ws, arrival.id);
  if (in.bad() || arrival.id.empty()) throw CommunicationError(str("membership: malformed arrival '", text, "'"));
  arrival.slot = slot;
  return arrival;
}

constexpr milliseconds kPoll{5};
constexpr milliseconds kSparePoll{10};  // a waiting spare's two store reads
constexpr milliseconds kSlowRoundReport{5000};  // at least: See Note [A round that does not close]

// Why the closer closed the round: every member of the previous round accounted for (arrived, or
// marked gone by a launcher: See Note [Marking a lost node gone] in ddp/elastic/detail/membership_keys.h), or the
// settle timeout.
std::string describe_close(std::uint64_t round, int expected, std::int64_t arrived, std::int64_t left,
                           bool by_settle_timeout, milliseconds settle_timeout) {
  if (by_settle_timeout) {
    return str("round ", round, " closed after the settle timeout of ", settle_timeout.count(), " ms (", arrived,
               " of ", expected, " members of the previous round arrived, ", left, " marked gone)");
  }
  if (left == 0) return str("round ", round, " closed: all ", expected, " members of the previous round arrived");
  return str("round ", round, " closed by the left count: all ", expected, " members of the previous round accounted for (",
             arrived, " arrived, ", left, " marked gone)");
}

// Note [Taking a slot]
// ~~~~~~~~~~~~~~~~~~~~
// A round's slots and the spare pool's indexes are taken alike: the first free one by a compareSet
// that writes the arrival (or the spare's id) with it, and the count goes up only after. So every
// slot below the count holds its arrival, and whoever reads the slots below "closed" (a count)
// never waits for one. They used to be taken by adding to the count first and written after: a
// process killed between the two writes left a slot below "closed" that nobody would ever write,
// and every member of the round blocked in its read of it for the store's timeout (60 s). That
// window is hit when a host's processes are SIGKILLed one after another: the worker killed last has
// seen the first one die, begun its recovery and taken a slot (the unexplained stalls of
// hosts.live_during_recovery and hosts.live_twice in soak rounds). A process killed after its
// compareSet is a member that died during the recovery, which the round's group then finds lost.
std::int64_t take_first_free(c10d::Store& store, const std::string& count_key, const std::string& index_prefix,
                             const std::string& value) {
  const auto bytes = detail::to_bytes(value);
  std::int64_t index = counter(store, count_key);  // none is free below the count: they are taken in order
  while (store.compareSet(index_prefix + std::to_string(index), std::vector<uint8_t>(), bytes) != bytes) ++index;
  store.add(count_key, 1);
  return index;
}

// Note [Every member gone]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Only a member of the previous round closes a round (a joiner has no training state to hand on).
// When every one of them is marked gone ("left" reaches the previous round's size, none arrived),
// nobody will close it: a joiner waiting for it would only reach its timeout (minutes), so it
// fails at once instead. A member marked gone that still arrives (a false liveness report) closes
// the round itself (arrived + left >= expected), so the check also asks that none arrived.
// "left" is counted once per member and round (See Note [Marking a lost node gone] in
// ddp/elastic/detail/membership_keys.h), so it cannot reach the size by double counting.
// How many members round - 1 has (those that close `round`): the initial size for round 1, else
// what the store says (0: not closed yet, unknown).
int previous_size(c10d::Store& store, std::uint64_t round, int initial_size) {
  if (round < 2) return initial_size;
  const std::string closed = key(round - 1, "closed");
  if (!store.check({closed})) return 0;
  return static_cast<int>(std::stoll(detail::bytes_to_text(store.get(closed))));
}

bool every_member_gone(c10d::Store& store, std::uint64_t round, int expected) {
  if (expected < 1 || counter(store, key(round, "left")) < expected) return false;
  return counter(store, key(round, "previous")) == 0 && !store.check({key(round, "closed")});
}

// Note [A round that does not close]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A member of the previous round closes a round within settle_timeout, so a wait much longer than
// that means the store's counts are not what this process expects (it arrived as a joiner, or the
// round's size is not the one it waits for) or the store stopped answering. Once per
// slow_round_report it says so, with the round's counts as the store holds them, so that a stall is
// explained by the log alone (hosts.live_during_recovery's survivors were once silent for 30 s: no
// report came, because they were blocked in a store read, See Note [Taking a slot]).
std::string describe_wait(c10d::Store& store, std::uint64_t round, bool previous_member, int expected,
                          std::size_t slot, Clock::time_point since) {
  const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - since);
  return str("membership: round ", round, " not closed after ", detail::seconds_of(waited), " s: this process has slot ",
             slot, " as ", previous_member ? "a member of the previous round" : "a joiner", "; the store holds ",
             counter(store, key(round, "count")), " arrival(s), ", counter(store, key(round, "previous")), " of ",
             expected, " previous member(s) arrived, ", counter(store, key(round, "left")), " marked gone",
             previous_member ? "" : " (only a member of the previous round closes it)");
}

// The pool's first index no closer has considered yet (See Note [Hot spares] in membership.h).
std::int64_t first_unclaimed(c10d::Store& store) {
  using detail::membership_keys::spare_key;
  return store.check({spare_key("next")}) ? std::stoll(detail::bytes_to_text(store.get(spare_key("next")))) : 0;
}

// See Note [Hot spares] in membership.h: up to `wanted` spares, in the order they came, each given
// a slot of `round` (called by the one member that holds the round's "closer" key).
int claim_spares(c10d::Store& store, std::uint64_t round, int wanted) {
  using detail::membership_keys::spare_key;
  if (wanted <= 0 || !store.check({spare_key("count")})) return 0;
  const std::int64_t count = counter(store, spare_key("count"));
  std::int64_t next = first_unclaimed(store);
  int claimed = 0;
  for (; next < count && claimed < wanted; ++next) {  // every index below the count has its id: Note [Taking a slot]
    const std::string index = std::to_string(next);
    if (store.check({spare_key(index + "/gone")}) || store.check({spare_key(index + "/released")})) continue;
    const auto slot = take_first_free(store, key(round, "count"), key(round, "slot/"),
                                      "j -1 " + detail::bytes_to_text(store.get(spare_key(index))));
    store.set(spare_key(index + "/claim"), detail::to_bytes(str(round, " ", slot)));
    ++claimed;
  }
  store.set(spare_key("next"), detail::to_bytes(std::to_string(next)));
  return claimed;
}

// Spares in the pool that no closer has considered yet (a dead one marked gone or a released one
// aside). See Note [Hot spares] in membership.h.
int unclaimed_spares(c10d::Store& store) {
  using detail::membership_keys::spare_key;
  if (!store.check({spare_key("count")})) return 0;
  const std::int64_t count = counter(store, spare_key("count"));
  int waiting = 0;
  for (std::int64_t i = first_unclaimed(store); i < count; ++i) {
    const std::string index = std::to_string(i);
    if (!store.check({spare_key(index + "/gone")}) && !store.check({spare_key(index + "/released")})) ++waiting;
  }
  return waiting;
}

bool has_unclaimed_spares(c10d::Store& store) {
  using detail::membership_keys::spare_key;
  return store.check({spare_key("count")}) && counter(store, spare_key("count")) > first_unclaimed(store);
}

}  // namespace

StoreMembership::StoreMembership(c10::intrusive_ptr<c10d::Store> store, std::string member_id,
                                 StoreMembershipOptions options)
    : store_(std::move(store)), id_(std::move(member_id)), options_(options) {
  if (!store_) throw InvalidArgument("StoreMembership: the store is null");
  if (id_.empty() || id_.find('\n') != std::string::npos) {
    throw InvalidArgument("StoreMembership: the member id must be one non-empty line");
  }
  if (options_.initial_size < 1) throw InvalidArgument("StoreMembershipOptions::initial_size must be at least 1");
  if (options_.settle_timeout.count() <= 0) throw InvalidArgument("StoreMembershipOptions::settle_timeout must be positive");
}

bool StoreMembership::change_pending(std::uint64_t current_round) {
  if (store_->check({key(current_round + 1, "count")})) return true;
  // A world below its first size with a spare waiting: a round that refills it (See Note [Hot spares]).
  return size_ < options_.initial_size && has_unclaimed_spares(*store_);
}

std::string StoreMembership::round_abandoned(std::uint64_t round) {
  // check() first: a watch that only reads creates no keys.
  const std::string left = key(round + 1, "left");
  const std::string moved_on = key(round + 1, "previous");
  if (store_->check({left}) && counter(*store_, left) > 0) {
    return str(counter(*store_, left), " member(s) of round ", round, " marked gone");
  }
  if (store_->check({moved_on}) && counter(*store_, moved_on) > 0) {
    return str(counter(*store_, moved_on), " member(s) of round ", round, " went on to round ", round + 1);
  }
  return "";
}

void StoreMembership::mark_left(std::uint64_t round) { store_->add(key(round + 1, "left"), 1); }

int StoreMembership::spares_waiting() { return unclaimed_spares(*store_); }

// A spare's wait in the pool (See Note [Hot spares] in membership.h): the round and slot a closer
// gave it, or nullopt once the job released it.
std::optional<std::pair<std::uint64_t, std::size_t>> StoreMembership::wait_as_spare() {
  using detail::membership_keys::spare_key;
  c10d::Store& store = *store_;
  // See Note [Taking a slot]: a closer that read the count just before used to pass over an index
  // with no id yet for good, and its spare waited unclaimed to the job's end.
  const std::string index = std::to_string(take_first_free(store, spare_key("count"), spare_key(""), id_));
  Logger(id_).info(str("membership: waiting in the spare pool (index ", index, ")"));
  const auto deadline = Clock::now() + options_.spare_timeout;
  while (true) {
    if (store.check({spare_key(index + "/claim")})) {
      std::istringstream claim(detail::bytes_to_text(store.get(spare_key(index + "/claim"))));
      std::uint64_t round = 0;
      std::size_t slot = 0;
      if (!(claim >> round >> slot)) throw CommunicationError(str("membership: malformed spare claim of '", id_, "'"));
      return std::make_pair(round, slot);
    }
    if (store.check({spare_key("done")})) {
      store.set(spare_key(index + "/released"), detail::to_bytes("1"));
      return std::nullopt;
    }
    if (Clock::now() >= deadline) {
      throw TimeoutError(str("membership: spare '", id_, "' waited ", detail::seconds_of(options_.spare_timeout),
                             " s in the spare pool without being claimed or released (StoreMembershipOptions::spare_timeout)"));
    }
    std::this_thread::sleep_for(kSparePoll);
  }
}

void StoreMembership::release_spares(milliseconds timeout) {
  using detail::membership_keys::spare_key;
  c10d::Store& store = *store_;
  store.set(spare_key("done"), detail::to_bytes("1"));
  if (!store.check({spare_key("count")})) return;
  // Until every spare is claimed, released or marked gone, so that no launcher's spare still waits
  // when the store's launcher ends; a spare that died unmarked is waited for until `timeout`.
  const auto deadline = Clock::now() + timeout;
  const std::int64_t count = counter(store, spare_key("count"));
  for (std::int64_t i = 0; i < count; ++i) {
    const std::string index = std::to_string(i);
    while (!store.check({spare_key(index + "/claim")}) && !store.check({spare_key(index + "/released")}) &&
           !store.check({spare_key(index + "/gone")}) && Clock::now() < deadline) {
      std::this_thread::sleep_for(kSparePoll);
    }
  }
}

Membership StoreMembership::next(std::uint64_t last_round, milliseconds timeout) {
  c10d::Store& store = *store_;
  std::uint64_t round = std::max(last_round, round_) + 1;
  std::optional<std::size_t> claimed_slot;  // a spare's slot, written by the closer that claimed it
  if (round_ == 0 && options_.spare) {
    const auto claim = wait_as_spare();
    if (!claim) {
      Membership released;
      released.released = true;
      return released;
    }
    round = claim->first;
    claimed_slot = claim->second;
  }
  const auto deadline = Clock::now() + timeout;
  if (round_ == 0 && options_.joining && !claimed_slot) {
    const std::string last = detail::membership_keys::last_round_key();
    if (store.check({last})) round = std::max<std::uint64_t>(round, std::stoull(detail::bytes_to_text(store.get(last))) + 1);
  }
  while (true) {
    // A member of the previous round (the initial members, for round 1) counts towards closing it.
    const bool previous_member = claimed_slot ? false : round == 1 ? !options_.joining : round_ == round - 1;
    const int previous_rank = round == 1 ? options_.initial_rank : rank_;
    const int expected = round == 1 ? options_.initial_size : size_;
    std::size_t slot = 0;
    if (claimed_slot) {
      slot = *std::exchange(claimed_slot, std::nullopt);
    } else {
      slot = static_cast<std::size_t>(take_first_free(store, key(round, "count"), key(round, "slot/"),
                                                      str(previous_member ? "m " : "j ", previous_member ? previous_rank : -1, " ", id_)));
      if (previous_member) store.add(key(round, "previous"), 1);
    }
    const auto arrived_at = Clock::now();
    const auto settle = arrived_at + options_.settle_timeout;
    const milliseconds report_every = std::max(2 * options_.settle_timeout, kSlowRoundReport);
    auto next_report = arrived_at + report_every;
    const std::string closed_key = key(round, "closed");
    std::string closed_by;
    std::optional<Clock::time_point> lost_closer_at;  // another holds "closer": close without spares after this
    while (!store.check({closed_key})) {
      if (Clock::now() >= next_report) {  // See Note [A round that does not close]
        Logger(id_).warn(describe_wait(store, round, previous_member, expected, slot, arrived_at));
        next_report += report_every;
      }
      if (previous_member) {
        const auto arrived = counter(store, key(round, "previous"));
        const auto left = counter(store, key(round, "left"));
        const bool settled = Clock::now() >= settle;
        if (arrived + left >= expected || settled) {
          // See Note [Hot spares] in membership.h: one closer fills the round back to its size.
          int filled = 0;
          bool close = true;
          if (has_unclaimed_spares(store)) {
            const auto me = detail::to_bytes(id_);
            if (store.compareSet(key(round, "closer"), std::vector<uint8_t>(), me) == me) {
              const int fill_to = std::max(expected, options_.initial_size);
              filled = claim_spares(store, round, fill_to - static_cast<int>(counter(store, key(round, "count"))));
            } else {
              if (!lost_closer_at) lost_closer_at = Clock::now() + options_.settle_timeout;
              close = Clock::now() >= *lost_closer_at;
            }
          }
          if (close) {
            const auto slots = detail::to_bytes(std::to_string(counter(store, key(round, "count"))));
            if (store.compareSet(closed_key, std::vector<uint8_t>(), slots) == slots) {
              closed_by = describe_close(round, expected, arrived, left, settled && arrived + left < expected,
                                         options_.settle_timeout);
              if (filled > 0) closed_by += str("; ", filled, " spare(s) took the place of the missing");
            }
            break;
          }
        }
      }
      if (!previous_member && every_member_gone(store, round, previous_size(store, round, options_.initial_size))) {
        throw CommunicationError(str("membership: every member of round ", round - 1,
                                     " is gone: the training state is lost; restart the job from its checkpoint"));
      }
      if (Clock::now() >= deadline) {
        throw TimeoutError(str("membership: member '", id_, "' waited ", detail::seconds_of(timeout), " s for round ", round,
                               " to close (", counter(store, key(round, "count")), " arrived",
                               previous_member ? "" : "; a joiner waits until the members reach a step boundary",
                               ")"));
      }
      std::this_thread::sleep_for(kPoll);
    }
    const auto size = static_cast<std::size_t>(std::stoull(detail::bytes_to_text(store.get(closed_key))));
    if (slot >= size) {  // came too late for this round: the next one
      ++round;
      continue;
    }
    std::vector<Arrival> arrivals;
    for (std::size_t n = 0; n < size; ++n) {
      arrivals.push_back(parse_arrival(detail::bytes_to_text(store.get(key(round, str("slot/", n)))), n));
    }
    // Note [Membership seam]: the previous round's members first, in their rank order.
    std::stable_sort(arrivals.begin(), arrivals.end(), [&](const Arrival& a, const Arrival& b) {
      if (a.member != b.member) return a.member;
      if (a.previous_rank != b.previous_rank) return a.previous_rank < b.previous_rank;
      return a.id < b.id;
    });
    Membership membership;
    membership.closed_by = closed_by;
    membership.round = round;
    membership.world_size = static_cast<int>(size);
    membership.store_prefix = str("ddp/ft/round/", round, "/");
    for (std::size_t r = 0; r < arrivals.size(); ++r) {
      if (arrivals[r].slot == slot) membership.rank = static_cast<int>(r);
      if (!arrivals[r].member) {
        membership.joiners.push_back(static_cast<int>(r));
      }
    }
    store.set(detail::membership_keys::last_round_key(), detail::to_bytes(std::to_string(round)));
    round_ = round;
    rank_ = membership.rank;
    size_ = membership.world_size;
    return membership;
  }
}

}  // namespace ddp
