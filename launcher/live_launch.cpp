#include "launcher/live_launch.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "launcher/elastic_rendezvous.h"
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
//     ("node<N>/local<L>/attempt<K>"), from DDP_LIVE_STORE, DDP_LIVE_PREFIX and DDP_LIVE_MEMBER
//     (ddp/base/env_names.h); ddp::live_job_from_environment() (ddp/live_environment.h) builds the
//     store client and the StoreMembership from them, its first round being the launcher's round
//     (RANK, WORLD_SIZE), a restarted worker (TORCHELASTIC_RESTART_COUNT > 0) joining as a joiner.
//   - the launcher opens no job channel and watches no membership change, so a lost host stops
//     nothing: the survivors' collectives fail (PeerLostError, or the group's timeout for a silent
//     host), FaultTolerant drops the step and closes the next round without the lost member after
//     StoreMembershipOptions::settle_timeout (nobody marks it gone: a dead host's launcher cannot).
//   - a worker that dies here is restarted by this launcher (--max_restarts) and heals from a peer
//     (TORCHELASTIC_RESTART_COUNT > 0 makes it a joiner).
//   - a host started later claims a slot in the next rendezvous round as in restart mode; the
//     members' launchers see it waiting (LiveAdmission) and join that round themselves to close
//     it, without stopping their workers; the newcomer's workers (TORCHELASTIC_RESTART_COUNT = the
//     round > 0) join the training as joiners and receive the state from a survivor. Closing that
//     round blocks this node's supervision for up to --rdzv_conf last_call_timeout (the members do
//     not know which hosts the training lost, so they may wait for one of them), which a worker's
//     exit waits out.
//   - before restarting its dead workers, a launcher marks them gone in the training's membership
//     (ddp/membership_keys.h: `left` of the round after the last closed one), so that the survivors
//     close their next round without waiting the settle timeout; a whole host's loss has nobody
//     left to mark it, and the survivors wait StoreMembershipOptions::settle_timeout.
// Not done yet: the loss of the host that serves the store (it ends the job).
// c10d's PrefixStore adds the '/' after it.
std::string live_store_prefix(const LaunchConfig& c) { return "ddp/live/" + c.rdzv_id; }

namespace {

using Clock = std::chrono::steady_clock;

// While the workers run: admits the launchers waiting to join (a host started later) into the next
// rendezvous round, without stopping anything here (polled by the attempt at most every 250 ms, one
// small store query each). The newcomers' workers join the training as joiners.
class LiveAdmission {
 public:
  LiveAdmission(ElasticRendezvous& rendezvous, const rdzv::RoundRules& rules, const ElasticMembership& first)
      : rendezvous_(rendezvous), rules_(rules), round_(first.round), nodes_(first.node.nnodes) {}

  std::optional<std::string> poll() {
    if (store_lost_ || Clock::now() - last_poll_ < std::chrono::milliseconds(250)) return std::nullopt;
    last_poll_ = Clock::now();
    const int waiting = rendezvous_.waiting_after(round_);
    if (waiting < 0) {
      store_lost_ = true;
      spdlog::warn("the rendezvous store did not answer: no newcomer can be admitted into this live job");
      return std::nullopt;
    }
    if (waiting == 0 || !rdzv::admits_newcomers(rules_, nodes_, waiting, true)) return std::nullopt;
    // Lost hosts are not known here (no job channel): a round that expects one of them closes
    // after the last call instead.
    const ElasticMembership next = rendezvous_.next_round(round_, std::min(rules_.max_nodes, nodes_ + waiting));
    spdlog::info("round {}: {} node(s) joined ({} in the round); --recovery live: the workers keep running, the "
                 "newcomers' workers join the training",
                 next.round, next.node.nnodes - nodes_, next.node.nnodes);
    round_ = next.round;
    nodes_ = next.node.nnodes;
    return std::nullopt;  // nothing stops here
  }

 private:
  ElasticRendezvous& rendezvous_;
  const rdzv::RoundRules& rules_;
  int round_;
  int nodes_;
  Clock::time_point last_poll_{};
  bool store_lost_ = false;
};

}  // namespace

SupervisorResult run_live(const LaunchConfig& c, const LocalWorkers& local, const RunContext& run,
                          const SupervisorOptions& base) {
  const rdzv::RoundRules rules = round_rules(c);
  ElasticRendezvous rendezvous(c, local.nproc);  // serves the store on one host: kept to the end
  spdlog::info("rendezvous '{}' at {}:{}: joining a round of {} to {} nodes (--recovery live)", c.rdzv_id, c.rdzv_host,
               c.rdzv_port, rules.min_nodes, rules.max_nodes);
  const ElasticMembership m = rendezvous.next_round(-1, 0);
  const NodeAssignment& node = m.node;
  spdlog::info("round {}: starting {} workers (ranks {}..{} of {}) on node {} of {}{}; --recovery live: a lost host "
               "does not stop them",
               m.round, local.nproc, global_rank(node, 0), global_rank(node, local.nproc - 1),
               node.nnodes * local.nproc, node.node_rank, node.nnodes, m.round > 0 ? ", joining the running job" : "");
  LiveAdmission admission(rendezvous, rules, m);
  SupervisorOptions options = base;
  options.max_restarts = c.max_restarts;
  options.membership_change = [&] { return admission.poll(); };
  // TORCHELASTIC_RESTART_COUNT: the round this node joined plus its local restarts, so that a
  // worker of a later round or a restarted one (> 0) joins the training as a joiner.
  const GroupFactory make_group = [&](int attempt) {
    NodeAssignment attempt_node = node;
    attempt_node.max_restarts = c.max_restarts;
    const int restart_count = m.round + attempt;
    if (attempt > 0) {
      // This node's workers of the last attempt are gone (the group stops whole): say so, so that
      // the survivors close their next round without waiting the settle timeout for them.
      const int marked = rendezvous.mark_workers_gone(live_store_prefix(c), local.nproc);
      if (marked > 0) {
        spdlog::info("marked this node's {} worker(s) gone in the training's membership", local.nproc);
      } else {
        spdlog::warn("could not mark this node's workers gone in the training's membership ({}): the survivors "
                     "wait their settle timeout",
                     marked == 0 ? "no round of it has closed" : "the store did not answer");
      }
    }
    return prepare_attempt(c, attempt_node, local, run, restart_count);
  };
  return supervise(options, make_group);
}

}  // namespace ddp::launcher
