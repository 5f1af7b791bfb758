#include "launcher/agent/live_recovery.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/base/detail/route.h"
#include "ddp/base/str.h"
#include "launcher/rendezvous/store_rendezvous.h"
#include "launcher/agent/live_respawn.h"
#include "launcher/channel/live_watch.h"
#include "launcher/observe/straggler.h"
#include "launcher/process/net.h"

namespace ddp::launcher::agent {

// Note [Live recovery with ddp_launch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With --recovery restart (the default) a lost host ends the round: every survivor stops its
// workers and restarts them in the next rendezvous round (See Note [Elastic rounds] in
// launcher/rendezvous/rounds.cpp). With --recovery live the membership of the *training* is no longer the
// launcher's business after the first round: the workers run ddp::FaultTolerant over a
// ddp::StoreMembership (See Note [Membership seam] in ddp/elastic/membership.h), and the smallest design
// that works end to end is to give them a store that outlives every worker and a key prefix:
//   - the store is the rendezvous store (--rdzv_endpoint), served by the launcher that bound its
//     port for the life of that launcher; the job's keys live under "ddp/live/<rdzv_id>/", apart
//     from the rendezvous records. The worker learns both, and a member id unique in the job
//     ("<node key>/local<L>/attempt<K>", below), from DDP_LIVE_STORE, DDP_LIVE_PREFIX and DDP_LIVE_MEMBER
//     (ddp/base/worker_variable_names.h); ddp::live_job_from_environment() (ddp/elastic/live_job.h) builds the
//     store client and the StoreMembership from them, its first round being the launcher's round
//     (RANK, WORLD_SIZE), a restarted worker (TORCHELASTIC_RESTART_COUNT > 0) joining as a joiner.
//   - the launcher opens no job channel and stops nothing for a lost host: the survivors'
//     collectives fail (PeerLostError, or the group's timeout for a silent host), FaultTolerant
//     drops the step and closes the next round without the lost member as soon as it is marked
//     gone: the launchers' liveness channel marks a whole host's workers gone at once when its
//     launcher's connection closes, after --rdzv_conf keep_alive_interval x keep_alive_max_attempt
//     of silence otherwise (See Note [Lost hosts in a live job] in launcher/channel/live_watch.cpp);
//     StoreMembershipOptions::settle_timeout stays the bound when nobody could mark it.
//   - a worker that dies here is restarted alone by this launcher (--max_restarts, per node), its
//     node-mates keep running, and it heals from a peer (TORCHELASTIC_RESTART_COUNT > 0 makes it a
//     joiner): See Note [Restarting one live worker] in launcher/agent/live_respawn.h.
//   - a host started later claims a slot in the next rendezvous round as in restart mode; the
//     members' launchers see it waiting (LiveAdmission) and join that round themselves to close
//     it, without stopping their workers; the newcomer's workers (TORCHELASTIC_RESTART_COUNT = the
//     round > 0) join the training as joiners and receive the state from a survivor. Closing that
//     round expects the nodes the training has now (the round's less those the liveness channel
//     reported lost, which no longer count towards --nnodes MAX) and the newcomers, so it closes
//     without the last call unless a loss is not reported yet (then it blocks this node's
//     supervision for up to --rdzv_conf last_call_timeout, which a worker's exit waits out).
//   - before restarting a dead worker, a launcher marks it gone in the training's membership
//     (See Note [Marking a lost node gone] in ddp/elastic/detail/membership_keys.h: once per member and round, so
//     never counted twice with the liveness channel's mark of its node), so that the survivors
//     close their next round without waiting the settle timeout.
//   - member ids are "<node key>/local<L>/attempt<K>": "node<N>" for a node of the first round,
//     "node<N>.r<R>" for one that joined in round R (live_node_key), unique in the job.
// The loss of the host that serves the store ends the job: Note [The store's host lost] in
// launcher/channel/live_watch.cpp.
// c10d's PrefixStore adds the '/' after it.
std::string live_store_prefix(const config::LaunchConfig& c) { return "ddp/live/" + c.rdzv_id; }

namespace {

constexpr char kLiveWatchName[] = "live_watch";

// While the workers run: admits the launchers waiting to join (a host started later) into the next
// rendezvous round, without stopping anything here (polled by the attempt at most every 250 ms, one
// small store query each). The newcomers' workers join the training as joiners. The nodes the
// liveness channel reported lost no longer count towards --nnodes MAX (See Note [Lost hosts in a
// live job] in launcher/channel/live_watch.cpp).
class LiveAdmission {
 public:
  LiveAdmission(rendezvous::StoreRendezvous& rendezvous, const rendezvous::RoundRules& rules,
                const rendezvous::RendezvousRound& first, std::function<int()> lost_nodes)
      : rendezvous_(rendezvous),
        poll_(rendezvous, "no newcomer can be admitted into this live job"),
        rules_(rules),
        round_(first.round),
        nodes_(first.node.nnodes),
        lost_nodes_(std::move(lost_nodes)) {}

