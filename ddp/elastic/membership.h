#pragma once
// Who trains in each round of a fault-tolerant job: the seam between ddp::FaultTolerant (ddp/
// fault_tolerant.h) and whoever decides the membership (the launcher's rendezvous rounds, or
// StoreMembership below over a c10d store). See Note [Live recovery] in ddp/elastic/fault_tolerant.h.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>
#include <string>
#include <vector>

namespace ddp {

// One round's membership, as this process sees it.
struct Membership {
  int rank = 0;
  int world_size = 1;
  // Rounds count up from 1; every member of a round gets the same round, world size and prefix.
  std::uint64_t round = 0;
  // The prefix of this round's process group in the job's store (a fresh one per round, so that a
  // new group never reads the keys of an old one).
  std::string store_prefix;
  // Ranks (of this round) that were not in the previous round: they hold no training state yet.
  std::vector<int> joiners;
  // Set only in the process that closed the round: why it closed (every member of the previous
  // round accounted for, or the settle timeout), for the log.
  std::string closed_by;
  // Set for a spare (StoreMembershipOptions::spare) that the job released unclaimed at its end: no
  // round, no rank (See Note [Hot spares]).
  bool released = false;
};

// Note [Membership seam]
// ~~~~~~~~~~~~~~~~~~~~~~
// FaultTolerant asks next() after a lost peer (or when change_pending() says that a process waits to
// join) and builds the round's group with ddp::new_process_group over the job's store under
// store_prefix. The contract an implementation keeps:
//   - every member that calls next(last_round) gets the same round (> last_round), world size,
//     prefix and joiners, and a distinct rank in 0..world_size-1;
//   - the members of the previous round come first, in their previous rank order (so rank 0 of a
//     round that follows another always holds the training state), the joiners after them;
//   - next() returns within `timeout` or throws ddp::TimeoutError saying what it waited for.
// StoreMembership is the implementation over a c10d store used by the in-process tests and by
// programs that run without ddp_launch; ddp_launch --recovery live will provide another, fed by its
// rendezvous rounds (the agents know which processes died and which joined).
class MembershipSource {
 public:
  virtual ~MembershipSource() = default;
  // The membership of the next round after `last_round` (0: the first one).
  virtual Membership next(std::uint64_t last_round, std::chrono::milliseconds timeout) = 0;
  // Whether a round after `current_round` has been opened (a process waits to join): cheap, asked
  // by rank 0 once per step.
  virtual bool change_pending(std::uint64_t current_round) = 0;
  // Why `round`'s group can complete no more collectives, or "" (See Note [Watching the round]
  // in ddp/elastic/fault_tolerant.cpp): a member of it is known to be gone or has gone on to a later round.
  // Cheap, thread-safe: FaultTolerant asks it from its watch thread while next() may run. The
  // default knows nothing.
  virtual std::string round_abandoned(std::uint64_t /*round*/) { return ""; }
  // The training is over (every member got to its end): the spares still waiting leave, within
  // `timeout` (See Note [Hot spares]). The default has no spares.
  virtual void release_spares(std::chrono::milliseconds /*timeout*/) {}
};

struct StoreMembershipOptions {
  // Members of the first round (the job's initial world size), and this process's rank in it (-1:
  // the members of the first round are ordered by member id).
  int initial_size = 1;
  int initial_rank = -1;
  // false for a process that joins a running job (a replacement): it announces itself in the round
  // after the last closed one and waits, as a joiner, until the members open that round.
  bool joining = false;
  // How long a member of the previous round waits for the other previous members (or their "left"
  // mark) before it closes the round with whoever arrived: the detection bound of a peer that died
  // without anyone marking it (a partition, a killed host).
  std::chrono::milliseconds settle_timeout = std::chrono::seconds(5);
  // A hot spare: next() waits in the job's spare pool, not in a round, until a closing member
  // claims it for a lost member's place (it then comes into that round as a joiner), or the job
  // releases it (Membership::released), or spare_timeout passes. See Note [Hot spares].
  bool spare = false;
  std::chrono::milliseconds spare_timeout = std::chrono::hours(24);
};

// Note [Hot spares]
// ~~~~~~~~~~~~~~~~~
// A spare is a process that has built its model and data and waits, not training, so that a lost
// member's place is taken at the next step and the world size stays what it was (torchft and
// nvidia-resiliency-ext start a replacement only after the loss; here it is already up). Keys under
// "ddp/membership/spares/": "<i>" (its member id) and "count", taken as a round's slots are (See
// Note [Taking a slot] in membership.cpp),
// "<i>/claim" ("<round> <slot>": the round it was claimed into and its slot there), "<i>/gone"
// (marked by a launcher: a dead spare is never claimed), "<i>/released", "next" (the first index
// not considered yet: spares are claimed in the order they came) and "done" (the job's end).
// The member that closes a round fills it back to the previous round's size, or to the first
// round's if that is more (a world that shrank while the pool was empty grows back: change_pending()
// says so once a spare waits, e.g. a dead worker that its launcher restarted as a spare): it takes the round's
// "closer" key first (compareSet: one closer fills, so no two claim spares for the same place),
// writes each claimed spare's arrival ("j -1 <id>") into a slot of the round and its claim, then
// closes the round with the slots counted. A claimed spare reads its slot from the claim and is a
// joiner of that round: FaultTolerant hands it the state (the model, the optimizer, the sampler's
// counters), so with the world size unchanged the sampler's re-shard of the epoch's rest loses no
// sample and trains none twice. A claimed spare that died before the group was built fails that
// round like any member lost during a recovery; the next round closes without it (its launcher
// marks it, or the settle timeout) and claims the next spare. If the closer dies holding the
// "closer" key, another member closes the round without spares after one more settle timeout; a
// spare whose slot is then past the round's end joins the next round as an ordinary joiner.
// release_spares() (FaultTolerant::finish) says "done"; each waiting spare marks itself released and
// leaves (next() returns Membership::released), so that every launcher sees its processes end.

// Note [Store membership rounds]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Keys under "ddp/membership/<round>/": "slot/<n>" (the arrival's "<m or j> <previous rank> <member
// id>", m: a member of the previous round) and "count" (the slots taken: every slot below it holds
// its arrival, See Note [Taking a slot] in membership.cpp), "previous" (how many members of the
// previous round arrived), "left" (how many of them are known to be gone: mark_left), "closed" (the
// number of slots in the round, written once by compareSet: the first closer wins, everyone reads
// the same value). A member of the previous round closes the round once previous + left reaches the
// previous round's size, or once settle_timeout has passed; joiners never close a round. A process
// whose slot is past "closed" came too late and announces itself in the following round.
// "ddp/membership/last" holds the last closed round, for joiners.
class StoreMembership : public MembershipSource {
 public:
  // `member_id`: unique and stable for the process's life (e.g. "host-3/worker-1").
  StoreMembership(c10::intrusive_ptr<c10d::Store> store, std::string member_id, StoreMembershipOptions options = {});
  Membership next(std::uint64_t last_round, std::chrono::milliseconds timeout) override;
  bool change_pending(std::uint64_t current_round) override;
  // From round + 1's "left" and "previous" counts (store reads only).
  std::string round_abandoned(std::uint64_t round) override;
  // Says that a member of `round` is gone and will not come to the next one (what a launcher's agent
  // says when a process of its host died); the next round then closes without waiting for it.
  void mark_left(std::uint64_t round);
  void release_spares(std::chrono::milliseconds timeout) override;
  // Spares waiting in the job's pool that a closer may still claim (store reads only): a program
  // that relies on its spares can wait for them (See Note [Hot spares]).
  int spares_waiting();

 private:
  std::optional<std::pair<std::uint64_t, std::size_t>> wait_as_spare();

  c10::intrusive_ptr<c10d::Store> store_;
  std::string id_;
  StoreMembershipOptions options_;
  // This process's place in the last round it was a member of (round 0: none yet).
  std::uint64_t round_ = 0;
  int rank_ = -1;
  int size_ = 0;
};

}  // namespace ddp
