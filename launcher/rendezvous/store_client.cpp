#include "launcher/rendezvous/store_client.h"

#include "ddp/base/error.h"
#include "ddp/base/detail/route.h"
#include "launcher/channel/net.h"
#include "launcher/process/plugin_loader.h"

#ifndef DDP_RDZV_PLUGIN_NAME
#define DDP_RDZV_PLUGIN_NAME "libddp_launch_rdzv.so"
#endif

namespace ddp::launcher {
namespace {

class StoreRendezvous : public RendezvousHandler {
 public:
  StoreRendezvous(const LaunchConfig& config, int nproc)
      : config_(config), node_(assignment_from_flags(config, nproc)) {}

  RendezvousRound next_rendezvous(int, int) override {
    const StoreEndpoint endpoint = open_store_endpoint(config_);
    const int port = pick_free_port(endpoint.advertise);
    ddp_rdzv_request req{config_.rdzv_host.c_str(), config_.rdzv_port, config_.rdzv_id.c_str(), config_.nnodes,
                         endpoint.listen_fd, endpoint.advertise.c_str(), port, config_.rdzv_timeout_s, config_.rdzv_token.c_str(),
                         config_.keep_c10_logs ? 0 : 1};
    store_ = std::make_unique<PluginStore>();  // loaded here, never for a dry run
    const ddp_rdzv_result result = store_->join(req);
    node_.node_rank = result.node_rank;
    node_.master_addr = result.master_addr;
    node_.master_port = result.master_port;
    return {0, node_};
  }
  int num_nodes_waiting(int) override { return 0; }
  EndpointDirectory* directory() override { return store_.get(); }
  void shutdown() override { store_.reset(); }

 private:
  const LaunchConfig& config_;
  NodeAssignment node_;
  std::unique_ptr<PluginStore> store_;
};

}  // namespace

PluginStore::PluginStore() {
  SharedLibrary plugin = SharedLibrary::load_plugin(DDP_RDZV_PLUGIN_NAME, "--rdzv_endpoint");
  plugin.keep_loaded();  // LibTorch does not support being unloaded
  join_ = plugin.symbol<ddp_rdzv_join_fn>(DDP_RDZV_JOIN_SYMBOL);
  open_ = plugin.symbol<ddp_rdzv_open_fn>(DDP_RDZV_OPEN_SYMBOL);
  round_ = plugin.symbol<ddp_rdzv_round_fn>(DDP_RDZV_ROUND_SYMBOL);
  waiting_ = plugin.symbol<ddp_rdzv_waiting_fn>(DDP_RDZV_WAITING_SYMBOL);
  release_ = plugin.symbol<ddp_rdzv_release_fn>(DDP_RDZV_RELEASE_SYMBOL);
  mark_gone_ = plugin.symbol<ddp_rdzv_mark_gone_fn>(DDP_RDZV_MARK_GONE_SYMBOL);
  publish_ = plugin.symbol<ddp_rdzv_publish_fn>(DDP_RDZV_PUBLISH_SYMBOL);
  lookup_ = plugin.symbol<ddp_rdzv_lookup_fn>(DDP_RDZV_LOOKUP_SYMBOL);
}

PluginStore::~PluginStore() {
  if (handle_ != nullptr) release_(handle_);
}

ddp_rdzv_result PluginStore::join(const ddp_rdzv_request& request) {
  ddp_rdzv_result result{};
  handle_ = join_(&request, &result);
  if (handle_ == nullptr) throw ddp::TimeoutError(result.error);
  return result;
}

void PluginStore::open(const ddp_rdzv_request& request) {
  ddp_rdzv_result result{};
  handle_ = open_(&request, &result);
  if (handle_ == nullptr) throw ddp::TimeoutError(result.error);
}

ddp_rdzv_round_result PluginStore::round(const ddp_rdzv_round_request& request) {
  ddp_rdzv_round_result result{};
  if (round_(handle_, &request, &result) != 0) throw ddp::TimeoutError(result.error);
  return result;
}

int PluginStore::waiting(int round) { return handle_ == nullptr ? -1 : waiting_(handle_, round); }

int PluginStore::mark_gone(const std::string& prefix, const std::string& node_key, int first_round_workers) {
  return handle_ == nullptr ? -1 : mark_gone_(handle_, prefix.c_str(), node_key.c_str(), first_round_workers);
}

void PluginStore::publish(const std::string& name, const Endpoint& endpoint) {
  ddp_rdzv_endpoint out{};
  if (publish_(handle_, name.c_str(), endpoint.addr.c_str(), endpoint.port, &out) != 0) {
    throw ddp::TimeoutError(out.error);
  }
}

Endpoint PluginStore::lookup(const std::string& name, double timeout_s) {
  ddp_rdzv_endpoint out{};
  if (lookup_(handle_, name.c_str(), timeout_s, &out) != 0) throw ddp::TimeoutError(out.error);
  return {out.addr, out.port};
}

StoreEndpoint open_store_endpoint(const LaunchConfig& config) {
  // Advertise, as rank 0's node, the address that routes to the endpoint, and serve the store when
  // the endpoint is ours: bound here to exactly its address, or to every interface when it is this
  // host's Debian name (See Note [Advertised address] in ddp/base/detail/route.h and Note [Dynamic
  // rendezvous]); the store owns the socket from then on.
  const detail::RouteFacts route = detail::look_up_route(config.rdzv_host);
  detail::AdvertiseOptions options;
  options.peers_on_other_hosts = config.nnodes > 1;
  options.master_name = "--rdzv_endpoint host";
  options.remedy = "give --rdzv_endpoint as an address of the serving node that the other nodes reach";
  StoreEndpoint endpoint;
  // --local_addr (torchrun's) names the address this node advertises; otherwise the route decides.
  endpoint.advertise = config.local_addr;
  if (endpoint.advertise.empty()) {
    try {
      endpoint.advertise = detail::choose_advertised_address(route, options).address;
    } catch (const ddp::Error& error) {
      throw ddp::UsageError(error.what());
    }
  }
  const std::string listen_address = detail::store_listen_address(route, options.peers_on_other_hosts);
  endpoint.listen_fd = listen_address == route.master_address ? listen_on(config.rdzv_host, config.rdzv_port)
                                                              : detail::listen_on_address(listen_address, config.rdzv_port);
  return endpoint;
}

std::unique_ptr<RendezvousHandler> make_store_rendezvous(const LaunchConfig& config, int nproc_per_node) {
  return std::make_unique<StoreRendezvous>(config, nproc_per_node);
}

}  // namespace ddp::launcher