  std::optional<std::string> poll() {
    const int waiting = poll_.waiting_after(round_);
    if (waiting == 0) return std::nullopt;
    const int lost_total = lost_nodes_();
    const int lost = lost_total - lost_before_round_;
    const rendezvous::LiveAdmissionStep step = rendezvous::decide_live_admission(rules_, nodes_, lost, waiting);
    if (!step.admit) {
      if (!told_full_) {
        told_full_ = true;
        spdlog::info("a node waits to join, but the job trains on {} nodes, its maximum (--nnodes {}:{}): it waits "
                     "for a place",
                     step.current_nodes, rules_.min_nodes, rules_.max_nodes);
      }
      return std::nullopt;
    }
    // A lost host that the liveness channel has not reported yet is expected: the round then
    // closes after the last call.
    const rendezvous::RendezvousRound next = rendezvous_.next_rendezvous(round_, step.expected_nodes);
    spdlog::info("round {}: {} node(s) joined ({} in the round{}); --recovery live: the workers keep running, the "
                 "newcomers' workers join the training",
                 next.round, next.node.nnodes - step.current_nodes, next.node.nnodes,
                 lost > 0 ? ddp::str(", ", lost, " lost node(s) no longer counted") : std::string());
    round_ = next.round;
    nodes_ = next.node.nnodes;
    lost_before_round_ = lost_total;
    told_full_ = false;
    return std::nullopt;  // nothing stops here
  }

