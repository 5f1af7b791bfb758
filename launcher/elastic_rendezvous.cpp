#include "launcher/elastic_rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include "ddp/base/error.h"
#include "launcher/net.h"
#include "launcher/plugin_loader.h"
#include "launcher/rdzv_client.h"
#include "launcher/rdzv_plugin_api.h"
#include "launcher/rendezvous.h"

#ifndef DDP_RDZV_PLUGIN_NAME
#define DDP_RDZV_PLUGIN_NAME "libddp_launch_rdzv.so"
#endif

namespace ddp::launcher {
namespace {

void log_note(const char* line) { spdlog::info("{}", line); }

// The numeric address a listening socket is bound to ("0.0.0.0" for every interface).
std::string bound_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  char text[INET6_ADDRSTRLEN] = "";
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  if (addr.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof text);
  } else if (addr.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, text, sizeof text);
  }
  return text;
}

}  // namespace

rdzv::RoundRules round_rules(const LaunchConfig& config) {
  rdzv::RoundRules rules;
  rules.min_nodes = config.min_nnodes;
  rules.max_nodes = config.nnodes;
  rules.last_call_s = config.rdzv_last_call_s;
  rules.timeout_s = config.rdzv_timeout_s;
  return rules;
}

ElasticRendezvous::ElasticRendezvous(const LaunchConfig& config, int nproc_per_node)
    : config_(config), nproc_(nproc_per_node) {}

ElasticRendezvous::~ElasticRendezvous() {
  if (handle_ != nullptr) release_(handle_);
}

void ElasticRendezvous::open() {
  SharedLibrary plugin = SharedLibrary::load_plugin(DDP_RDZV_PLUGIN_NAME, "--rdzv_endpoint");
  plugin.keep_loaded();  // LibTorch does not support being unloaded
  const auto open_fn = plugin.symbol<ddp_rdzv_open_fn>(DDP_RDZV_OPEN_SYMBOL);
  round_ = plugin.symbol<ddp_rdzv_round_fn>(DDP_RDZV_ROUND_SYMBOL);
  waiting_ = plugin.symbol<ddp_rdzv_waiting_fn>(DDP_RDZV_WAITING_SYMBOL);
  release_ = plugin.symbol<ddp_rdzv_release_fn>(DDP_RDZV_RELEASE_SYMBOL);
  mark_gone_ = plugin.symbol<ddp_rdzv_mark_gone_fn>(DDP_RDZV_MARK_GONE_SYMBOL);
  const StoreEndpoint endpoint = open_store_endpoint(config_);
  advertise_ = endpoint.advertise;
  serves_ = endpoint.listen_fd >= 0;
  if (serves_) served_address_ = bound_address(endpoint.listen_fd);
  ddp_rdzv_request req{config_.rdzv_host.c_str(), config_.rdzv_port, config_.rdzv_id.c_str(), config_.nnodes,
                       endpoint.listen_fd, advertise_.c_str(), 0, config_.rdzv_timeout_s,
                       config_.rdzv_token.c_str(), config_.keep_c10_logs ? 0 : 1};
  ddp_rdzv_result result{};
  handle_ = open_fn(&req, &result);
  if (handle_ == nullptr) throw ddp::TimeoutError(result.error);
}

ElasticMembership ElasticRendezvous::next_round(int after_round, int expected_nodes) {
  if (handle_ == nullptr) open();
  ddp_rdzv_round_request req{};
  req.min_nodes = config_.min_nnodes;
  req.max_nodes = config_.nnodes;
  req.after_round = after_round;
  req.expected_nodes = expected_nodes;
  req.last_call_s = config_.rdzv_last_call_s;
  req.timeout_s = config_.rdzv_timeout_s;
  req.advertise_addr = advertise_.c_str();
  req.advertise_port = pick_free_port_pair(advertise_);  // fresh each round: the old one may still linger
  req.note = &log_note;
  ddp_rdzv_round_result result{};
  if (round_(handle_, &req, &result) != 0) {
    throw ddp::TimeoutError(result.error);
  }
  ElasticMembership m;
  m.round = result.round;
  m.node = assignment_from_flags(config_, nproc_);
  m.node.nnodes = result.nnodes;
  m.node.node_rank = result.node_rank;
  m.node.master_addr = result.master_addr;
  m.node.master_port = result.master_port;
  return m;
}

int ElasticRendezvous::waiting_after(int round) {
  if (handle_ == nullptr) return -1;
  return waiting_(handle_, round);
}

int ElasticRendezvous::mark_node_gone(const std::string& prefix, const std::string& node_key, int first_round_workers) {
  if (handle_ == nullptr) return -1;
  return mark_gone_(handle_, prefix.c_str(), node_key.c_str(), first_round_workers);
}

bool ElasticRendezvous::serves_store() {
  if (handle_ == nullptr) open();
  return serves_;
}

const std::string& ElasticRendezvous::served_address() {
  if (handle_ == nullptr) open();
  return served_address_;
}

}  // namespace ddp::launcher
