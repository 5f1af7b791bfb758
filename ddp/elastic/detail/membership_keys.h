#pragma once
// The store keys of StoreMembership's rounds (See Note [Store membership rounds] in
// ddp/elastic/membership.h), header-only so that ddp_launch's rendezvous plugin (LibTorch's store, not the
// ddp library) marks a dead worker gone with the same keys: See Note [Live recovery with ddp_launch].
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/base/detail/store_values.h"

namespace ddp::detail::membership_keys {

inline std::string round_key(std::uint64_t round, const std::string& name) {
  return "ddp/membership/" + std::to_string(round) + "/" + name;
}
// The last closed round (for joiners, and for marking members of it gone).
inline const char* last_round_key() { return "ddp/membership/last"; }

// Says that `count` members of the last closed round are gone (StoreMembership::mark_left for a
// process that cannot say which round it is in); returns false when no round has closed yet.
inline bool mark_last_round_members_gone(c10d::Store& store, int count) {
  if (!store.check({last_round_key()})) return false;
  const std::uint64_t last = std::stoull(bytes_to_text(store.get(last_round_key())));
  store.add(round_key(last + 1, "left"), count);
  return true;
}

// The last round that has closed (0: none yet). "last" is written by each member after it read
// its round, so a round that has just closed may be past it.
inline std::uint64_t last_closed_round(c10d::Store& store) {
  std::uint64_t round = 0;
  if (store.check({last_round_key()})) round = std::stoull(bytes_to_text(store.get(last_round_key())));
  while (store.check({round_key(round + 1, "closed")})) ++round;
  return round;
}

// The member ids of the arrivals of `round` (its members once it closed; `member_arrivals`: only
// those of the previous round, as they count towards closing it) under `scope` (a node key, or
// one worker's key: see worker_key_of).
inline std::vector<std::string> arrival_ids_under(c10d::Store& store, std::uint64_t round, const std::string& scope,
                                                  bool member_arrivals) {
  const std::string closed = round_key(round, "closed");
  const std::string count = round_key(round, "count");
  std::uint64_t size = 0;
  if (store.check({closed})) {
    size = std::stoull(bytes_to_text(store.get(closed)));
  } else if (store.check({count})) {
    size = static_cast<std::uint64_t>(store.add(count, 0));
  }
  const std::string prefix = scope + "/";
  std::vector<std::string> ids;
  for (std::uint64_t slot = 0; slot < size; ++slot) {
    // "<m|j> <previous rank> <member id>" (See Note [Store membership rounds]): every slot below
    // the count holds its arrival (Note [Taking a slot] in ddp/elastic/membership.cpp).
    const std::string arrival = bytes_to_text(store.get(round_key(round, "slot/" + std::to_string(slot))));
    const auto first = arrival.find(' ');
    const auto second = first == std::string::npos ? first : arrival.find(' ', first + 1);
    if (member_arrivals && arrival.compare(0, 2, "m ") != 0) continue;
    if (second != std::string::npos && arrival.compare(second + 1, prefix.size(), prefix) == 0) {
      ids.push_back(arrival.substr(second + 1));
    }
  }
  return ids;
}

// The spare pool's keys (See Note [Hot spares] in ddp/elastic/membership.h).
inline std::string spare_key(const std::string& name) { return "ddp/membership/spares/" + name; }

// Marks gone the spares under `scope` (as mark_node_gone's) that no round has claimed, so that no
// closer claims a dead one; returns how many it marked.
inline int mark_spares_gone(c10d::Store& store, const std::string& scope) {
  if (!store.check({spare_key("count")})) return 0;
  const std::int64_t count = store.add(spare_key("count"), 0);
  const std::string prefix = scope + "/";
  int marked = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::string index = std::to_string(i);
    const std::string id = bytes_to_text(store.get(spare_key(index)));
    if (id.compare(0, prefix.size(), prefix) != 0 || store.check({spare_key(index + "/claim")})) continue;
    if (store.add(spare_key(index + "/gone"), 1) == 1) ++marked;
  }
  return marked;
}

// A worker's key: its member id "<node key>/local<L>/attempt<K>" less the attempt. One local rank
// is a member of a round in one attempt at most (a restarted one joins as a joiner), so it names
// the member of a round that a mark claims.
inline std::string worker_key_of(const std::string& member_id) {
  const auto at = member_id.rfind("/attempt");
  return at == std::string::npos ? member_id : member_id.substr(0, at);
}

// Note [Marking a lost node gone]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Workers are gone (a node's host died, or its launcher restarts a dead worker): add their number
// to "left" of the round after the last closed one, so that the survivors close it at once. Two
// launchers may say it of the same worker (its own, restarting it, and the one that serves the
// store, whose liveness channel lost the node's launcher afterwards), and "left" is a count: each
// round has a "gone/<worker key>" counter per member (see worker_key_of) and only the first to add
// to it adds that member to "left" (exactly once per member and round, whether it was marked
// alone, with its whole node, or both, in any order or at the same time). `scope` is a node key
// ("node<N>", "node<N>.r<R>": every worker of the node) or one worker's key ("<node key>/local<L>":
// that worker alone, See Note [Restarting one live worker] in launcher/agent/live_respawn.cpp). Who: the
// scope's members of the last closed round (none when that round closed without them already,
// e.g. after the settle timeout: nothing to mark), or before any round closed its share of the
// launcher's first round (`first_round_workers` local ranks of a node; for one worker, 1 when it was
// in the first round, 0 for a later attempt), less those that arrived in the open round before
// they died (they count there already). A round that closes while this runs, with the scope's
// workers in it, is marked in the next round too (the loop).
struct NodeGoneMark {
  int marked = 0;              // workers added to "left", over every round marked
  int spares = 0;              // unclaimed spares marked gone (mark_spares_gone)
  bool already = false;        // someone else marked (some of) them in that round first
  std::uint64_t round = 0;     // the last round marked (the one it counts towards)
};
inline NodeGoneMark mark_node_gone(c10d::Store& store, const std::string& scope, int first_round_workers) {
  NodeGoneMark mark;
  mark.spares = mark_spares_gone(store, scope);
  const bool one_worker = scope.find('/') != std::string::npos;
  for (int pass = 0; pass < 16; ++pass) {  // one pass per round that closed meanwhile: bounded
    const std::uint64_t last = last_closed_round(store);
    std::vector<std::string> gone;
    if (last == 0 && one_worker) {
      if (first_round_workers > 0) gone.push_back(scope);
    } else if (last == 0) {
      for (int lr = 0; lr < first_round_workers; ++lr) gone.push_back(scope + "/local" + std::to_string(lr));
    } else {
      for (const std::string& id : arrival_ids_under(store, last, scope, false)) gone.push_back(worker_key_of(id));
    }
    for (const std::string& id : arrival_ids_under(store, last + 1, scope, true)) {
      gone.erase(std::remove(gone.begin(), gone.end(), worker_key_of(id)), gone.end());
    }
    if (gone.empty()) break;
    int claimed = 0;
    for (const std::string& worker : gone) {
      if (store.add(round_key(last + 1, "gone/" + worker), 1) == 1) {
        ++claimed;
      } else {
        mark.already = true;
      }
    }
    if (claimed > 0) {
      store.add(round_key(last + 1, "left"), claimed);
      mark.marked += claimed;
      mark.round = last + 1;
    }
    if (!store.check({round_key(last + 1, "closed")})) break;
  }
  return mark;
}

}  // namespace ddp::detail::membership_keys
