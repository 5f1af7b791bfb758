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

}  // namespace ddp::membership_keys
