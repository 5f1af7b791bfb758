#pragma once
// The store keys of StoreMembership's rounds (See Note [Store membership rounds] in
// ddp/membership.h), header-only so that ddp_launch's rendezvous plugin (LibTorch's store, not the
// ddp library) marks a dead worker gone with the same keys: See Note [Live recovery with ddp_launch].
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <string>

#include "ddp/base/store_values.h"

namespace ddp::membership_keys {

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

// How many arrivals of `round` (its members once it closed; `member_arrivals`: only those of the
// previous round, as they count towards closing it) have a member id under `node_key`.
inline int arrivals_under(c10d::Store& store, std::uint64_t round, const std::string& node_key, bool member_arrivals) {
  const std::string closed = round_key(round, "closed");
  const std::string count = round_key(round, "count");
  std::uint64_t size = 0;
  if (store.check({closed})) {
    size = std::stoull(bytes_to_text(store.get(closed)));
  } else if (store.check({count})) {
    size = static_cast<std::uint64_t>(store.add(count, 0));
  }
  const std::string prefix = node_key + "/";
  int found = 0;
  for (std::uint64_t slot = 0; slot < size; ++slot) {
    // "<m|j> <previous rank> <member id>" (See Note [Store membership rounds]); a slot taken but
    // not written yet is skipped.
    const std::string key = round_key(round, "slot/" + std::to_string(slot));
    if (!store.check({key})) continue;
    const std::string arrival = bytes_to_text(store.get(key));
    const auto first = arrival.find(' ');
    const auto second = first == std::string::npos ? first : arrival.find(' ', first + 1);
    if (member_arrivals && arrival.compare(0, 2, "m ") != 0) continue;
    if (second != std::string::npos && arrival.compare(second + 1, prefix.size(), prefix) == 0) ++found;
  }
  return found;
}

// Note [Marking a lost node gone]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A whole node's workers are gone (its host died, or its launcher restarts them): add their number
// to "left" of the round after the last closed one, so that the survivors close it at once. Two
// launchers may say it of the same node (its own, restarting its dead workers, and the one that
// serves the store, whose liveness channel lost the node's launcher), and "left" is a count: each
// round has a "gone/<node_key>" counter and only the first to add to it adds to "left" (exactly
// once per node and round). How many: the node's members of the last closed round (0 when that
// round closed without them already, e.g. after the settle timeout: nothing to mark), or
// `first_round_workers` before any round closed (the node's share of the launcher's first round),
// less those of them that arrived in the open round before they died (they count there already).
// A round that closes while this runs, with the node's workers in it, is marked in the next
// round too (the loop).
struct NodeGoneMark {
  int marked = 0;              // workers added to "left", over every round marked
  bool already = false;        // someone else marked the node in that round first
  std::uint64_t round = 0;     // the last round marked (the one it counts towards)
};
inline NodeGoneMark mark_node_gone(c10d::Store& store, const std::string& node_key, int first_round_workers) {
  NodeGoneMark mark;
  for (int pass = 0; pass < 16; ++pass) {  // one pass per round that closed meanwhile: bounded
    const std::uint64_t last = last_closed_round(store);
    // Less those that arrived in the open round before they died: they count there already.
    const int count = (last == 0 ? first_round_workers : arrivals_under(store, last, node_key, false)) -
                      arrivals_under(store, last + 1, node_key, true);
    if (count <= 0) break;
    if (store.add(round_key(last + 1, "gone/" + node_key), 1) == 1) {
      store.add(round_key(last + 1, "left"), count);
      mark.marked += count;
      mark.round = last + 1;
    } else {
      mark.already = true;
    }
    if (!store.check({round_key(last + 1, "closed")})) break;
  }
  return mark;
}

}  // namespace ddp::membership_keys
