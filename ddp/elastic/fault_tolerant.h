#pragma once
// Live recovery of a data-parallel job: the survivors of a lost peer drop the step in flight, rebuild
// their process group in place and go on from their own state; a process that joins receives the
// state from a survivor. See Note [Live recovery].
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/algorithms/comm.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/elastic/membership.h"
#include "ddp/distributed/process_group.h"

namespace ddp {

namespace amp {
class GradScaler;  // ddp/amp/grad_scaler.h
}
class DiLoCo;  // ddp/algorithms/diloco.h

// Note [Live recovery]
// ~~~~~~~~~~~~~~~~~~~~
// A collective whose peer is gone fails with ddp::PeerLostError (the connection was closed or reset,
// or the group was aborted) or, for a peer that went silent, ddp::TimeoutError after the group's
// timeout: the detection bound. FaultTolerant::step(compute, apply) runs one training step:
//   1. compute() (forward, backward: DDP's bucket all-reduces);
//   2. the step agreement: an all-reduce of [step, -step, change pending] with MAX. It is the last
//      collective of the step, so a rank applies step s only once every rank has finished its
//      backward of step s. It also checks that all ranks are at the same step, and carries rank 0's
//      "a process waits to join" (MembershipSource::change_pending) to everybody;
//   3. apply() (optimizer.step(), scaler.update(): local, no collective) and the step counter.
// On PeerLostError or TimeoutError from 1 or 2 the step is dropped on this rank (a watch thread also
// aborts the group once the membership says that the round is abandoned: See Note [Watching the
// round] in fault_tolerant.cpp), and recovery runs:
//   a. the backward in flight is abandoned and the old group aborted and destroyed (Gloo closes
//      its pairs, so that peers still blocked in it fail at once instead of after their timeout);
//   b. the next round's membership comes from the MembershipSource (the seam the launcher fills;
//      See Note [Membership seam] in ddp/elastic/membership.h);
//   c. a new ProcessGroup over the same store under the round's prefix (new_process_group);
//   d. DDP follows it (reset_process_group: rank 0's bucket layout), the GradScaler's group too;
//   e. the state agreement: every rank says its step count and whether it holds no state (a joiner,
//      or before start() ended). The source is the lowest rank with the highest step among those
//      holding state. A rank that may have applied a step the others dropped (its agreement
//      all-reduce completed while theirs failed) is therefore ahead, becomes the source, and the
//      others receive its state: no rank ends with a step the others do not have. Ranks without
//      state or behind receive it: the source's parameters, buffers, optimizer state, scaler state,
//      communication-hook state without its per-rank entries, step and tracked counters, in one
//      byte string with its XXH3-64 checksum, sent in chunks by every rank that holds the same state
//      to the ranks that need it only (See Note [Healing at link speed] in fault_tolerant.cpp);
//      the receiver checks each chunk and the whole, loads them,
//      encodes its own state again and checks that this gives the source's checksum (a mismatch is
//      a ddp::MismatchError naming both sums). No file is read.
//   f. on_new_group (re-shard the sampler at the new rank and world size there).
// A failure during b-f (a second peer lost while the group is rebuilt) starts the recovery again
// with the next round, up to max_recovery_attempts; a round below min_world_size ends it with a
// ddp::Error saying so. The same path starts the job (start(): every rank but rank 0 receives rank
// 0's state, which replaces DDP's broadcast at construction) and admits joiners (a planned change
// after a step that every rank applied).
//
// Communication hooks: the state's per-rank entries (names starting with "error.": PowerSGD's error
// feedback) are not sent; a receiving rank's hook is loaded with the rest (PowerSGD: iteration,
// random state, P and Q, which are the same on every rank) and so starts its error feedback from
// zero, while the survivors that receive nothing keep theirs: a residual is the rank's own
// compression error and stays valid at another world size. NCCL: ProcessGroup::abort() aborts an
// NCCL group's communicators (See Note [Aborting a group] in ddp/distributed/process_group.cpp), but the rounds'
// groups are Gloo (new_process_group builds no NCCL group). Not covered yet: rounds over NCCL,
// ZeroRedundancyOptimizer (a lost rank's optimizer shard exists nowhere else) and an optimizer that
// communicates in apply().
struct FaultTolerantOptions {
  // A round with fewer members ends recovery with a ddp::Error.
  int min_world_size = 1;
  // Rounds tried in one recovery before it gives up.
  int max_recovery_attempts = 5;
  // Bound of waiting for a round's membership (MembershipSource::next).
  std::chrono::milliseconds membership_timeout = std::chrono::minutes(5);
  // Each round's group; its timeout bounds every collective: the detection bound of a silent peer
  // that nobody reports (the watch below ends the wait sooner when someone does).
  StoreGroupOptions group;
  // How often the watch asks the membership whether the current round is abandoned
  // (MembershipSource::round_abandoned; See Note [Watching the round] in fault_tolerant.cpp). 0: no
  // watch (a rank then learns it only from its collectives: a closed connection, or their timeout).
  std::chrono::milliseconds watch_interval{200};
  // Called once a round's group is built, before the state agreement (e.g. to log the membership).
  std::function<void(ProcessGroup&, const Membership&)> on_group_built;
  // Called once the state is in sync on the new group: re-shard the sampler here.
  std::function<void(ProcessGroup&, const Membership&)> on_new_group;
  // How the ranks that need the state receive it (See Note [Healing at link speed] in
  // fault_tolerant.cpp): kFromPeers, in chunks of heal_chunk_bytes from every rank that holds it,
  // sent only to the ranks that need it; kBroadcast, one broadcast from the source to every rank
  // (what it was before; kept to compare).
  enum class Healing { kFromPeers, kBroadcast };
  Healing healing = Healing::kFromPeers;
  std::int64_t heal_chunk_bytes = std::int64_t{8} << 20;
};

// Usage (every rank, the joiners too):
//   ddp::FaultTolerant ft(store, std::make_shared<ddp::StoreMembership>(store, id, membership_options));
//   ddp::DistributedDataParallel model(net, ft.group());   // a local group: no peer needed yet
//   ft.track(model);
//   ft.track(optimizer);
//   if (!ft.start()) return;  // a spare that the job did not need
//   while (ft.steps() < total) {
//     ft.step([&] { optimizer.zero_grad(); loss_of(model(batch_for(ft.steps()))).backward(); },
//             [&] { optimizer.step(); });
//   }
//   ft.finish();
class FaultTolerant {
 public:
  FaultTolerant(c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<MembershipSource> membership,
                FaultTolerantOptions options = {});
  ~FaultTolerant();
  FaultTolerant(const FaultTolerant&) = delete;
  FaultTolerant& operator=(const FaultTolerant&) = delete;

