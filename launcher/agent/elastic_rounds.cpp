#include "launcher/agent/elastic_rounds.h"

#include <algorithm>
#include <memory>
#include <spdlog/spdlog.h>

#include "ddp/base/str.h"
#include "launcher/rendezvous/store_rendezvous.h"
#include "launcher/rendezvous/rendezvous.h"
#include "launcher/channel/job_channel.h"
#include "launcher/channel/job_link.h"

// Note [Newcomers another member saw]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The next round closes as soon as every node it expects has claimed a slot (Note [Elastic rounds]):
// the members that remain and the newcomers. A member whose round was stopped from elsewhere (the
// job channel's stop: another member saw the newcomers and stopped, or failed) did not see them
// itself. Counting none, it expected the old member count only, and closed the round once that many
// had claimed: the newcomer and itself, without the member that saw the newcomer and was slower to
// re-join (hosts.elastic_up under load: host0 skipped round 1, joined round 2, a second restart
// spent). It counts them now, as every claim of the next round at this moment: the newcomers and
// any member that re-joined already. That bound is high, never low: the round may wait out its last
// call, but never closes without a member.

namespace ddp::launcher::agent {
namespace {

// While a round runs: whether newcomers wait for the next one and the job admits them (polled by
// the attempt at most every 250 ms, one small store query each).
class NewcomerWatch {
 public:
  NewcomerWatch(rendezvous::RendezvousHandler& rendezvous, const rendezvous::RoundRules& rules,
                const rendezvous::RendezvousRound& m, bool restarts_left)
      : poll_(rendezvous, "no newcomer can be admitted into this round"),
        rules_(rules),
        m_(m),
        restarts_left_(restarts_left) {}

  std::optional<std::string> poll() {
    const int waiting = poll_.waiting_after(m_.round);
    if (waiting == 0) return std::nullopt;
    if (rendezvous::admits_newcomers(rules_, m_.node.nnodes, waiting, restarts_left_)) {
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
  rendezvous::NewcomerPoll poll_;
  const rendezvous::RoundRules& rules_;
  const rendezvous::RendezvousRound& m_;
  bool restarts_left_;
  int waiting_ = 0;
  std::string reason_;
  bool told_ = false;
};

class ElasticRounds : public PolicyWithContext {
 public:
  explicit ElasticRounds(const AgentContext& context)
      : PolicyWithContext(context),
        rules_(rendezvous::round_rules(context.config)),
        rendezvous_(rendezvous::make_rendezvous_handler(context.config, context.local.nproc)) {}

  AgentRound next_round() override {
    spdlog::info("rendezvous '{}' at {}:{}: joining a round of {} to {} nodes (last call {} s, timeout {} s)",
                 config_.rdzv_id, config_.rdzv_host, config_.rdzv_port, rules_.min_nodes, rules_.max_nodes,
                 rules_.last_call_s, rules_.timeout_s);
    membership_ = rendezvous_->next_rendezvous(after_round_, expected_);
    AgentRound round;
    round.number = membership_.round;
    round.elastic = true;
    round.node = membership_.node;
    // The round's job channel relays failures and losses (See Note [Coordinated restarts]); its
    // rounds never restart: a new membership round does.
    rendezvous::NodeAssignment channel_node = round.node;
    channel_node.max_restarts = 0;
    round.channel = channel::open_job_channel(config_, channel_node, local_.nproc, host_name_, rendezvous_->directory(),
                                     ddp::str("job_channel/r", round.number));
    return round;
  }

  GroupFactory supervise_round(const AgentRound& round, SupervisorOptions& options) override {
    newcomers_ = std::make_unique<NewcomerWatch>(*rendezvous_, rules_, membership_, restarts_left());
    options.max_restarts = 0;
    options.membership_change = [this] { return newcomers_->poll(); };
    return [this, node = round.node, number = round.number](int) {
      return prepare_attempt(config_, node, local_, run_, number);
    };
  }

  bool next_round_follows(AgentRound& round, SupervisorResult& result) override {
    const NewcomerWatch& newcomers = *newcomers_;
    result.attempts = round.number + 1;
    if (result.replaced && !result.launcher_signal) {  // See Note [Replacing a straggler] in launcher/agent/attempt.cpp
      if (round.channel) round.channel->set_job_succeeded(false);
      spdlog::warn("{}: the other nodes go on without it; exiting 0", *result.replaced);
      result.exit_code = 0;
      return false;
    }
    const bool changed = newcomers.waiting() > 0 || result.stopped_by.has_value();
    if (round.channel) round.channel->set_job_succeeded(result.exit_code == 0 && !changed);
    const int lost = round.channel ? round.channel->link()->lost_nodes() : 0;
    round.channel.reset();
    const std::string why = result.stopped_by       ? *result.stopped_by
                            : newcomers.waiting() > 0 ? newcomers.reason()
                                                      : std::string("this node's group failed");
    if ((result.exit_code == 0 && !changed) || result.launcher_signal) return false;
    if (result.exit_code == 0) result.exit_code = 1;
    if (!restarts_left()) {
      spdlog::error("round {} ended ({}), and --max_restarts {} is used up: ending", round.number, why,
                    config_.max_restarts);
      return false;
    }
    // See Note [Newcomers another member saw].
    int waiting = newcomers.waiting();
    if (waiting == 0 && result.stopped_by) waiting = std::max(0, rendezvous_->num_nodes_waiting(round.number));
    expected_ = rendezvous::expected_next_round(rules_, round.node.nnodes, lost, waiting);
    spdlog::warn("round {} ended ({}): joining round {} with the nodes that remain, restart {} of {}", round.number,
                 why, round.number + 1, round.number + 1, config_.max_restarts);
    after_round_ = round.number;
    return true;
  }

  rendezvous::RendezvousHandler& rendezvous() override { return *rendezvous_; }

 private:
  bool restarts_left() const { return membership_.round < config_.max_restarts; }

  rendezvous::RoundRules rules_;
  std::unique_ptr<rendezvous::RendezvousHandler> rendezvous_;
  rendezvous::RendezvousRound membership_;
  std::unique_ptr<NewcomerWatch> newcomers_;
  int after_round_ = -1;
  int expected_ = 0;
};

}  // namespace

std::unique_ptr<RecoveryPolicy> make_elastic_rounds(const AgentContext& context) {
  return std::make_unique<ElasticRounds>(context);
}

}  // namespace ddp::launcher::agent
