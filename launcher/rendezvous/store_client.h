#pragma once
// The c10d-store rendezvous (--rdzv_endpoint): ddp_launch's side of it. It loads
// libddp_launch_rdzv.so (only then: the launcher's common path never loads LibTorch), binds the
// endpoint when this node can serve it, and asks the plugin for this node's assignment.
// See Note [Dynamic rendezvous] in rdzv_plugin.cpp.
#include <memory>
#include <string>

#include "launcher/rendezvous/plugin/plugin_api.h"
#include "launcher/rendezvous/rendezvous.h"

namespace ddp::launcher {

// Where this node stands towards the store: the address it advertises if it gets node rank 0, and
// the endpoint's socket, bound and listening, when this node serves the store (-1: a client).
struct StoreEndpoint {
  std::string advertise;
  int listen_fd = -1;
};
StoreEndpoint open_store_endpoint(const LaunchConfig& config);

// The rendezvous plugin, loaded once, and the store handle it gave: every call of the fixed and
// the elastic rendezvous goes through it. Each call throws ddp::TimeoutError with the plugin's
// one line when it fails.
class PluginStore : public EndpointDirectory {
 public:
  PluginStore();
  ~PluginStore() override;  // ddp_rdzv_release: a serving node first waits (bounded) for the others
  PluginStore(const PluginStore&) = delete;
  PluginStore& operator=(const PluginStore&) = delete;

  bool is_open() const { return handle_ != nullptr; }
  // A fixed-size job's one round (ddp_rdzv_join); opens the store.
  ddp_rdzv_result join(const ddp_rdzv_request& request);
  // An elastic job's store (ddp_rdzv_open), then its rounds.
  void open(const ddp_rdzv_request& request);
  ddp_rdzv_round_result round(const ddp_rdzv_round_request& request);
  // See ddp_rdzv_waiting_fn and ddp_rdzv_mark_gone_fn; -1 while the store is not open.
  int waiting(int round);
  int mark_gone(const std::string& prefix, const std::string& node_key, int first_round_workers);

  void publish(const std::string& name, const Endpoint& endpoint) override;
  Endpoint lookup(const std::string& name, double timeout_s) override;

 private:
  void* handle_ = nullptr;
  ddp_rdzv_join_fn join_ = nullptr;
  ddp_rdzv_open_fn open_ = nullptr;
  ddp_rdzv_round_fn round_ = nullptr;
  ddp_rdzv_waiting_fn waiting_ = nullptr;
  ddp_rdzv_release_fn release_ = nullptr;
  ddp_rdzv_mark_gone_fn mark_gone_ = nullptr;
  ddp_rdzv_publish_fn publish_ = nullptr;
  ddp_rdzv_lookup_fn lookup_ = nullptr;
};

std::unique_ptr<RendezvousHandler> make_store_rendezvous(const LaunchConfig& config, int nproc_per_node);

}  // namespace ddp::launcher
