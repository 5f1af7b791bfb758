// The rendezvous plugin's elastic rounds (--nnodes MIN:MAX): joining round R of the store, closing
// it, reading its members. See Note [Elastic rounds] in launcher/rendezvous/rounds.cpp; the store itself
// and its token as in Note [Dynamic rendezvous] (rdzv_plugin.cpp) and Note [Rendezvous token].
#include <c10/util/Logging.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <thread>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "ddp/elastic/detail/membership_keys.h"
#include "launcher/rendezvous/plugin/plugin_store.h"
#include "launcher/rendezvous/records.h"
#include "launcher/rendezvous/rounds.h"

namespace {

namespace rdzv = ddp::launcher::rdzv;
namespace rdzv_plugin = ddp::launcher::rdzv_plugin;
using ddp::launcher::rdzv_plugin::Handle;
using ddp::launcher::rdzv_plugin::try_get;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class Round {
 public:
  Round(Handle& handle, const ddp_rdzv_round_request& req)
      : handle_(handle),
        store_(*handle.store),
        req_(req),
        token_(handle.token),
        id_(handle.run_id),
        nonce_(rdzv::random_nonce()),
        started_(Clock::now()) {
    rules_.min_nodes = req.min_nodes;
    rules_.max_nodes = req.max_nodes;
    rules_.last_call_s = req.last_call_s;
    rules_.timeout_s = req.timeout_s;
  }

  bool run(ddp_rdzv_round_result* result) {
    int round = std::max(0, req_.after_round + 1);
    while (true) {
      round = first_open_round(round);
      const int slot = take_slot(round, result);
      if (slot == kRoundFull) {  // MAX claims: it closes without this node; try the next round
        ++round;
        continue;
      }
      if (slot < 0) return false;
      std::vector<int> members;
      if (!wait_for_close(round, slot, members, result)) return false;
      const int rank = rdzv::node_rank_in(members, slot);
      if (rank < 0) {  // claimed after the round closed: the next one
        ++round;
        continue;
      }
      result->round = round;
      result->node_rank = rank;
      result->nnodes = static_cast<int>(members.size());
      return read_master(round, rank, result);
    }
  }

 private:
  static constexpr int kRoundFull = -2;

  std::string prefix() const { return "rendezvous '" + id_ + "' at " + handle_.where; }
  std::string claim_of(int round, int slot) const {
    return rdzv::make_claim(token_, rdzv::round_id(id_, round), req_.max_nodes, slot, nonce_);
  }
  bool is_claim(int round, int slot, const std::string& value) const {
    return rdzv::is_valid_claim(token_, rdzv::round_id(id_, round), req_.max_nodes, slot, value);
  }
  void note(const std::string& line) const {
    if (req_.note != nullptr) req_.note(line.c_str());
  }
  static void pause() { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

  int first_open_round(int round) {
    while (store_.check({rdzv::closed_key(id_, round)})) ++round;
    return round;
  }

  // This node's slot in `round`, kRoundFull, or -1 (error set) on timeout.
  int take_slot(int round, ddp_rdzv_round_result* result) {
    for (int slot = 0; slot < req_.max_nodes; ++slot) {
      const std::string key = rdzv::slot_key(rdzv::round_id(id_, round), slot);
      const std::string mine = claim_of(round, slot);
      const std::string now =
          rdzv_plugin::claim(store_, key, mine, [&](const std::string& v) { return is_claim(round, slot, v); });
      if (now == mine) return slot;
    }
    if (seconds_since(started_) >= req_.timeout_s) {
      set_error(result, prefix() + " timed out after " + std::to_string(static_cast<int>(req_.timeout_s)) +
                            " s (--rdzv_timeout): every round was full (" + std::to_string(req_.max_nodes) +
                            " nodes, the maximum of --nnodes)");
      return -1;
    }
    return kRoundFull;
  }

  // The valid claims of `round`, ascending.
  std::vector<int> claims(int round) {
    std::vector<int> slots;
    for (int slot = 0; slot < req_.max_nodes; ++slot) {
      const auto value = try_get(store_, rdzv::slot_key(rdzv::round_id(id_, round), slot));
      if (value && is_claim(round, slot, *value)) slots.push_back(slot);
    }
    return slots;
  }

  std::optional<std::vector<int>> closed_members(int round) {
    const auto value = try_get(store_, rdzv::closed_key(id_, round));
    if (!value) return std::nullopt;
    std::string problem;
    auto members = rdzv::parse_closed_record(token_, id_, round, req_.max_nodes, *value, problem);
    if (!members) throw std::runtime_error(problem);
    return members;
  }

  // Whether the job is at max_nodes: the round before `round` closed with max_nodes members.
  bool job_is_full(int round) {
    if (round == 0) return false;
    const auto before = closed_members(round - 1);
    return before && static_cast<int>(before->size()) >= req_.max_nodes;
  }

  bool wait_for_close(int round, int slot, std::vector<int>& members, ddp_rdzv_round_result* result) {
    int last_joined = -1;
    Clock::time_point last_change = Clock::now();
    bool told_full = false;
    while (true) {
      if (auto closed = closed_members(round)) {
        members = *closed;
        return true;
      }
      const std::vector<int> joined = claims(round);
      if (static_cast<int>(joined.size()) != last_joined) {
        last_joined = static_cast<int>(joined.size());
        last_change = Clock::now();
      }
      result->nodes_joined = last_joined;
      rdzv::RoundView view;
      view.joined = last_joined;
      view.expected = req_.expected_nodes;
      view.since_last_join_s = seconds_since(last_change);
      view.waited_s = seconds_since(started_);
      view.joins_running_job = req_.after_round < 0 && round > 0;
      const rdzv::RoundStep step = rdzv::decide_round(rules_, view);
      if (step == rdzv::RoundStep::kClose) {
        const std::string record = rdzv::make_closed_record(token_, id_, round, joined);
        store_.compareSet(rdzv::closed_key(id_, round), {}, ddp::detail::to_bytes(record));
        continue;  // read back whichever close won
      }
      if (step == rdzv::RoundStep::kTimedOut) {
        const std::string key = rdzv::slot_key(rdzv::round_id(id_, round), slot);
        store_.compareSet(key, ddp::detail::to_bytes(claim_of(round, slot)), ddp::detail::to_bytes("left"));
        if (auto closed = closed_members(round); closed && rdzv::node_rank_in(*closed, slot) >= 0) {
          members = *closed;  // closed with this node just before it left: it is a member after all
          store_.compareSet(key, ddp::detail::to_bytes("left"), ddp::detail::to_bytes(claim_of(round, slot)));
          return true;
        }
        if (view.joins_running_job) {
          set_error(result, prefix() + ": the running job did not admit this node into round " +
                                std::to_string(round) + " within " + std::to_string(static_cast<int>(req_.timeout_s)) +
                                " s (--rdzv_timeout): the job is at its maximum of " + std::to_string(req_.max_nodes) +
                                " nodes, has used up its --max_restarts, or has ended");
          return false;
        }
        set_error(result, prefix() + ": " + std::to_string(last_joined) + (last_joined == 1 ? " node" : " nodes") +
                              " joined within " + std::to_string(static_cast<int>(req_.timeout_s)) +
                              " s (--rdzv_timeout), fewer than the minimum of " + std::to_string(req_.min_nodes) +
                              " (--nnodes " + std::to_string(req_.min_nodes) + ":" + std::to_string(req_.max_nodes) +
                              ")" + (told_full ? "; the running job stayed at its maximum of nodes" : ""));
        return false;
      }
      if (!told_full && req_.after_round < 0 && job_is_full(round)) {  // a newcomer, not a member
        told_full = true;
        note(prefix() + ": the job runs with its maximum of " + std::to_string(req_.max_nodes) +
             " nodes (--nnodes " + std::to_string(req_.min_nodes) + ":" + std::to_string(req_.max_nodes) +
             "): this node waits for a place (a node leaving) until --rdzv_timeout");
      }
      pause();
    }
  }

  bool read_master(int round, int rank, ddp_rdzv_round_result* result) {
    const std::string rid = rdzv::round_id(id_, round);
    if (rank == 0) {
      store_.set(rdzv::master_key(rid),
                 ddp::detail::to_bytes(rdzv::make_master_record(token_, rid, {req_.advertise_addr, req_.advertise_port})));
    }
    std::string problem;
    while (true) {
      if (const auto value = try_get(store_, rdzv::master_key(rid))) {
        if (auto master = rdzv::parse_master_record(token_, rid, *value, problem)) {
          std::snprintf(result->master_addr, sizeof result->master_addr, "%s", master->addr.c_str());
          result->master_port = master->port;
          return true;
        }
      } else {
        problem = "key '" + rdzv::master_key(rid) + "' is missing";
      }
      if (seconds_since(started_) >= req_.timeout_s) {
        set_error(result, prefix() + ": round " + std::to_string(round) + ": " + problem);
        return false;
      }
      pause();
    }
  }

  static void set_error(ddp_rdzv_round_result* r, const std::string& text) {
    rdzv_plugin::set_error(r->error, sizeof r->error, text);
  }

  Handle& handle_;
  c10d::TCPStore& store_;
  const ddp_rdzv_round_request& req_;
  rdzv::Token token_;
  std::string id_;
  std::string nonce_;
  Clock::time_point started_;
  rdzv::RoundRules rules_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) void* ddp_rdzv_open(const ddp_rdzv_request* req,
                                                                      ddp_rdzv_result* result) {
  std::memset(result, 0, sizeof *result);
  if (req->quiet_c10_logs != 0) FLAGS_caffe2_log_level = 3;  // See Note [Dynamic rendezvous]
  auto handle = std::make_unique<Handle>();
  handle->run_id = req->run_id;
  handle->token = req->token;
  handle->max_nodes = req->nnodes;
  handle->timeout_s = req->timeout_s;
  handle->is_server = req->listen_fd >= 0;
  handle->where = std::string(req->endpoint_host) + ":" + std::to_string(req->endpoint_port);
  try {
    handle->store = rdzv_plugin::open_store(*req);
  } catch (const std::exception& e) {
    rdzv_plugin::set_error(result->error, sizeof result->error, rdzv_plugin::unreachable_store(*req, e));
    return nullptr;
  }
  return handle.release();
}

extern "C" __attribute__((visibility("default"))) int ddp_rdzv_round(void* opaque, const ddp_rdzv_round_request* req,
                                                                     ddp_rdzv_round_result* result) {
  std::memset(result, 0, sizeof *result);
  auto& handle = *static_cast<Handle*>(opaque);
  try {
    Round round(handle, *req);
    return round.run(result) ? 0 : -1;
  } catch (const std::exception& e) {
    rdzv_plugin::set_error(result->error, sizeof result->error,
                           "rendezvous '" + handle.run_id + "' at " + handle.where + " failed: " +
                               rdzv_plugin::one_line(e));
    return -1;
  }
}

extern "C" __attribute__((visibility("default"))) int ddp_rdzv_waiting(void* opaque, int round) {
  auto& handle = *static_cast<Handle*>(opaque);
  const rdzv::Token token(handle.token);
  try {
    int waiting = 0;
    const std::string rid = rdzv::round_id(handle.run_id, round + 1);
    for (int slot = 0; slot < handle.max_nodes; ++slot) {
      const auto value = try_get(*handle.store, rdzv::slot_key(rid, slot));
      if (value && rdzv::is_valid_claim(token, rid, handle.max_nodes, slot, *value)) ++waiting;
    }
    return waiting;
  } catch (const std::exception&) {
    return -1;
  }
}

extern "C" __attribute__((visibility("default"))) int ddp_rdzv_mark_gone(void* opaque, const char* prefix,
                                                                         const char* node_key, int first_round_workers) {
  auto& handle = *static_cast<Handle*>(opaque);
  try {
    c10d::PrefixStore job(prefix, handle.store);
    const auto mark = ddp::detail::membership_keys::mark_node_gone(job, node_key, first_round_workers);
    return mark.marked > 0 ? mark.marked : mark.already ? -2 : 0;
  } catch (const std::exception&) {
    return -1;
  }
}