  // The current group: before start(), a group of this process alone.
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }
  const Membership& membership() const { return membership_; }

  // What follows the group and travels to joiners. Track before start().
  template <class M>
  void track(DistributedDataParallel<M>& model) {
    TrackedModel tracked;
    tracked.reset = [&model](std::shared_ptr<ProcessGroup> group) { model.reset_process_group(std::move(group)); };
    tracked.abandon = [&model] { model.abandon_iteration(); };
    tracked.continue_after = [&model](std::int64_t steps) { model.continue_after_steps(steps); };
    tracked.count_wait = [&model](std::chrono::steady_clock::duration waited) { model.count_wait(waited); };
    tracked.tensors = [&model] {
      std::vector<std::pair<std::string, torch::Tensor>> out;
      for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
      for (const auto& item : model.named_buffers()) out.emplace_back(item.key(), item.value());
      return out;
    };
    tracked.hook = [&model]() -> CommHookInterface& { return model.comm_hook(); };
    track_model(std::move(tracked));
  }
  void track(torch::optim::Optimizer& optimizer);
  void track(amp::GradScaler& scaler);
  // Its outer state travels to joiners and its exchanges follow the group; call its synchronize()
  // in compute() and inner_step() in apply() (See Note [DiLoCo under FaultTolerant] in
  // ddp/algorithms/diloco.cpp).
  void track(DiLoCo& diloco);
  // A counter of the loop (the epoch, samples consumed in it, ...) that joiners receive.
  void track(const std::string& name, std::int64_t& counter);

