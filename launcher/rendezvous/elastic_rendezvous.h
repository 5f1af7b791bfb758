#pragma once
// The launcher's side of the elastic rounds (--nnodes MIN:MAX): join the next round, learn its
// membership, and ask whether newcomers wait for the one after. The store work is in the plugin
// (libddp_launch_rdzv.so, loaded only here: the launcher's common path never loads LibTorch).
// See Note [Elastic rounds] in launcher/rendezvous/rounds.cpp.
#include <chrono>
#include <memory>
#include <string>

#include "launcher/config/config.h"
#include "launcher/rendezvous/rendezvous.h"
#include "launcher/rendezvous/store_client.h"
#include "launcher/rendezvous/rounds.h"
#include "launcher/agent/worker_variables.h"

namespace ddp::launcher {

// The job's rules, from the flags.
rdzv::RoundRules round_rules(const LaunchConfig& config);

class ElasticRendezvous : public RendezvousHandler {
 public:
  ElasticRendezvous(const LaunchConfig& config, int nproc_per_node);
  ~ElasticRendezvous() override;
  ElasticRendezvous(const ElasticRendezvous&) = delete;
  ElasticRendezvous& operator=(const ElasticRendezvous&) = delete;

  RendezvousRound next_rendezvous(int after_round, int expected_nodes) override;
  int num_nodes_waiting(int round) override;
  EndpointDirectory* directory() override;  // opens the store
  void shutdown() override { store_.reset(); }
  // --recovery live: the workers of node `node_key` (or the one worker "<node key>/local<L>") are
  // gone from the training's membership under `prefix`, each marked once per round whoever says it (See Note [Marking a lost node gone]
  // in ddp/elastic/detail/membership_keys.h): how many were marked (> 0), 0 none of them is in the training, -2
  // another launcher marked them first, -1 the store is unreachable. Safe from another thread
  // (c10d's TCPStore serialises its requests).
  int mark_node_gone(const std::string& prefix, const std::string& node_key, int first_round_workers);
  // Opens the store (serving it when the endpoint is this node's) and says whether this node serves it.
  bool serves_store();
  // Where the store listens when this node serves it (numeric, "0.0.0.0" for every interface).
  const std::string& served_address();

 private:
  void open();

  const LaunchConfig& config_;
  int nproc_;
  std::unique_ptr<PluginStore> store_;
  std::string advertise_;
  bool serves_ = false;
  std::string served_address_;
};

// How many launchers wait to join the round after a given one, as an attempt's loop polls it: at
// most every 250 ms (one small store query), 0 in between and for good once the store did not
// answer (each query is bounded by --rdzv_timeout: the group's supervision is not blocked again),
// which is said once with `what_is_lost`.
class NewcomerPoll {
 public:
  NewcomerPoll(RendezvousHandler& rendezvous, std::string what_is_lost)
      : rendezvous_(rendezvous), what_is_lost_(std::move(what_is_lost)) {}
  int waiting_after(int round);

 private:
  RendezvousHandler& rendezvous_;
  std::string what_is_lost_;
  std::chrono::steady_clock::time_point last_poll_{};
  bool store_lost_ = false;
};

}  // namespace ddp::launcher
