#include "launcher/live_launch.h"

#include <spdlog/spdlog.h>

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
//   - a worker that dies here is restarted by this launcher (--max_restarts) and heals from a peer.
// Not done yet: a host started later (its launcher would wait for a rendezvous round the running
// members never open in live mode), the launcher marking a dead local worker left (mark_left) to
// skip the settle timeout, and the loss of the host that serves the store (it ends the job).
SupervisorResult run_live(const LaunchConfig& c, const LocalWorkers& local, const RunContext& run,
                          const SupervisorOptions& base) {
  const rdzv::RoundRules rules = round_rules(c);
  ElasticRendezvous rendezvous(c, local.nproc);  // serves the store on one host: kept to the end
  spdlog::info("rendezvous '{}' at {}:{}: joining a round of {} to {} nodes (--recovery live)", c.rdzv_id, c.rdzv_host,
               c.rdzv_port, rules.min_nodes, rules.max_nodes);
  const ElasticMembership m = rendezvous.next_round(-1, 0);
  const NodeAssignment& node = m.node;
  spdlog::info("round {}: starting {} workers (ranks {}..{} of {}) on node {} of {}; --recovery live: a lost host "
               "does not stop them",
               m.round, local.nproc, global_rank(node, 0), global_rank(node, local.nproc - 1),
               node.nnodes * local.nproc, node.node_rank, node.nnodes);
  SupervisorOptions options = base;
  options.max_restarts = c.max_restarts;
  const GroupFactory make_group = [&](int attempt) {
    NodeAssignment attempt_node = node;
    attempt_node.max_restarts = c.max_restarts;
    std::vector<WorkerLaunch> group = plan_workers(c, attempt_node, local, run, attempt);
    make_new_dir(attempt_dir(run.run_folder, attempt));  // See Note [Log folders]
    for (const WorkerLaunch& w : group) make_new_dir(w.dir);
    return group;
  };
  SupervisorResult result = supervise(options, make_group);
  return result;
}

}  // namespace ddp::launcher
