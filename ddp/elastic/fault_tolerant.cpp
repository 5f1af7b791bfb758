// Live recovery: See Note [Live recovery] in ddp/elastic/fault_tolerant.h.
#include "ddp/elastic/fault_tolerant.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <xxhash.h>

#include <algorithm>
#include <string_view>

#include "ddp/algorithms/diloco.h"
#include "ddp/amp/grad_scaler.h"
#include "ddp/base/error.h"
#include "ddp/base/str.h"
#include "ddp/checkpoint/detail/state_bytes.h"
#include "ddp/checkpoint/detail/trainer_state.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "ddp/distributed/detail/collective_log.h"

namespace ddp {
namespace {

constexpr const char* kStateMagic = "ddp live state 1";

// The state's checksums (whole and per chunk: See Note [Healing at link speed]): XXH3-64, tens of
// GB/s, so that checking gigabytes of state costs a fraction of their transfer (FNV-1a, a byte at a
// time, took about a second per GB).
std::uint64_t state_hash(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

// A hook state's entries that belong to one rank only (See Note [Live recovery]).
bool per_rank_entry(const std::string& name) { return name.rfind("error.", 0) == 0; }

}  // namespace

FaultTolerant::FaultTolerant(c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<MembershipSource> membership,
                             FaultTolerantOptions options)
    : store_(std::move(store)), source_(std::move(membership)), options_(std::move(options)) {
  if (!store_) throw InvalidArgument("FaultTolerant: the store is null");
  if (!source_) throw InvalidArgument("FaultTolerant: the membership source is null");
  if (options_.min_world_size < 1) throw InvalidArgument("FaultTolerantOptions::min_world_size must be at least 1");
  if (options_.max_recovery_attempts < 1) {
    throw InvalidArgument("FaultTolerantOptions::max_recovery_attempts must be at least 1");
  }
  // A group of this process alone, so that DistributedDataParallel can be built before start().
  group_ = new_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, options_.group);
}

FaultTolerant::~FaultTolerant() {
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    watch_stopping_ = true;
    watched_.reset();
  }
  watch_wakeup_.notify_all();
  if (watch_thread_.joinable()) watch_thread_.join();
  for (auto& releaser : releasers_) releaser.join();
}

// Note [Watching the round]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A rank learns that a peer is gone from its collectives: a closed connection fails the wait in
// progress at once, a silent peer after the group's timeout. Gloo does not always tell: in one run
// of hosts.live_recovery on a loaded machine (its folder kept by BED_KEEP_FAILED), host 1's worker
// was SIGKILLed during a step agreement of three ranks; rank 2 failed at once and went on to the
// next round, but rank 0 sat in the same agreement for its whole 10 s timeout (both of its peers
// were gone from the group, yet no error reached its wait), and the next round closed without it
// after the 2 s settle timeout. The job went on without a live member, which then waited for a
// round nobody came to. The membership knows sooner: the launcher marks a dead worker gone ("left"
// of the next round), and a member that regroups arrives in the next round ("previous"). Either
// means the round's group can complete no more collectives. So a watch thread asks
// MembershipSource::round_abandoned every watch_interval (two store reads) and aborts the group
// when it answers: the blocked wait ends within ProcessGroup::kAbortPollInterval with PeerLostError, the rank regroups and arrives in time, and the
// round closes by its count instead of the settle timeout. A planned change (a joiner) triggers it
// too, but every member has left the round's collectives by then, and a wait whose work completed
// returns that (ddp/distributed/detail/collective_wait.cpp), so a step applied everywhere is not dropped. The watch
// holds the group only between watch() (once it is built, before the state agreement, which a
// death can block too) and unwatch() (before release_group() aborts and destroys it), and aborts it
// under watch_mutex_, so it never aborts a group being destroyed.
void FaultTolerant::watch(const std::shared_ptr<ProcessGroup>& group, std::uint64_t round) {
  if (options_.watch_interval.count() <= 0) return;
  std::lock_guard<std::mutex> lock(watch_mutex_);
  watched_ = group;
  watched_round_ = round;
  if (!watch_thread_.joinable()) watch_thread_ = std::thread([this] { watch_loop(); });
}

