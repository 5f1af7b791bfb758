#include "ddp/elastic/membership.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include "ddp/base/error.h"
#include "ddp/base/detail/store_values.h"
#include "ddp/base/str.h"
#include "ddp/elastic/detail/membership_keys.h"

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
  return store_->check({key(current_round + 1, "count")});
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

Membership StoreMembership::next(std::uint64_t last_round, milliseconds timeout) {
  c10d::Store& store = *store_;
  const auto deadline = Clock::now() + timeout;
  std::uint64_t round = std::max(last_round, round_) + 1;
  if (round_ == 0 && options_.joining) {
    const std::string last = detail::membership_keys::last_round_key();
    if (store.check({last})) round = std::max<std::uint64_t>(round, std::stoull(detail::bytes_to_text(store.get(last))) + 1);
  }
  while (true) {
    // A member of the previous round (the initial members, for round 1) counts towards closing it.
    const bool previous_member = round == 1 ? !options_.joining : round_ == round - 1;
    const int previous_rank = round == 1 ? options_.initial_rank : rank_;
    const int expected = round == 1 ? options_.initial_size : size_;
    const auto slot = static_cast<std::size_t>(store.add(key(round, "count"), 1) - 1);
    store.set(key(round, str("slot/", slot)),
              detail::to_bytes(str(previous_member ? "m " : "j ", previous_member ? previous_rank : -1, " ", id_)));
    if (previous_member) store.add(key(round, "previous"), 1);
    const auto settle = Clock::now() + options_.settle_timeout;
    const std::string closed_key = key(round, "closed");
    std::string closed_by;
    while (!store.check({closed_key})) {
      if (previous_member) {
        const auto arrived = counter(store, key(round, "previous"));
        const auto left = counter(store, key(round, "left"));
        const bool settled = Clock::now() >= settle;
        if (arrived + left >= expected || settled) {
          const auto slots = detail::to_bytes(std::to_string(counter(store, key(round, "count"))));
          if (store.compareSet(closed_key, std::vector<uint8_t>(), slots) == slots) {
            closed_by = describe_close(round, expected, arrived, left, settled && arrived + left < expected,
                                       options_.settle_timeout);
          }
          break;
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
