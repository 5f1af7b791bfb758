#include "launcher/live_launch.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ddp/base/error.h"
#include "ddp/base/route.h"
#include "ddp/base/str.h"
#include "launcher/elastic_rendezvous.h"
#include "launcher/live_respawn.h"
#include "launcher/live_watch.h"
#include "launcher/log_layout.h"

namespace ddp::launcher {

// Note [Live recovery with ddp_launch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With --recovery restart (the default) a lost host ends the round: every survivor stops its
// workers and restarts them in the next rendezvous round (See Note [Elastic rounds] in
// launcher/rdzv_rounds.cpp). With --recovery live the membership of the *training* is no longer the
// launcher's business after the first round: the workers run ddp::FaultTolerant over a
// ddp::StoreMembership (See Note [Membership seam] in ddp/membership.h), and the smallest design
// that works end to end is to give them a store that outlives every worker and a key prefix:
//   - the store is the rendezvous store (--rdzv_endpoint), served by the launcher that bound its
//     port for the life of that launcher; the job's keys live under "ddp/live/<rdzv_id>/", apart
//     from the rendezvous records. The worker learns both, and a member id unique in the job
//     ("<node key>/local<L>/attempt<K>", below), from DDP_LIVE_STORE, DDP_LIVE_PREFIX and DDP_LIVE_MEMBER
//     (ddp/base/env_names.h); ddp::live_job_from_environment() (ddp/live_environment.h) builds the
//     store client and the StoreMembership from them, its first round being the launcher's round
//     (RANK, WORLD_SIZE), a restarted worker (TORCHELASTIC_RESTART_COUNT > 0) joining as a joiner.
//   - the launcher opens no job channel and stops nothing for a lost host: the survivors'
//     collectives fail (PeerLostError, or the group's timeout for a silent host), FaultTolerant
//     drops the step and closes the next round without the lost member as soon as it is marked
//     gone: the launchers' liveness channel marks a whole host's workers gone at once when its
//     launcher's connection closes, after --rdzv_conf keep_alive_interval x keep_alive_max_attempt
//     of silence otherwise (See Note [Lost hosts in a live job] in launcher/live_watch.cpp);
//     StoreMembershipOptions::settle_timeout stays the bound when nobody could mark it.
//   - a worker that dies here is restarted alone by this launcher (--max_restarts, per node), its
//     node-mates keep running, and it heals from a peer (TORCHELASTIC_RESTART_COUNT > 0 makes it a
//     joiner): See Note [Restarting one live worker] in launcher/live_respawn.h.
//   - a host started later claims a slot in the next rendezvous round as in restart mode; the
//     members' launchers see it waiting (LiveAdmission) and join that round themselves to close
//     it, without stopping their workers; the newcomer's workers (TORCHELASTIC_RESTART_COUNT = the
//     round > 0) join the training as joiners and receive the state from a survivor. Closing that
//     round expects the nodes the training has now (the round's less those the liveness channel
//     reported lost, which no longer count towards --nnodes MAX) and the newcomers, so it closes
//     without the last call unless a loss is not reported yet (then it blocks this node's
//     supervision for up to --rdzv_conf last_call_timeout, which a worker's exit waits out).
//   - before restarting a dead worker, a launcher marks it gone in the training's membership
//     (See Note [Marking a lost node gone] in ddp/membership_keys.h: once per member and round, so
//     never counted twice with the liveness channel's mark of its node), so that the survivors
//     close their next round without waiting the settle timeout.
//   - member ids are "<node key>/local<L>/attempt<K>": "node<N>" for a node of the first round,
//     "node<N>.r<R>" for one that joined in round R (live_node_key), unique in the job.
// Not done yet: the loss of the host that serves the store (it ends the job).
// c10d's PrefixStore adds the '/' after it.
std::string live_store_prefix(const LaunchConfig& c) { return "ddp/live/" + c.rdzv_id; }

namespace {

using Clock = std::chrono::steady_clock;

// While the workers run: admits the launchers waiting to join (a host started later) into the next
// rendezvous round, without stopping anything here (polled by the attempt at most every 250 ms, one
// small store query each). The newcomers' workers join the training as joiners. The nodes the
// liveness channel reported lost no longer count towards --nnodes MAX (See Note [Lost hosts in a
// live job] in launcher/live_watch.cpp).
class LiveAdmission {
 public:
  LiveAdmission(ElasticRendezvous& rendezvous, const rdzv::RoundRules& rules, const ElasticMembership& first,
                std::function<int()> lost_nodes)
      : rendezvous_(rendezvous), rules_(rules), round_(first.round), nodes_(first.node.nnodes),
        lost_nodes_(std::move(lost_nodes)) {}