void FaultTolerant::unwatch() {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  watched_.reset();
}

void FaultTolerant::watch_loop() {
  std::unique_lock<std::mutex> lock(watch_mutex_);
  while (!watch_stopping_) {
    watch_wakeup_.wait_for(lock, options_.watch_interval, [this] { return watch_stopping_; });
    if (watch_stopping_ || !watched_) continue;
    const std::shared_ptr<ProcessGroup> group = watched_;
    const std::uint64_t round = watched_round_;
    lock.unlock();
    std::string why;
    try {
      why = source_->round_abandoned(round);
    } catch (const std::exception&) {
      why.clear();  // the store did not answer: the collectives say what happened
    }
    lock.lock();
    if (why.empty() || watched_ != group || watched_round_ != round) continue;
    group->abort(str(why, " (the membership watch)"));
    watched_.reset();
  }
}

void FaultTolerant::track_model(TrackedModel model) {
  if (model_) throw InvalidArgument("FaultTolerant::track: one DistributedDataParallel model per FaultTolerant");
  model_ = std::move(model);
}
void FaultTolerant::track(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer) != nullptr) {
    throw InvalidArgument("FaultTolerant::track: ZeroRedundancyOptimizer is not supported by live recovery yet (a "
                          "lost rank's optimizer shard exists nowhere else); track the optimizer it wraps without "
                          "ZeRO, or restart from a checkpoint");
  }
  optimizer_ = &optimizer;
}
void FaultTolerant::track(amp::GradScaler& scaler) { scaler_ = &scaler; }
void FaultTolerant::track(DiLoCo& diloco) { diloco_ = &diloco; }
void FaultTolerant::track(const std::string& name, std::int64_t& counter) { counters_.emplace_back(name, &counter); }

bool FaultTolerant::start() {
  if (has_state_ || released_) throw InvalidArgument("FaultTolerant::start: already started");
  regroup("start");
  return !released_;
}

void FaultTolerant::finish(std::chrono::milliseconds timeout) {
  if (!has_state_) throw InvalidArgument("FaultTolerant::finish: only a process that trained (start() returned true) finishes");
  source_->release_spares(timeout);
}

bool FaultTolerant::step(const std::function<void()>& compute, const std::function<void()>& apply) {
  if (!has_state_) {
    throw InvalidArgument(released_ ? "FaultTolerant::step: this spare was released (start() returned false): it has no step to train"
                                    : "FaultTolerant::step: call start() first");
  }
  bool change_pending = false;
  try {
    compute();
    const bool pending = group_->rank() == 0 && source_->change_pending(membership_.round);
    auto agreement = torch::tensor({step_, -step_, std::int64_t{pending ? 1 : 0}}, torch::kLong);
    const auto waited_from = std::chrono::steady_clock::now();
    group_->allreduce(agreement, c10d::ReduceOp::MAX, "step agreement");
    // Blocked for the slowest rank, as in the backward's all-reduce (See Note [Stragglers] in
    // launcher/observe/straggler.h): the launcher's straggler report counts it as waiting.
    if (model_) model_->count_wait(std::chrono::steady_clock::now() - waited_from);
    const auto* agreed = agreement.data_ptr<std::int64_t>();
    if (agreed[0] != step_ || -agreed[1] != step_) {
      throw MismatchError(str("live recovery: rank ", group_->rank(), " is at step ", step_,
                              " but another rank is at step ", agreed[0] != step_ ? agreed[0] : -agreed[1],
                              "; every rank must call step() once per step"));
    }
    change_pending = agreed[2] > 0;
  } catch (const PeerLostError& error) {
    regroup(str("a peer was lost at step ", step_, ": ", error.what()));
    return false;
  } catch (const TimeoutError& error) {
    regroup(str("a collective timed out at step ", step_, ": ", error.what()));
    return false;
  }
  apply();
  ++step_;
  if (change_pending) regroup("a process waits to join");
  return true;
}

