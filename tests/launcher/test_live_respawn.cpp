// LiveRespawnPolicy: which restart count a dead live worker's new process gets, and when the node's
// --max_restarts are used up (See Note [Restarting one live worker] in launcher/agent/live_respawn.h).
#include <catch2/catch.hpp>

#include "launcher/agent/live_respawn.h"

using ddp::launcher::agent::LiveRespawnPolicy;

TEST_CASE("a dead live worker gets its own restart count, bounded by the node's restarts", "[live_respawn]") {
  LiveRespawnPolicy policy(3, 3, 0);  // a node of the first round, --max_restarts 3
  CHECK(policy.in_first_round(1));
  CHECK(policy.next(1) == 1);  // a joiner (> 0), member id .../local1/attempt1
  CHECK_FALSE(policy.in_first_round(1));
  CHECK(policy.in_first_round(0));  // its node-mates are untouched
  CHECK(policy.next(1) == 2);
  CHECK(policy.next(0) == 1);  // local rank 0's own count
  CHECK(policy.restarts_used() == 3);
  CHECK_FALSE(policy.next(2).has_value());  // the node's restarts are used up, whichever dies
  CHECK(policy.in_first_round(2));
}

TEST_CASE("a live node that joined in a later round restarts its workers past that round", "[live_respawn]") {
  LiveRespawnPolicy policy(2, 1, 4);
  CHECK_FALSE(policy.in_first_round(0));
  CHECK(policy.next(0) == 5);
  CHECK_FALSE(policy.next(1).has_value());
  LiveRespawnPolicy none(2, 0, 0);
  CHECK_FALSE(none.next(0).has_value());
}
