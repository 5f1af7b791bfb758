#include "launcher/rendezvous/elastic_rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include "ddp/base/error.h"
#include "launcher/channel/net.h"
#include "launcher/rendezvous/rendezvous.h"

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

ElasticRendezvous::~ElasticRendezvous() = default;

void ElasticRendezvous::open() {
  store_ = std::make_unique<PluginStore>();
  const StoreEndpoint endpoint = open_store_endpoint(config_);
  advertise_ = endpoint.advertise;
  serves_ = endpoint.listen_fd >= 0;
  if (serves_) served_address_ = bound_address(endpoint.listen_fd);
  ddp_rdzv_request req{config_.rdzv_host.c_str(), config_.rdzv_port, config_.rdzv_id.c_str(), config_.nnodes,
                       endpoint.listen_fd, advertise_.c_str(), 0, config_.rdzv_timeout_s,
                       config_.rdzv_token.c_str(), config_.keep_c10_logs ? 0 : 1};
  store_->open(req);
}

RendezvousRound ElasticRendezvous::next_rendezvous(int after_round, int expected_nodes) {
  if (!store_) open();
  ddp_rdzv_round_request req{};
  req.min_nodes = config_.min_nnodes;
  req.max_nodes = config_.nnodes;
  req.after_round = after_round;
  req.expected_nodes = expected_nodes;
  req.last_call_s = config_.rdzv_last_call_s;
  req.timeout_s = config_.rdzv_timeout_s;
  req.advertise_addr = advertise_.c_str();
  req.advertise_port = pick_free_port(advertise_);  // fresh each round: the old one may still linger
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

int ElasticRendezvous::num_nodes_waiting(int round) { return store_ ? store_->waiting(round) : -1; }

int ElasticRendezvous::mark_node_gone(const std::string& prefix, const std::string& node_key, int first_round_workers) {
  return store_ ? store_->mark_gone(prefix, node_key, first_round_workers) : -1;
}

bool ElasticRendezvous::serves_store() {
  if (!store_) open();
  return serves_;
}

const std::string& ElasticRendezvous::served_address() {
  if (!store_) open();
  return served_address_;
}

EndpointDirectory* ElasticRendezvous::directory() {
  if (!store_) open();
  return store_.get();
}

int NewcomerPoll::waiting_after(int round) {
  const auto now = std::chrono::steady_clock::now();
  if (store_lost_ || now - last_poll_ < std::chrono::milliseconds(250)) return 0;
  last_poll_ = now;
  const int waiting = rendezvous_.num_nodes_waiting(round);
  if (waiting >= 0) return waiting;
  store_lost_ = true;
  spdlog::warn("the rendezvous store did not answer: {}", what_is_lost_);
  return 0;
}

}  // namespace ddp::launcher
