#pragma once
// Elastic rendezvous rounds (--nnodes MIN:MAX): when a round closes and who is in it. Pure functions,
// torch-free: the rendezvous plugin drives them against the store, the unit tests without processes.
// See Note [Elastic rounds] in launcher/rendezvous/rounds.cpp.
#include <string>
#include <vector>

namespace ddp::launcher::rendezvous {

// The job's rules for every round.
struct RoundRules {
  int min_nodes = 1;
  int max_nodes = 1;
  double last_call_s = 3;  // --rdzv_conf last_call_timeout
  double timeout_s = 600;  // --rdzv_timeout: how long one node waits for a round to close
};

// What one waiting node sees of the round it joined.
struct RoundView {
  int joined = 0;               // valid claims in the round, this node's included
  int expected = 0;             // the nodes this node expects (the last round's survivors and the
                                // waiting newcomers); 0: none known (the job's first round)
  double since_last_join_s = 0;  // since `joined` last changed
  double waited_s = 0;           // since this node started waiting
  // This node arrives while a job runs (it joins round R > 0 and was in no round before): it never
  // closes the round itself; the running job's members do, when they admit it.
  bool joins_running_job = false;
};

enum class RoundStep {
  kWait,      // keep waiting
  kClose,     // close the round with the nodes that joined
  kTimedOut,  // fewer than min_nodes joined (or, joining a running job, not admitted) within the timeout
};

// A round closes when max_nodes joined, or when at least min_nodes joined and either every expected
// node is there or none arrived within the last call; below min_nodes it times out. A node joining
// a running job only waits (bounded by the timeout) for the members to close it.
RoundStep decide_round(const RoundRules& rules, const RoundView& view);

// A closed round's node rank of the node that claimed `slot`: its place among `member_slots` (sorted
// ascending), or -1 when it is not a member (it claimed after the round was closed).
int node_rank_in(const std::vector<int>& member_slots, int slot);

// Whether the members of a running round of `current_nodes` restart into the next one for
// `waiting_nodes` newcomers (scale-up): only when the job is below max_nodes and restarts are left.
bool admits_newcomers(const RoundRules& rules, int current_nodes, int waiting_nodes, bool restarts_left);

// The node count the next round expects after a round of `current_nodes` ended: without the nodes
// the job channel reported lost, with the newcomers waiting, at most max_nodes.
int expected_next_round(const RoundRules& rules, int current_nodes, int lost_nodes, int waiting_nodes);

// --recovery live: whether the members, training, admit `waiting_nodes` newcomers into the next
// rendezvous round, counting the nodes the training has now (the round's `round_nodes` less the
// `lost_nodes` the liveness channel reported since: See Note [Lost hosts in a live job]), and the
// node count that round expects (closing it without the last call). Restarts are not spent.
struct LiveAdmissionStep {
  bool admit = false;
  int current_nodes = 0;
  int expected_nodes = 0;  // when admitting
};
LiveAdmissionStep decide_live_admission(const RoundRules& rules, int round_nodes, int lost_nodes, int waiting_nodes);

// The "closed" record's member list: "0,1,3" <-> {0, 1, 3}; parse returns false for anything else
// (unsorted, repeated, negative, or over max_nodes entries).
std::string format_members(const std::vector<int>& member_slots);
bool parse_members(const std::string& text, int max_nodes, std::vector<int>& member_slots);

}  // namespace ddp::launcher::rdzv