 private:
  rendezvous::StoreRendezvous& rendezvous_;
  rendezvous::NewcomerPoll poll_;
  const rendezvous::RoundRules& rules_;
  int round_;
  int nodes_;
  std::function<int()> lost_nodes_;
  int lost_before_round_ = 0;
  bool told_full_ = false;
};

// The liveness channel's end on this node (See Note [Lost hosts in a live job]): the server where
// the store is served, a client elsewhere.
struct LiveWatch {
  std::unique_ptr<channel::LiveWatchServer> server;
  std::unique_ptr<channel::LiveWatchClient> client;
  int lost_nodes() const { return server ? server->lost_nodes() : client ? client->lost_nodes() : 0; }
};

// The serving launcher listens on a port the OS picks, on the address the store listens on, and
// publishes it before the first round (See Note [One port per job] in launcher/rendezvous/rendezvous.h).
int listen_for_live_watch(rendezvous::StoreRendezvous& rendezvous, const config::LaunchConfig& c) {
  const int fd = detail::listen_on_address(rendezvous.served_address(), 0);
  if (fd < 0) {
    throw ddp::Error(ddp::str("the live job's liveness channel cannot listen on ", rendezvous.served_address(), ": ",
                              std::strerror(errno)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  rendezvous.directory()->publish(kLiveWatchName, {c.rdzv_host, process::bound_port(fd)});
  return fd;
}

std::string describe_mark(int marked) {
  if (marked > 0) return ddp::str("marked ", marked, " worker(s) gone in the training's membership");
  if (marked == 0) return "none of its workers is in the training's membership now (already dropped): nothing to mark";
  if (marked == -2) return "its workers were marked gone already (by its own launcher)";
  return "the rendezvous store did not answer: the survivors wait their settle timeout";
}

// --straggler_action in a live job: the other launchers' timings over the liveness channel (See Note
// [Stragglers in a live job] in launcher/channel/live_watch.cpp); the serving launcher names every
// rank and cannot leave (See Note [Replacing a straggler] in launcher/agent/attempt.cpp).
class LiveStragglerPeers : public observe::StragglerPeers {
 public:
  LiveStragglerPeers(LiveWatch& watch, std::string node_key, std::string host_name, std::function<void()> mark_gone)
      : watch_(watch), node_key_(std::move(node_key)), host_name_(std::move(host_name)), mark_gone_(std::move(mark_gone)) {}

  std::vector<std::pair<int, observe::StepTiming>> exchange(int, const std::vector<std::pair<int, observe::StepTiming>>& local) override {
    constexpr std::size_t kPerLine = 256;  // a line stays far below LineConnection's 64 KiB
    for (std::size_t first = 0; first < local.size(); first += kPerLine) {
      const auto last = local.begin() + static_cast<std::ptrdiff_t>(std::min(local.size(), first + kPerLine));
      const std::string items = observe::encode_timings({local.begin() + static_cast<std::ptrdiff_t>(first), last});
      if (watch_.server) watch_.server->publish_timings(node_key_, host_name_, items);
      else if (watch_.client) watch_.client->publish_timings(items);
    }
    std::vector<std::pair<int, observe::StepTiming>> remote;
    for (const channel::NodeTimings& t : watch_.server ? watch_.server->take_timings() : watch_.client->take_timings()) {
      if (t.node_key == node_key_) continue;
      for (const auto& [rank, timing] : observe::decode_timings(t.items)) remote.emplace_back(key_of(t, rank), timing);
    }
    return remote;
  }

  std::string name_of(int key) const override {
    const auto it = labels_.find(key);
    return it != labels_.end() ? ddp::str("rank ", it->second.first, " on ", it->second.second)
                               : ddp::str("rank ", key, " on ", host_name_);
  }

  std::optional<std::pair<int, std::string>> rank_and_host(int key) const override {
    const auto it = labels_.find(key);
    if (it == labels_.end()) return std::nullopt;
    return it->second;
  }

  bool names_every_rank() const override { return watch_.server != nullptr; }

  std::optional<std::string> leave(int, const std::string&) override {
    if (watch_.server) {
      return "this launcher serves the job's store, which a live job cannot lose: it stays, and its straggler is only "
             "named";
    }
    mark_gone_();
    watch_.client->set_succeeded(false);  // no goodbye: its end is a loss
    return std::nullopt;
  }

 private:
  // Another node's rank: launch ranks repeat across the nodes of a live job, node keys do not.
  int key_of(const channel::NodeTimings& t, int rank) {
    constexpr int kFirstRemoteKey = 1 << 20;  // above every launch rank
    const auto [it, added] = keys_.try_emplace({t.node_key, rank}, kFirstRemoteKey + static_cast<int>(keys_.size()));
    if (added) labels_[it->second] = {rank, t.host_name};
    return it->second;
  }

  LiveWatch& watch_;
  std::string node_key_;
  std::string host_name_;
  std::function<void()> mark_gone_;
  std::map<std::pair<std::string, int>, int> keys_;
  std::map<int, std::pair<int, std::string>> labels_;  // key -> (rank, host)
};

class LiveRecovery : public PolicyWithContext {
 public:
  explicit LiveRecovery(const AgentContext& context)
      : PolicyWithContext(context),
        rules_(rendezvous::round_rules(context.config)),
        rendezvous_(context.config, context.local.nproc),  // serves the store on one host: kept to the end
        prefix_(live_store_prefix(context.config)),
        respawns_(context.local.nproc + context.local.spares, context.config.max_restarts, 0) {}

  AgentRound next_round() override {
    const config::LaunchConfig& c = config_;
    const int watch_fd = rendezvous_.serves_store() ? listen_for_live_watch(rendezvous_, c) : -1;
    spdlog::info("rendezvous '{}' at {}:{}: joining a round of {} to {} nodes (--recovery live)", c.rdzv_id,
                 c.rdzv_host, c.rdzv_port, rules_.min_nodes, rules_.max_nodes);
    first_ = rendezvous_.next_rendezvous(-1, 0);
    node_key_ = channel::live_node_key(first_.round, first_.node.node_rank);
    const int first_round_workers = first_.round == 0 ? local_.nproc : 0;
    const double silence_s = c.live_keep_alive_s * c.live_keep_alive_max_attempt;
    if (watch_fd >= 0) {
      spdlog::info("watching the live job's launchers on port {} (a lost one: at once when its connection closes, "
                   "after {} s of silence otherwise)",
                   process::bound_port(watch_fd), silence_s);
      watch_.server = std::make_unique<channel::LiveWatchServer>(watch_fd, silence_s, [this](const channel::LostNode& lost) {
        const int marked = rendezvous_.mark_node_gone(prefix_, lost.node_key, lost.first_round_workers);
        spdlog::warn("lost node {} ({}): {}; {}", lost.node_key, lost.host, lost.why, describe_mark(marked));
      });
    } else {
      const rendezvous::Endpoint server = rendezvous_.directory()->lookup(kLiveWatchName, c.rdzv_timeout_s);
      watch_.client = std::make_unique<channel::LiveWatchClient>(
          server.addr, server.port, ddp::str(node_key_, " ", first_round_workers, " ", host_name_), c.live_keep_alive_s,
          silence_s);
    }
    admission_ = std::make_unique<LiveAdmission>(rendezvous_, rules_, first_, [this] { return watch_.lost_nodes(); });
    respawns_ = LiveRespawnPolicy(local_.nproc + local_.spares, c.max_restarts, first_.round);
    AgentRound round;
    round.number = first_.round;
    round.elastic = true;
    round.node = first_.node;
    round.node.max_restarts = c.max_restarts;
    round.node.live_node_key = node_key_;
    round.start_note = ddp::str(first_.round > 0 ? ", joining the running job" : "",
                                "; --recovery live: a lost host does not stop them");
    return round;
  }

  GroupFactory supervise_round(const AgentRound& round, SupervisorOptions& options) override {
    options.membership_change = [this]() -> std::optional<std::string> {
      if (const auto lost = store_host_lost()) return lost;
      return admission_->poll();
    };
    // TORCHELASTIC_RESTART_COUNT: the round this node joined, so that a worker of a later round (> 0)
    // joins the training as a joiner. The group starts once: a dead worker is restarted alone.
    options.respawn_worker = [this, node = round.node](int local_rank) { return respawn(node, local_rank); };
    if (config_.stragglers) {
      stragglers_ = std::make_unique<LiveStragglerPeers>(watch_, node_key_, host_name_, [this] {
        const int marked = rendezvous_.mark_node_gone(prefix_, node_key_, first_.round == 0 ? local_.nproc : 0);
        spdlog::warn("--straggler_action replace: leaving the live job; {}", describe_mark(marked));
      });
      options.straggler_peers = stragglers_.get();
    }
    return [this, node = round.node](int) { return prepare_attempt(config_, node, local_, run_, first_.round); };
  }

  bool next_round_follows(AgentRound&, SupervisorResult& result) override {
    if (result.replaced && !result.launcher_signal) {  // See Note [Replacing a straggler] in launcher/agent/attempt.cpp
      spdlog::warn("{}: the other nodes go on without it; exiting 0", *result.replaced);
      result.exit_code = 0;
      return false;  // its liveness connection closes without a goodbye (LiveStragglerPeers::leave)
    }
    if (watch_.client) watch_.client->set_succeeded(result.exit_code == 0);
    return false;
  }

  rendezvous::RendezvousHandler& rendezvous() override { return rendezvous_; }

 private:
  // See Note [The store's host lost] in launcher/channel/live_watch.cpp: the job ends here.
  std::optional<std::string> store_host_lost() const {
    if (!watch_.client || !watch_.client->server_lost()) return std::nullopt;
    return ddp::str("the rendezvous host ", config_.rdzv_host, ":", config_.rdzv_port,
                    " is lost (its launcher's liveness connection closed and nothing answered for ",
                    config_.live_keep_alive_s * config_.live_keep_alive_max_attempt,
                    " s): a --recovery live job cannot go on without the store it served; stopping this node's workers");
  }

  std::optional<process::WorkerLaunch> respawn(const rendezvous::NodeAssignment& node, int local_rank) {
    if (const auto lost = store_host_lost()) {
      spdlog::error("local rank {} failed and is not restarted: {}", local_rank, *lost);
      return std::nullopt;
    }
    const bool spare = local_rank >= local_.nproc;  // See Note [Hot spares in ddp_launch] in launcher/agent/plan.cpp
    const bool first_round = !spare && respawns_.in_first_round(local_rank);
    const std::optional<int> restart = respawns_.next(local_rank);
    if (!restart) {
      spdlog::error("local rank {} failed and this node's --max_restarts {} is used up: stopping its workers",
                    local_rank, config_.max_restarts);
      return std::nullopt;
    }
    // See Note [Restarting one live worker] in launcher/agent/live_respawn.h: the dead one is marked gone
    // first, so that the survivors close their next round without waiting the settle timeout.
    const std::string worker_key = ddp::str(node_key_, "/local", local_rank);
    const int marked = rendezvous_.mark_node_gone(prefix_, worker_key, first_round ? 1 : 0);
    if (spare && marked <= 0) {  // unclaimed: its mark is in the spare pool
      spdlog::info("spare {} failed: marked gone in the spare pool; restart {} of {} on this node (as a spare)", worker_key,
                   respawns_.restarts_used(), config_.max_restarts);
    } else if (marked > 0) {
      spdlog::info("marked {} gone in the training's membership; restart {} of {} on this node", worker_key,
                   respawns_.restarts_used(), config_.max_restarts);
    } else {
      spdlog::warn("did not mark {} gone in the training's membership: {}", worker_key, describe_mark(marked));
    }
    return prepare_worker(config_, node, local_, run_, *restart, local_rank);
  }

  rendezvous::RoundRules rules_;
  rendezvous::StoreRendezvous rendezvous_;
  std::string prefix_;
  rendezvous::RendezvousRound first_;
  std::string node_key_;
  LiveWatch watch_;
  std::unique_ptr<LiveAdmission> admission_;
  LiveRespawnPolicy respawns_;
  std::unique_ptr<LiveStragglerPeers> stragglers_;
};

}  // namespace

std::unique_ptr<RecoveryPolicy> make_live_recovery(const AgentContext& context) {
  return std::make_unique<LiveRecovery>(context);
}

}  // namespace ddp::launcher::agent