void FaultTolerant::recover() { regroup("recover() was called"); }

// Note [Releasing an aborted group]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Releasing a Gloo backend joins its worker threads, and a thread blocked in a collective whose
// peer went silent returns only at the group's timeout (Gloo's own, the same bound): a rank whose
// wait ended early (abort(): See Note [Watching the round]) would sit in destroy() until then and
// miss the next round anyway. So the group's backend, sub-groups and store go to a thread of their
// own, which drops them whenever Gloo lets go; the rank regroups at once. Closing a backend's
// connections is what tells the peers blocked in it (See Note [Aborting a group] in
// ddp/distributed/process_group.cpp); a backend still blocked holds its connections until its timeout, as the
// peers blocked in the same collective do. The destructor joins these threads: at most one group
// timeout after the last recovery.
void FaultTolerant::release_group() {
  unwatch();
  if (model_) model_->abandon();
  if (group_) {
    group_->abort();
    if (auto resources = group_->take_resources()) {
      releasers_.emplace_back([resources = std::move(resources)]() mutable { resources.reset(); });
    }
  }
}

void FaultTolerant::regroup(const std::string& why) {
  const Logger logger = group_->logger();  // a copy: group_ is replaced below
  if (has_state_) logger.warn(str("live recovery at step ", step_, ": ", why));
  last_regroup_reason_ = why;
  std::string last_error;
  for (int attempt = 1; attempt <= options_.max_recovery_attempts; ++attempt) {
    release_group();
    // A line between the lost peer and the new round's group: a stall is then placed on one side of
    // it (See Note [A round that does not close] in ddp/elastic/membership.cpp).
    if (has_state_) logger.info(str("live recovery: the old group released, waiting for the round after ", membership_.round));
    Membership next = source_->next(membership_.round, options_.membership_timeout);
    if (next.released) {
      released_ = true;
      logger.info("live recovery: the job ended while this process was a spare: released, it trained no step");
      return;
    }
    if (next.world_size < options_.min_world_size) {
      throw Error(str("live recovery: round ", next.round, " has ", next.world_size, " member(s), below the minimum of ",
                      options_.min_world_size, " (FaultTolerantOptions::min_world_size); the job cannot go on: ",
                      "restart it from its last checkpoint"));
    }
    membership_ = std::move(next);
    if (!membership_.closed_by.empty()) group_->logger().info(str("live recovery: ", membership_.closed_by));
    try {
      try {
        group_ = new_process_group(c10::make_intrusive<c10d::PrefixStore>(membership_.store_prefix, store_),
                                   membership_.rank, membership_.world_size, options_.group);
      } catch (const PeerLostError&) {
        throw;
      } catch (const CommunicationError& error) {  // a member left while the group connected
        throw PeerLostError(str("building the group of round ", membership_.round, ": ", error.what()));
      }
      watch(group_, membership_.round);
      if (options_.on_group_built) options_.on_group_built(*group_, membership_);
      synchronize_state();
      ++regroups_;
      group_->logger().info(str("live recovery: round ", membership_.round, ", rank ", membership_.rank, " of ",
                                membership_.world_size, ", at step ", step_));
      if (options_.on_new_group) options_.on_new_group(*group_, membership_);
      return;
    } catch (const PeerLostError& error) {
      last_error = error.what();
    } catch (const TimeoutError& error) {
      last_error = error.what();
    }
    group_->logger().warn(str("live recovery: round ", membership_.round, " failed (attempt ", attempt, " of ",
                              options_.max_recovery_attempts, "): ", last_error));
  }
  throw Error(str("live recovery failed after ", options_.max_recovery_attempts,
                  " rounds (FaultTolerantOptions::max_recovery_attempts); the last error: ", last_error));
}