  // Joins the first round this process can (a collective of that round; See Note [Live recovery]).
  // false only for a spare that the job released unclaimed at its end (See Note [Hot spares] in
  // ddp/elastic/membership.h): it trained nothing and has nothing more to do.
  bool start();
  // The training is over on this rank (every rank calls it after its last step): the job's spares
  // still waiting leave, waited for up to `timeout`. Without spares it does nothing.
  void finish(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // One step (See Note [Live recovery]): true when it was applied, false when it was dropped and the
  // group rebuilt (run the same step again). Throws what compute() or apply() throw otherwise, and
  // ddp::Error when recovery is impossible.
  bool step(const std::function<void()>& compute, const std::function<void()>& apply);
  // Recovery by hand, for loops that catch PeerLostError themselves (the step in flight is dropped).
  void recover();

  // Steps applied (on every rank the same, after start()).
  std::int64_t steps() const { return step_; }
  // Recoveries this process went through (failures and joins).
  int regroups() const { return regroups_; }
  // Why the last one ran ("start", "a peer was lost at step 7: ...", "a process waits to join").
  const std::string& last_regroup_reason() const { return last_regroup_reason_; }
  // What this rank last received as a joiner or a rank behind (See Note [Healing at link speed]
  // in fault_tolerant.cpp); bytes 0 when it never received the state.
  struct Healing {
    std::int64_t bytes = 0;
    int senders = 0;          // ranks that sent chunks of it
    double transfer_s = 0;    // the chunks' transfer (or the broadcast)
    double total_s = 0;       // the state agreement to the state loaded and checked
  };
  const Healing& last_healing() const { return last_healing_; }

 private:
  struct TrackedModel {
    std::function<void(std::shared_ptr<ProcessGroup>)> reset;
    std::function<void()> abandon;
    std::function<void(std::int64_t)> continue_after;
    std::function<void(std::chrono::steady_clock::duration)> count_wait;
    std::function<std::vector<std::pair<std::string, torch::Tensor>>()> tensors;
    std::function<CommHookInterface&()> hook;
  };
  void track_model(TrackedModel model);
  void regroup(const std::string& why);
  void release_group();
  // The watch (See Note [Watching the round] in fault_tolerant.cpp): watch() the current group from
  // the moment it is built, unwatch() before it is aborted and destroyed.
  void watch(const std::shared_ptr<ProcessGroup>& group, std::uint64_t round);
  void unwatch();
  void watch_loop();
  void synchronize_state();
  // Sends the training state to the ranks of `receivers`, from `holders` (same state, the source
  // first); on a receiver, the bytes and how many ranks sent them. See Note [Healing at link speed].
  struct Healed {
    std::string bytes;
    int senders = 0;
    double transfer_s = 0;
    std::uint64_t checksum = 0;  // the whole state's, as the source computed it
  };
  Healed heal(const std::vector<int>& holders, const std::vector<int>& receivers);
  std::string encode_state() const;
  void load_state(const std::string& bytes, int source);

  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<MembershipSource> source_;
  FaultTolerantOptions options_;
  std::shared_ptr<ProcessGroup> group_;
  Membership membership_;
  bool has_state_ = false;  // false until start() received or kept the job's state
  bool released_ = false;   // a spare released at the job's end
  std::int64_t step_ = 0;
  int regroups_ = 0;
  std::string last_regroup_reason_;
  Healing last_healing_;
  std::optional<TrackedModel> model_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  amp::GradScaler* scaler_ = nullptr;
  DiLoCo* diloco_ = nullptr;
  std::vector<std::pair<std::string, std::int64_t*>> counters_;
  std::mutex watch_mutex_;
  std::condition_variable watch_wakeup_;
  std::shared_ptr<ProcessGroup> watched_;  // guarded by watch_mutex_, as the two below
  std::uint64_t watched_round_ = 0;
  bool watch_stopping_ = false;
  std::thread watch_thread_;  // started by the first watch(), joined by the destructor
  // One thread per released group, each dropping what the group held (See Note [Releasing an
  // aborted group] in fault_tolerant.cpp); joined by the destructor.
  std::vector<std::thread> releasers_;
};

}  // namespace ddp
