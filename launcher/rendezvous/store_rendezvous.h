#pragma once
// The c10d-store rendezvous (--rdzv_endpoint): ddp_launch's side of it. It loads
// libddp_launch_rdzv.so (only then: the launcher's common path never loads LibTorch), binds the
// endpoint when this node can serve it, and joins the store's rounds: one for a fixed --nnodes N
// (MIN = MAX = N), a sequence for --nnodes MIN:MAX. See Note [Dynamic rendezvous] in
// launcher/rendezvous/plugin/plugin.cpp and Note [Elastic rounds] in launcher/rendezvous/rounds.cpp.
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "launcher/config/config.h"
#include "launcher/rendezvous/plugin/plugin_api.h"
#include "launcher/rendezvous/rendezvous.h"
#include "launcher/rendezvous/rounds.h"

namespace ddp::launcher::rendezvous {

// The job's rules, from the flags: MIN = MAX = --nnodes for a fixed-size job.
RoundRules round_rules(const config::LaunchConfig& config);

// Where this node stands towards the store: the address it advertises if it gets node rank 0, and
// the endpoint's socket, bound and listening, when this node serves the store (-1: a client).
struct StoreEndpoint {
  std::string advertise;
  int listen_fd = -1;
};
StoreEndpoint open_store_endpoint(const config::LaunchConfig& config);

// The rendezvous plugin, loaded once, and the store handle it gave. Each call throws
// ddp::TimeoutError with the plugin's one line when it fails.
class PluginStore : public EndpointDirectory {
 public:
  explicit PluginStore(const ddp_rdzv_request& request);  // loads the plugin, opens the store
  ~PluginStore() override;  // ddp_rdzv_release: a serving node first waits (bounded) for the others
  PluginStore(const PluginStore&) = delete;
  PluginStore& operator=(const PluginStore&) = delete;

  ddp_rdzv_round_result round(const ddp_rdzv_round_request& request);
  // See ddp_rdzv_waiting_fn and ddp_rdzv_mark_gone_fn.
  int waiting(int round);
  int mark_gone(const std::string& prefix, const std::string& node_key, int first_round_workers);

  void publish(const std::string& name, const Endpoint& endpoint) override;
  Endpoint lookup(const std::string& name, double timeout_s) override;

 private:
  void* handle_ = nullptr;
  ddp_rdzv_round_fn round_ = nullptr;
  ddp_rdzv_waiting_fn waiting_ = nullptr;
  ddp_rdzv_release_fn release_ = nullptr;
  ddp_rdzv_mark_gone_fn mark_gone_ = nullptr;
  ddp_rdzv_publish_fn publish_ = nullptr;
  ddp_rdzv_lookup_fn lookup_ = nullptr;
};

class StoreRendezvous : public RendezvousHandler {
 public:
  StoreRendezvous(const config::LaunchConfig& config, int nproc_per_node);
  ~StoreRendezvous() override;
  StoreRendezvous(const StoreRendezvous&) = delete;
  StoreRendezvous& operator=(const StoreRendezvous&) = delete;

  RendezvousRound next_rendezvous(int after_round, int expected_nodes) override;
  int num_nodes_waiting(int round) override;
  EndpointDirectory* directory() override;  // opens the store
  void shutdown() override { store_.reset(); }
  // --recovery live: the workers of node `node_key` (or the one worker "<node key>/local<L>") are
  // gone from the training's membership under `prefix`, each marked once per round whoever says it
  // (See Note [Marking a lost node gone] in ddp/elastic/detail/membership_keys.h): how many were
  // marked (> 0), 0 none of them is in the training, -2 another launcher marked them first, -1 the
  // store is unreachable. Safe from another thread (c10d's TCPStore serialises its requests).
  int mark_node_gone(const std::string& prefix, const std::string& node_key, int first_round_workers);
  // Opens the store (serving it when the endpoint is this node's) and says whether this node serves it.
  bool serves_store();
  // Where the store listens when this node serves it (numeric, "0.0.0.0" for every interface).
  const std::string& served_address();

 private:
  void open();

  const config::LaunchConfig& config_;
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
  std::optional<std::chrono::steady_clock::time_point> failing_since_;
  bool store_lost_ = false;
};

}  // namespace ddp::launcher::rendezvous
