#include "launcher/elastic_launch.h"

#include <chrono>
#include <memory>
#include <spdlog/spdlog.h>

#include "ddp/base/str.h"
#include "launcher/elastic_rendezvous.h"
#include "launcher/job_channel.h"
#include "launcher/job_link.h"
#include "launcher/log_layout.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// While a round runs: whether newcomers wait for the next one and the job admits them (polled by
// the attempt at most every 250 ms, one small store query each).
class NewcomerWatch {
 public:
  NewcomerWatch(ElasticRendezvous& rendezvous, const rdzv::RoundRules& rules, const ElasticMembership& m,
                bool restarts_left)
      : rendezvous_(rendezvous), rules_(rules), m_(m), restarts_left_(restarts_left) {}

  std::optional<std::string> poll() {
    if (store_lost_ || Clock::now() - last_poll_ < std::chrono::milliseconds(250)) return std::nullopt;
    last_poll_ = Clock::now();
    const int waiting = rendezvous_.waiting_after(m_.round);
    if (waiting < 0) {  // each query is bounded by --rdzv_timeout: do not block the group's supervision again
      store_lost_ = true;
      spdlog::warn("the rendezvous store did not answer: no newcomer can be admitted into this round");
      return std::nullopt;
    }
    if (waiting == 0) return std::nullopt;
    if (rdzv::admits_newcomers(rules_, m_.node.nnodes, waiting, restarts_left_)) {
      waiting_ = waiting;
      reason_ = ddp::str(waiting, waiting == 1 ? " node waits" : " nodes wait", " to join the job (", m_.node.nnodes,
                      " of at most ", rules_.max_nodes, " nodes): every node restarts its workers into round ",
                      m_.round + 1);
      return reason_;
    }
    if (!told_) {
      told_ = true;
      spdlog::info("{} waiting to join, but {}: the job goes on with {} nodes", waiting == 1 ? "a node is" : "nodes are",
                   restarts_left_ ? ddp::str("the job is at its maximum of ", rules_.max_nodes, " nodes")
                                  : std::string("--max_restarts is used up"),
                   m_.node.nnodes);
    }
    return std::nullopt;
  }
  // Newcomers seen waiting when the round was stopped for them (0: it was not), and the line said.
  int waiting() const { return waiting_; }
  const std::string& reason() const { return reason_; }

 private:
  ElasticRendezvous& rendezvous_;
  const rdzv::RoundRules& rules_;
  const ElasticMembership& m_;
  bool restarts_left_;
  Clock::time_point last_poll_{};
  int waiting_ = 0;
  std::string reason_;
  bool told_ = false;
  bool store_lost_ = false;
};

}  // namespace

SupervisorResult run_elastic(const LaunchConfig& c, const LocalWorkers& local, const RunContext& run,
                             const SupervisorOptions& base) {
  const rdzv::RoundRules rules = round_rules(c);
  ElasticRendezvous rendezvous(c, local.nproc);
  int after_round = -1;
  int expected = 0;
  while (true) {
    spdlog::info("rendezvous '{}' at {}:{}: joining a round of {} to {} nodes (last call {} s, timeout {} s)",
                 c.rdzv_id, c.rdzv_host, c.rdzv_port, rules.min_nodes, rules.max_nodes, rules.last_call_s,
                 rules.timeout_s);
    const ElasticMembership m = rendezvous.next_round(after_round, expected);
    const NodeAssignment& node = m.node;
    spdlog::info("round {}: starting {} workers (ranks {}..{} of {}) on node {} of {}, master {}:{}, run id {}",
                 m.round, local.nproc, global_rank(node, 0), global_rank(node, local.nproc - 1),
                 node.nnodes * local.nproc, node.node_rank, node.nnodes, node.master_addr, node.master_port,
                 node.run_id);
    // The round's job channel relays failures and losses (See Note [Coordinated restarts]); its
    // rounds never restart: a new membership round does.
    NodeAssignment channel_node = node;
    channel_node.max_restarts = 0;
    std::unique_ptr<JobChannel> channel = open_job_channel(c, channel_node, local.nproc, base.host_name);
    const bool restarts_left = m.round < c.max_restarts;
    NewcomerWatch newcomers(rendezvous, rules, m, restarts_left);
    SupervisorOptions options = base;
    options.max_restarts = 0;
    options.link = channel ? channel->link() : nullptr;
    options.membership_change = [&] { return newcomers.poll(); };
    const GroupFactory make_group = [&](int) { return prepare_attempt(c, node, local, run, m.round); };
    SupervisorResult result = supervise(options, make_group);
    result.attempts = m.round + 1;
    const bool changed = newcomers.waiting() > 0 || result.stopped_by.has_value();
    if (channel) channel->set_job_succeeded(result.exit_code == 0 && !changed);
    const int lost = channel ? channel->link()->lost_nodes() : 0;
    channel.reset();
    const std::string why = result.stopped_by ? *result.stopped_by
                            : newcomers.waiting() > 0 ? newcomers.reason()
                                                      : std::string("this node's group failed");
    if ((result.exit_code == 0 && !changed) || result.launcher_signal) return result;
    if (result.exit_code == 0) result.exit_code = 1;
    if (!restarts_left) {
      spdlog::error("round {} ended ({}), and --max_restarts {} is used up: ending", m.round, why, c.max_restarts);
      return result;
    }
    expected = rdzv::expected_next_round(rules, node.nnodes, lost, newcomers.waiting());
    spdlog::warn("round {} ended ({}): joining round {} with the nodes that remain, restart {} of {}", m.round, why,
                 m.round + 1, m.round + 1, c.max_restarts);
    after_round = m.round;
  }
}

}  // namespace ddp::launcher