void FaultTolerant::synchronize_state() {
  if (model_) model_->reset(group_);
  if (scaler_ != nullptr) scaler_->reset_process_group(group_);
  if (diloco_ != nullptr) diloco_->reset_process_group(group_);
  // [steps applied, holds no state, DiLoCo's outer steps] of every rank: progress is (steps, outer
  // steps), See Note [DiLoCo under FaultTolerant] in ddp/algorithms/diloco.cpp.
  const std::int64_t outer = diloco_ != nullptr ? diloco_->outer_steps() : 0;
  const auto info = torch::tensor({step_, std::int64_t{has_state_ ? 0 : 1}, outer}, torch::kLong);
  const auto all = group_->allgather(info, "state agreement");
  const auto progress = [&](int r) {
    const auto* entry = all[static_cast<std::size_t>(r)].data_ptr<std::int64_t>();
    return std::make_pair(entry[0], entry[2]);
  };
  const auto holds_state = [&](int r) { return all[static_cast<std::size_t>(r)].data_ptr<std::int64_t>()[1] == 0; };
  int source = -1;
  for (int r = 0; r < group_->size(); ++r) {
    if (holds_state(r) && (source < 0 || progress(r) > progress(source))) source = r;
  }
  if (source < 0) source = 0;  // the job's start: nobody holds state yet, rank 0's becomes it
  const auto best = progress(source);
  std::vector<int> holders{source};  // the source first: it says the size and the checksums
  std::vector<int> receivers;
  for (int r = 0; r < group_->size(); ++r) {
    if (r != source && holds_state(r) && progress(r) == best) holders.push_back(r);
    if (r != source && (!holds_state(r) || progress(r) < best)) receivers.push_back(r);
  }
  if (!receivers.empty()) {
    const auto started = std::chrono::steady_clock::now();
    const Healed healed = heal(holders, receivers);
    const std::string& bytes = healed.bytes;
    if (std::find(receivers.begin(), receivers.end(), group_->rank()) != receivers.end()) {
      load_state(bytes, source);
      const auto loaded = state_hash(encode_state());
      const auto expected = healed.checksum;  // the source's, which the bytes were checked against
      if (loaded != expected) {
        throw MismatchError(str("live recovery: rank ", group_->rank(), " loaded the state of rank ", source,
                                " but its own state now has checksum ", loaded, " instead of ", expected,
                                ": the model, optimizer, scaler or hook differs from the source's (same "
                                "model and optimizer types on every rank?)"));
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      last_healing_ = Healing{static_cast<std::int64_t>(bytes.size()), healed.senders, healed.transfer_s, seconds};
      group_->logger().info(str("live recovery: received ", detail::format_bytes(last_healing_.bytes), " of state from ",
                                healed.senders, " rank(s): the transfer ", healed.transfer_s, " s (",
                                static_cast<double>(bytes.size()) / healed.transfer_s / 1e6, " MB/s), loaded in ",
                                seconds, " s"));
    }
  }
  has_state_ = true;
  if (model_) model_->continue_after(step_);  // See Note [Heartbeat steps in a live job] in ddp/parallel/detail/heartbeat_observer.cpp
}

// Note [Healing at link speed]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A joiner's state used to come in one broadcast from the source to every rank of the new group:
// the ranks that held it already received it again, and the source's link carried it once per
// rank (a joiner among two holders got half of it; among seven, a seventh). Now only the ranks
// that need it receive it, and from every rank that holds the same state (the state agreement's
// best progress): the source broadcasts a manifest (the size, the whole state's XXH3-64 and each
// chunk's), every holder encodes its own state and checks it against the manifest (an allreduce
// tells all whether one differs; then the source alone sends), and chunk c of receiver j comes
// from holder (c + j) mod H over the pair between the two (Gloo's connection of its own between
// each two ranks, on the address each advertised: the one that routes to the peer, See Note
// [Advertised address] in ddp/base/detail/route.h). All chunks are in flight at once; the
// receiver checks each chunk against the manifest, so a corrupt one names its sender. A link
// shaped to R then brings a joiner its state at R whatever the group's size, and several holders
// fill a joiner's link when one sender's is slower (docs/faults.md, "Healing at link speed").
FaultTolerant::Healed FaultTolerant::heal(const std::vector<int>& holders, const std::vector<int>& receivers) {
  const int me = group_->rank();
  const int source = holders.front();
  const bool holder = std::find(holders.begin(), holders.end(), me) != holders.end();
  if (options_.healing == FaultTolerantOptions::Healing::kBroadcast) {
    std::string bytes = me == source ? encode_state() : std::string();
    auto checksum = torch::tensor({static_cast<std::int64_t>(state_hash(bytes))}, torch::kLong);
    group_->broadcast(checksum, source, "state checksum");
    const auto sent = std::chrono::steady_clock::now();
    group_->broadcast_bytes(bytes, source, "training state");
    const double transfer_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
    const auto expected = static_cast<std::uint64_t>(checksum.item<std::int64_t>());
    if (me != source && state_hash(bytes) != expected) {
      throw CommunicationError(str("live recovery: the state from rank ", source, " arrived with checksum ",
                                   state_hash(bytes), " but was sent with ", expected, " (", bytes.size(), " bytes)"));
    }
    return {std::move(bytes), 1, transfer_s, expected};
  }
  std::string bytes = holder ? encode_state() : std::string();
  const std::int64_t chunk = std::max<std::int64_t>(1, options_.heal_chunk_bytes);
  // The manifest: [size, whole, chunk 0, chunk 1, ...] (checksums as int64).
  auto size = torch::tensor({static_cast<std::int64_t>(bytes.size())}, torch::kLong);
  group_->broadcast(size, source, "state size");
  const std::int64_t total = size.item<std::int64_t>();
  const std::int64_t chunks = (total + chunk - 1) / chunk;
  auto manifest = torch::zeros({1 + chunks}, torch::kLong);
  if (me == source) {
    auto* m = manifest.data_ptr<std::int64_t>();
    m[0] = static_cast<std::int64_t>(state_hash(bytes));
    for (std::int64_t c = 0; c < chunks; ++c) {
      m[1 + c] = static_cast<std::int64_t>(
          state_hash(std::string_view(bytes).substr(static_cast<std::size_t>(c * chunk), static_cast<std::size_t>(chunk))));
    }
  }
  group_->broadcast(manifest, source, "state manifest");
  const auto* m = manifest.data_ptr<std::int64_t>();
  // Holders whose bytes differ from the source's (they should not: the same steps applied) leave
  // the sending to the source.
  const bool mine_differs = holder && me != source &&
                            (static_cast<std::int64_t>(bytes.size()) != total || static_cast<std::int64_t>(state_hash(bytes)) != m[0]);
  auto differs = torch::tensor({std::int64_t{mine_differs ? 1 : 0}}, torch::kLong);
  group_->allreduce(differs, c10d::ReduceOp::MAX, "state agreement of the holders");
  const std::vector<int> senders = differs.item<std::int64_t>() > 0 ? std::vector<int>{source} : holders;
  const auto receiver_index = std::find(receivers.begin(), receivers.end(), me);
  torch::Tensor inbox;
  std::vector<ProcessGroup::Transfer> sends, receives;
  const auto view = [&](torch::Tensor& whole, std::int64_t c) {
    return whole.slice(0, c * chunk, std::min(total, (c + 1) * chunk));
  };
  torch::Tensor outbox;
  if (std::find(senders.begin(), senders.end(), me) != senders.end()) {
    outbox = torch::from_blob(bytes.data(), {total}, torch::kUInt8);
  }
  std::string received;  // the chunks land in it (no copy of gigabytes afterwards)
  if (receiver_index != receivers.end()) {
    received.resize(static_cast<std::size_t>(total));
    inbox = torch::from_blob(received.data(), {total}, torch::kUInt8);
  }
  const auto senders_count = static_cast<std::int64_t>(senders.size());
  for (std::size_t j = 0; j < receivers.size(); ++j) {
    for (std::int64_t c = 0; c < chunks; ++c) {
      const int from = senders[static_cast<std::size_t>((c + static_cast<std::int64_t>(j)) % senders_count)];
      if (from == me) sends.push_back({receivers[j], static_cast<int>(c), view(outbox, c)});
      if (receivers[j] == me) receives.push_back({from, static_cast<int>(c), view(inbox, c)});
    }
  }
  const auto sent = std::chrono::steady_clock::now();
  group_->exchange(sends, receives, "training state");
  const double transfer_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  if (receiver_index == receivers.end()) return {};
  for (const auto& r : receives) {
    const auto c = static_cast<std::int64_t>(r.tag);
    const auto arrived = state_hash(std::string_view(received).substr(static_cast<std::size_t>(c * chunk),
                                                                           static_cast<std::size_t>(chunk)));
    if (static_cast<std::int64_t>(arrived) != m[1 + c]) {
      throw CommunicationError(str("live recovery: chunk ", c, " of the state from rank ", r.peer, " arrived with checksum ",
                                   arrived, " but the source's is ", static_cast<std::uint64_t>(m[1 + c]), " (", total,
                                   " bytes in chunks of ", chunk, ")"));
    }
  }
  return {std::move(received), static_cast<int>(senders.size()), transfer_s, static_cast<std::uint64_t>(m[0])};
}

std::string FaultTolerant::encode_state() const {
  detail::StateWriter out;
  out.text(kStateMagic);
  out.integer(step_);
  out.integer(static_cast<std::int64_t>(counters_.size()));
  for (const auto& [name, counter] : counters_) {
    out.text(name);
    out.integer(*counter);
  }
  const auto tensors = model_ ? model_->tensors() : std::vector<std::pair<std::string, torch::Tensor>>();
  std::size_t tensor_bytes = 0;
  for (const auto& item : tensors) tensor_bytes += item.second.nbytes();
  out.reserve(2 * tensor_bytes + (std::size_t{1} << 20));  // the model's, the optimizer's (e.g. momentum), the rest
  out.integer(static_cast<std::int64_t>(tensors.size()));
  for (const auto& [name, tensor] : tensors) {
    out.text(name);
    out.tensor(tensor);
  }
  out.integer(optimizer_ != nullptr ? 1 : 0);
  if (optimizer_ != nullptr) out.value(detail::optimizer_state_dict(*optimizer_));
  out.integer(scaler_ != nullptr ? 1 : 0);
  if (scaler_ != nullptr) {
    const amp::GradScalerState s = scaler_->state_dict();
    out.real(s.scale);
    out.real(s.growth_factor);
    out.real(s.backoff_factor);
    out.integer(s.growth_interval);
    out.integer(s.growth_tracker);
  }
  StateDict hook_state = model_ ? model_->hook().state() : StateDict();
  std::vector<std::pair<std::string, torch::Tensor>> shared;
  for (const auto& item : hook_state) {
    if (!per_rank_entry(item.key())) shared.emplace_back(item.key(), item.value());
  }
  out.integer(static_cast<std::int64_t>(shared.size()));
  for (const auto& [name, tensor] : shared) {
    out.text(name);
    out.tensor(tensor);
  }
  const StateDict outer = diloco_ != nullptr ? diloco_->state() : StateDict();
  out.integer(diloco_ != nullptr ? static_cast<std::int64_t>(outer.size()) : -1);
  for (const auto& item : outer) {
    out.text(item.key());
    out.tensor(item.value());
  }
  return out.bytes();
}

void FaultTolerant::load_state(const std::string& bytes, int source) {
  detail::StateReader in(bytes, str("live recovery: the state from rank ", source));
  const auto mismatch = [&](const std::string& what) {
    throw MismatchError(str("live recovery: rank ", group_->rank(), " cannot load the state of rank ", source, ": ",
                            what, " (every rank must track the same model, optimizer, scaler and counters)"));
  };
  if (in.text() != kStateMagic) in.fail("not a live recovery state");
  const std::int64_t step = in.integer();
  std::vector<std::int64_t> counters;
  if (in.integer() != static_cast<std::int64_t>(counters_.size())) mismatch("another number of counters");
  for (const auto& [name, counter] : counters_) {
    if (in.text() != name) mismatch(str("counter '", name, "' is not the source's"));
    counters.push_back(in.integer());
  }
  const auto tensors = model_ ? model_->tensors() : std::vector<std::pair<std::string, torch::Tensor>>();
  if (in.integer() != static_cast<std::int64_t>(tensors.size())) mismatch("another number of parameters and buffers");
  std::vector<torch::Tensor> values;
  for (const auto& [name, tensor] : tensors) {
    if (in.text() != name) mismatch(str("'", name, "' is not the source's parameter or buffer at its place"));
    auto value = in.tensor();
    if (value.scalar_type() != tensor.scalar_type() || value.sizes() != tensor.sizes()) {
      mismatch(str("'", name, "' is ", value.scalar_type(), value.sizes(), " there, ", tensor.scalar_type(),
                   tensor.sizes(), " here"));
    }
    values.push_back(std::move(value));
  }
  const bool has_optimizer = in.integer() != 0;
  if (has_optimizer != (optimizer_ != nullptr)) mismatch("one side tracks an optimizer, the other not");
  std::optional<detail::PickleValue> optimizer_state;
  if (has_optimizer) optimizer_state = in.value();
  const bool has_scaler = in.integer() != 0;
  if (has_scaler != (scaler_ != nullptr)) mismatch("one side tracks a GradScaler, the other not");
  amp::GradScalerState scaler_state;
  if (has_scaler) {
    scaler_state.scale = in.real();
    scaler_state.growth_factor = in.real();
    scaler_state.backoff_factor = in.real();
    scaler_state.growth_interval = in.integer();
    scaler_state.growth_tracker = in.integer();
  }
  StateDict hook_state;
  const std::int64_t hook_entries = in.integer();
  for (std::int64_t i = 0; i < hook_entries; ++i) {
    std::string name = in.text();
    hook_state.insert(std::move(name), in.tensor());
  }
  const std::int64_t outer_entries = in.integer();
  if ((outer_entries >= 0) != (diloco_ != nullptr)) mismatch("one side tracks a DiLoCo, the other not");
  StateDict outer_state;
  for (std::int64_t i = 0; i < outer_entries; ++i) {
    std::string name = in.text();
    outer_state.insert(std::move(name), in.tensor());
  }
  if (!in.at_end()) in.fail("bytes left after the state");
  // Everything was read: now change this rank's state.
  const torch::Device device = tensors.empty() ? torch::Device(torch::kCPU) : tensors.front().second.device();
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].second.copy_(values[i]);
  }
  if (optimizer_state) detail::load_optimizer_state_dict(*optimizer_, *optimizer_state, device, str("the state of rank ", source));
  if (has_scaler) scaler_->load_state_dict(scaler_state);
  if (model_ && (hook_entries > 0 || !model_->hook().state().is_empty())) model_->hook().load_state(hook_state);
  if (diloco_ != nullptr) diloco_->load_state(outer_state);
  for (std::size_t i = 0; i < counters_.size(); ++i) *counters_[i].second = counters[i];
  step_ = step;
}

}  // namespace ddp
