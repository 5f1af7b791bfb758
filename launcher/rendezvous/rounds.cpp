#include "launcher/rendezvous/rounds.h"

#include <algorithm>

#include "ddp/base/str.h"

namespace ddp::launcher::rendezvous {

// Note [Elastic rounds]
// ~~~~~~~~~~~~~~~~~~~~~
// With --rdzv_endpoint, membership is a sequence of rounds in the c10d store (keys
// ddp_rdzv/<id>/r<R>/..., each value proved with the job's token as in Note [Rendezvous token]);
// the store is served by the endpoint's node, so that node must stay (as with torchrun's c10d
// backend). --nnodes MIN:MAX makes it elastic; a fixed --nnodes N is MIN = MAX = N, one round (See
// Note [Dynamic rendezvous] in launcher/rendezvous/plugin/plugin.cpp). Round R:
// - Join: a launcher skips every round that has a launcher's "closed" record and claims the first
//   slot of the first open one that holds no launcher's claim (compareSet, slots 0..MAX-1); while
//   the round is open it puts its claim back if a foreign write replaced it.
// - Close (decide_round): at MAX claims; or at >= MIN claims when every node the waiting launcher
//   expects has come (a re-rendezvous knows its survivors: the last round's nodes less those the
//   job channel reported lost, plus the newcomers it saw waiting) or when no claim arrived for the
//   last-call window (--rdzv_conf last_call_timeout, default 3 s: short, because a node that comes
//   later is not lost, it triggers the next round). Whichever waiting launcher decides first
//   writes "closed <slots> <proof>" with compareSet, so exactly one member list wins; every
//   launcher reads it: node rank = the place of its slot in the list, WORLD_SIZE = members x nproc.
//   A launcher whose claim came after the close is not a member and joins round R+1.
// - Master: the round's node 0 publishes its address and a fresh port for its workers' store; the
//   others wait for it. (The job channel's port is the OS's pick, published apart: See Note [One
//   port per job] in launcher/rendezvous/rendezvous.h.)
// - Below MIN, a launcher waits --rdzv_timeout, marks its slot "left" and stops with one line
//   naming how many nodes came and MIN.
// - Membership changes (launcher/agent/elastic_rounds.cpp): a lost host (the job channel's `lost`, or
//   the coordinator gone) or a failed group stops every member's workers and they join round R+1;
//   while a round runs, every member polls round R+1 for claims (admits_newcomers): a newcomer's
//   claim makes the members stop and join it, as torchrun's agents do on num_nodes_waiting(). At
//   MAX the newcomer waits (it is told so) until a place frees or its --rdzv_timeout ends. A
//   newcomer never closes a round of a running job itself (with MIN 1 it would start a job of its
//   own beside the running one): the members close it when they admit it. Each
//   new round is a restart: TORCHELASTIC_RESTART_COUNT is the round number R, the same for every
//   member, and the job ends when a change would need round max_restarts + 1.
// The rounds are the only thing the membership needs from the store: the next issue's in-place
// recovery reuses them unchanged (a round is the membership; what a member does with it is not
// the round's business).

RoundStep decide_round(const RoundRules& rules, const RoundView& view) {
  if (view.joins_running_job) return view.waited_s >= rules.timeout_s ? RoundStep::kTimedOut : RoundStep::kWait;
  if (view.joined >= rules.max_nodes) return RoundStep::kClose;
  if (view.joined >= rules.min_nodes) {
    if (view.expected > 0 && view.joined >= view.expected) return RoundStep::kClose;
    if (view.since_last_join_s >= rules.last_call_s) return RoundStep::kClose;
  }
  if (view.waited_s >= rules.timeout_s && view.joined < rules.min_nodes) return RoundStep::kTimedOut;
  return RoundStep::kWait;
}

int node_rank_in(const std::vector<int>& member_slots, int slot) {
  const auto it = std::find(member_slots.begin(), member_slots.end(), slot);
  return it == member_slots.end() ? -1 : static_cast<int>(it - member_slots.begin());
}

bool admits_newcomers(const RoundRules& rules, int current_nodes, int waiting_nodes, bool restarts_left) {
  return waiting_nodes > 0 && current_nodes < rules.max_nodes && restarts_left;
}

int expected_next_round(const RoundRules& rules, int current_nodes, int lost_nodes, int waiting_nodes) {
  return std::min(rules.max_nodes, std::max(0, current_nodes - lost_nodes) + std::max(0, waiting_nodes));
}

LiveAdmissionStep decide_live_admission(const RoundRules& rules, int round_nodes, int lost_nodes, int waiting_nodes) {
  LiveAdmissionStep step;
  step.current_nodes = std::max(0, round_nodes - std::max(0, lost_nodes));
  step.admit = admits_newcomers(rules, step.current_nodes, waiting_nodes, true);
  if (step.admit) step.expected_nodes = expected_next_round(rules, round_nodes, lost_nodes, waiting_nodes);
  return step;
}

std::string format_members(const std::vector<int>& member_slots) { return ddp::join(member_slots, ","); }

bool parse_members(const std::string& text, int max_nodes, std::vector<int>& member_slots) {
  member_slots.clear();
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(begin, end - begin);
    // Canonical numbers only ("01" is not 1): a list reads back as format_members wrote it.
    if (item.empty() || item.size() > 7 || item.find_first_not_of("0123456789") != std::string::npos ||
        (item.size() > 1 && item[0] == '0')) {
      return false;
    }
    const int slot = std::stoi(item);
    if (slot >= max_nodes || (!member_slots.empty() && slot <= member_slots.back())) return false;
    member_slots.push_back(slot);
    if (static_cast<int>(member_slots.size()) > max_nodes) return false;
    begin = end + 1;
  }
  return !member_slots.empty();
}

}  // namespace ddp::launcher::rdzv
