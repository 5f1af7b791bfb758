#include "launcher/rendezvous/store_rendezvous.h"

#include <spdlog/spdlog.h>

#include "ddp/base/detail/route.h"
#include "ddp/base/error.h"
#include "launcher/process/net.h"
#include "launcher/process/plugin_loader.h"

#ifndef DDP_RDZV_PLUGIN_NAME
#define DDP_RDZV_PLUGIN_NAME "libddp_launch_rdzv.so"
#endif

namespace ddp::launcher::rendezvous {
namespace {

void log_note(const char* line) { spdlog::info("{}", line); }

}  // namespace

RoundRules round_rules(const config::LaunchConfig& config) {
  // min_nodes, max_nodes, last_call_s, timeout_s
  return {config.elastic ? config.min_nnodes : config.nnodes, config.nnodes, config.rdzv_last_call_s, config.rdzv_timeout_s};
}

StoreEndpoint open_store_endpoint(const config::LaunchConfig& config) {
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
  endpoint.listen_fd = listen_address == route.master_address ? process::listen_on(config.rdzv_host, config.rdzv_port)
                                                              : detail::listen_on_address(listen_address, config.rdzv_port);
  return endpoint;
}

PluginStore::PluginStore(const ddp_rdzv_request& request) {
  process::SharedLibrary plugin = process::SharedLibrary::load_plugin(DDP_RDZV_PLUGIN_NAME, "--rdzv_endpoint");
  plugin.keep_loaded();  // LibTorch does not support being unloaded
  const auto open = plugin.symbol<ddp_rdzv_open_fn>(DDP_RDZV_OPEN_SYMBOL);
  round_ = plugin.symbol<ddp_rdzv_round_fn>(DDP_RDZV_ROUND_SYMBOL);
  waiting_ = plugin.symbol<ddp_rdzv_waiting_fn>(DDP_RDZV_WAITING_SYMBOL);
  release_ = plugin.symbol<ddp_rdzv_release_fn>(DDP_RDZV_RELEASE_SYMBOL);
  mark_gone_ = plugin.symbol<ddp_rdzv_mark_gone_fn>(DDP_RDZV_MARK_GONE_SYMBOL);
  publish_ = plugin.symbol<ddp_rdzv_publish_fn>(DDP_RDZV_PUBLISH_SYMBOL);
  lookup_ = plugin.symbol<ddp_rdzv_lookup_fn>(DDP_RDZV_LOOKUP_SYMBOL);
  ddp_rdzv_result result{};
  handle_ = open(&request, &result);
  if (handle_ == nullptr) throw ddp::TimeoutError(result.error);
}

PluginStore::~PluginStore() { release_(handle_); }

ddp_rdzv_round_result PluginStore::round(const ddp_rdzv_round_request& request) {
  ddp_rdzv_round_result result{};
  if (round_(handle_, &request, &result) != 0) throw ddp::TimeoutError(result.error);
  return result;
}

int PluginStore::waiting(int round) { return waiting_(handle_, round); }

int PluginStore::mark_gone(const std::string& prefix, const std::string& node_key, int first_round_workers) {
  return mark_gone_(handle_, prefix.c_str(), node_key.c_str(), first_round_workers);
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

StoreRendezvous::StoreRendezvous(const config::LaunchConfig& config, int nproc_per_node)
    : config_(config), nproc_(nproc_per_node) {}

StoreRendezvous::~StoreRendezvous() = default;

void StoreRendezvous::open() {
  const StoreEndpoint endpoint = open_store_endpoint(config_);
  advertise_ = endpoint.advertise;
  serves_ = endpoint.listen_fd >= 0;
  if (serves_) served_address_ = process::socket_address(endpoint.listen_fd, false);
  const ddp_rdzv_request req{config_.rdzv_host.c_str(), config_.rdzv_port,       config_.rdzv_id.c_str(),
                             config_.nnodes,            endpoint.listen_fd,       config_.rdzv_timeout_s,
                             config_.rdzv_token.c_str(), config_.keep_c10_logs ? 0 : 1};
  store_ = std::make_unique<PluginStore>(req);  // loaded here, never for a dry run
}

RendezvousRound StoreRendezvous::next_rendezvous(int after_round, int expected_nodes) {
  if (!store_) open();
  const RoundRules rules = round_rules(config_);
  ddp_rdzv_round_request req{};
  req.min_nodes = rules.min_nodes;
  req.max_nodes = rules.max_nodes;
  req.after_round = after_round;
  req.expected_nodes = expected_nodes;
  req.last_call_s = rules.last_call_s;
  req.timeout_s = rules.timeout_s;
  req.advertise_addr = advertise_.c_str();
  req.advertise_port = process::pick_free_port(advertise_);  // fresh each round: the old one may still linger
  req.note = &log_note;
  const ddp_rdzv_round_result result = store_->round(req);
  RendezvousRound m;
  m.round = result.round;
  m.node = assignment_from_flags(config_, nproc_);
  m.node.nnodes = result.nnodes;
  m.node.node_rank = result.node_rank;
  m.node.master_addr = result.master_addr;
  m.node.master_port = result.master_port;
  return m;
}

int StoreRendezvous::num_nodes_waiting(int round) { return store_ ? store_->waiting(round) : -1; }

int StoreRendezvous::mark_node_gone(const std::string& prefix, const std::string& node_key, int first_round_workers) {
  return store_ ? store_->mark_gone(prefix, node_key, first_round_workers) : -1;
}

bool StoreRendezvous::serves_store() {
  if (!store_) open();
  return serves_;
}

const std::string& StoreRendezvous::served_address() {
  if (!store_) open();
  return served_address_;
}

EndpointDirectory* StoreRendezvous::directory() {
  if (!store_) open();
  return store_.get();
}

int NewcomerPoll::waiting_after(int round) {
  const auto now = std::chrono::steady_clock::now();
  if (store_lost_ || now - last_poll_ < std::chrono::milliseconds(250)) return 0;
  last_poll_ = now;
  const int waiting = rendezvous_.num_nodes_waiting(round);
  if (waiting >= 0) {
    failing_since_.reset();
    return waiting;
  }
  // At a job's normal end the launcher that serves the store may exit while this node's workers
  // finish their last milliseconds: a store silent for that long is no news (the chaos trials
  // printed this warning at the end of successful jobs). Said once it stayed silent for 2 s.
  if (!failing_since_) failing_since_ = now;
  if (now - *failing_since_ < std::chrono::seconds(2)) return 0;
  store_lost_ = true;
  spdlog::warn("the rendezvous store did not answer for 2 s: {}", what_is_lost_);
  return 0;
}

}  // namespace ddp::launcher::rendezvous
