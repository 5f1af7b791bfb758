#pragma once
// The launcher's side of the elastic rounds (--nnodes MIN:MAX): join the next round, learn its
// membership, and ask whether newcomers wait for the one after. The store work is in the plugin
// (libddp_launch_rdzv.so, loaded only here: the launcher's common path never loads LibTorch).
// See Note [Elastic rounds] in launcher/rdzv_rounds.cpp.
#include <string>

#include "launcher/config.h"
#include "launcher/rdzv_plugin_api.h"
#include "launcher/rdzv_rounds.h"
#include "launcher/worker_env.h"

namespace ddp::launcher {

// One closed round, as this node sees it.
struct ElasticMembership {
  int round = 0;        // the job's round number: TORCHELASTIC_RESTART_COUNT of its workers
  NodeAssignment node;  // node rank, nnodes (the round's members), master of the round
};

// The job's rules, from the flags.
rdzv::RoundRules round_rules(const LaunchConfig& config);

class ElasticRendezvous {
 public:
  ElasticRendezvous(const LaunchConfig& config, int nproc_per_node);
  ~ElasticRendezvous();
  ElasticRendezvous(const ElasticRendezvous&) = delete;
  ElasticRendezvous& operator=(const ElasticRendezvous&) = delete;

  // Joins the first open round after `after_round` (-1: the job's first open round) and waits,
  // bounded by --rdzv_timeout, until it closes; `expected_nodes` (0: unknown) lets it close without
  // the last call. Throws ddp::TimeoutError with one line (below MIN: how many came, and MIN).
  ElasticMembership next_round(int after_round, int expected_nodes);
  // How many launchers wait to join the round after `round` (-1: the store is unreachable).
  int waiting_after(int round);
  // --recovery live: `count` workers of this node are gone from the training's membership under
  // `prefix` (1 marked, 0 no training round closed yet, -1 the store is unreachable).
  int mark_workers_gone(const std::string& prefix, int count);

 private:
  void open();

  const LaunchConfig& config_;
  int nproc_;
  void* handle_ = nullptr;
  std::string advertise_;
  ddp_rdzv_round_fn round_ = nullptr;
  ddp_rdzv_waiting_fn waiting_ = nullptr;
  ddp_rdzv_release_fn release_ = nullptr;
  ddp_rdzv_mark_gone_fn mark_gone_ = nullptr;
};

}  // namespace ddp::launcher