  std::optional<std::string> poll() {
    if (store_lost_ || Clock::now() - last_poll_ < std::chrono::milliseconds(250)) return std::nullopt;
    last_poll_ = Clock::now();
    const int waiting = rendezvous_.waiting_after(round_);
    if (waiting < 0) {
      store_lost_ = true;
      spdlog::warn("the rendezvous store did not answer: no newcomer can be admitted into this live job");
      return std::nullopt;
    }
    if (waiting == 0) return std::nullopt;
    const int lost_total = lost_nodes_();
    const int lost = lost_total - lost_before_round_;
    const rdzv::LiveAdmissionStep step = rdzv::decide_live_admission(rules_, nodes_, lost, waiting);
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
    const ElasticMembership next = rendezvous_.next_round(round_, step.expected_nodes);
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
  ElasticRendezvous& rendezvous_;
  const rdzv::RoundRules& rules_;
  int round_;
  int nodes_;
  std::function<int()> lost_nodes_;
  int lost_before_round_ = 0;
  Clock::time_point last_poll_{};
  bool store_lost_ = false;
  bool told_full_ = false;
};

// The liveness channel's end on this node (See Note [Lost hosts in a live job]): the server where
// the store is served, a client elsewhere.
struct LiveWatch {
  std::unique_ptr<LiveWatchServer> server;
  std::unique_ptr<LiveWatchClient> client;
  int lost_nodes() const { return server ? server->lost_nodes() : client ? client->lost_nodes() : 0; }
};

// The serving launcher binds the channel's port before the first round, on the address the store
// listens on: a taken port is refused.
int bind_live_watch_port(const LaunchConfig& c, const std::string& address) {
  const int port = live_watch_port(c.rdzv_port);
  const int fd = listen_on_address(address, port);
  if (fd < 0) {
    throw UsageError(ddp::str("port ", port, " on ", c.rdzv_host, " (the live job's liveness channel: the "
                              "--rdzv_endpoint port + 1) cannot be bound: ", std::strerror(errno),
                              "; pick another --rdzv_endpoint port"));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
}

// What a mark says, for the log.
std::string describe_mark(int marked) {
  if (marked > 0) return ddp::str("marked ", marked, " worker(s) gone in the training's membership");
  if (marked == 0) return "none of its workers is in the training's membership now (already dropped): nothing to mark";
  if (marked == -2) return "its workers were marked gone already (by its own launcher)";
  return "the rendezvous store did not answer: the survivors wait their settle timeout";
}

}  // namespace

SupervisorResult run_live(const LaunchConfig& c, const LocalWorkers& local, const RunContext& run,
                          const SupervisorOptions& base) {
  const rdzv::RoundRules rules = round_rules(c);
  ElasticRendezvous rendezvous(c, local.nproc);  // serves the store on one host: kept to the end
  const std::string prefix = live_store_prefix(c);
  LiveWatch watch;
  const int watch_fd = rendezvous.serves_store() ? bind_live_watch_port(c, rendezvous.served_address()) : -1;
  spdlog::info("rendezvous '{}' at {}:{}: joining a round of {} to {} nodes (--recovery live)", c.rdzv_id, c.rdzv_host,
               c.rdzv_port, rules.min_nodes, rules.max_nodes);
  const ElasticMembership m = rendezvous.next_round(-1, 0);
  const NodeAssignment& node = m.node;
  spdlog::info("round {}: starting {} workers (ranks {}..{} of {}) on node {} of {}{}; --recovery live: a lost host "
               "does not stop them",
               m.round, local.nproc, global_rank(node, 0), global_rank(node, local.nproc - 1),
               node.nnodes * local.nproc, node.node_rank, node.nnodes, m.round > 0 ? ", joining the running job" : "");
  const std::string node_key = live_node_key(m.round, node.node_rank);
  const int first_round_workers = m.round == 0 ? local.nproc : 0;
  const double silence_s = c.live_keep_alive_s * c.live_keep_alive_max_attempt;
  if (watch_fd >= 0) {
    spdlog::info("watching the live job's launchers on port {} (a lost one: at once when its connection closes, "
                 "after {} s of silence otherwise)",
                 live_watch_port(c.rdzv_port), silence_s);
    watch.server = std::make_unique<LiveWatchServer>(watch_fd, silence_s, [&](const LostNode& lost) {
      const int marked = rendezvous.mark_node_gone(prefix, lost.node_key, lost.first_round_workers);
      spdlog::warn("lost node {} ({}): {}; {}", lost.node_key, lost.host, lost.why, describe_mark(marked));
    });
  } else {
    watch.client = std::make_unique<LiveWatchClient>(
        c.rdzv_host, live_watch_port(c.rdzv_port),
        ddp::str(node_key, " ", first_round_workers, " ", base.host_name), c.live_keep_alive_s);
  }
  LiveAdmission admission(rendezvous, rules, m, [&] { return watch.lost_nodes(); });
  SupervisorOptions options = base;
  options.max_restarts = c.max_restarts;
  options.membership_change = [&] { return admission.poll(); };
  // TORCHELASTIC_RESTART_COUNT: the round this node joined, so that a worker of a later round (> 0)
  // joins the training as a joiner. The group starts once: a dead worker is restarted alone.
  NodeAssignment live_node = node;
  live_node.max_restarts = c.max_restarts;
  live_node.live_node_key = node_key;
  const GroupFactory make_group = [&](int) { return prepare_attempt(c, live_node, local, run, m.round); };
  LiveRespawnPolicy respawns(local.nproc, c.max_restarts, m.round);
  options.respawn_worker = [&](int local_rank) -> std::optional<WorkerLaunch> {
    const bool first_round = respawns.in_first_round(local_rank);
    const std::optional<int> restart = respawns.next(local_rank);
    if (!restart) {
      spdlog::error("local rank {} failed and this node's --max_restarts {} is used up: stopping its workers",
                    local_rank, c.max_restarts);
      return std::nullopt;
    }
    // See Note [Restarting one live worker] in launcher/live_respawn.h: the dead one is marked gone
    // first, so that the survivors close their next round without waiting the settle timeout.
    const std::string worker_key = ddp::str(node_key, "/local", local_rank);
    const int marked = rendezvous.mark_node_gone(prefix, worker_key, first_round ? 1 : 0);
    if (marked > 0) {
      spdlog::info("marked {} gone in the training's membership; restart {} of {} on this node", worker_key,
                   respawns.restarts_used(), c.max_restarts);
    } else {
      spdlog::warn("did not mark {} gone in the training's membership: {}", worker_key, describe_mark(marked));
    }
    return prepare_worker(c, live_node, local, run, *restart, local_rank);
  };
  SupervisorResult result = supervise(options, make_group);
  if (watch.client) watch.client->set_succeeded(result.exit_code == 0);
  return result;
}

}  // namespace ddp::launcher
