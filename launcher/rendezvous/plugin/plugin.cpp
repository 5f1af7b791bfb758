// The rendezvous plugin: node ranks from c10d's TCPStore, in rounds. Built as libddp_launch_rdzv.so.
// Note [Dynamic rendezvous]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// - Serving: the node that can bind the endpoint's address and port serves the store; ddp_launch
//   binds that socket itself, to exactly the endpoint's address (a loopback endpoint listens on
//   loopback only), and the store takes it over (TCPStoreOptions::masterListenFd). Whoever loses
//   the bind (two launchers on one host) is a client. So the endpoint must be an address of one of
//   the job's nodes, as with torchrun's c10d backend. An endpoint named by the serving host's own
//   Debian name (127.0.1.1 there, its network address elsewhere) listens on every interface, and
//   the address published below is never a loopback one while nnodes > 1 (See Note [Advertised
//   address] in ddp/base/detail/route.h; launcher/rendezvous/store_rendezvous.cpp chooses both).
// - One kind of rendezvous: rounds (See Note [Elastic rounds] in launcher/rendezvous/rounds.cpp).
//   A fixed `--nnodes N` job is rounds with MIN = MAX = N and has one round: its restarts go over
//   the job channel (Note [Coordinated restarts]), its membership never changes. A node that comes
//   to a fixed job whose round is full of launchers' claims, or closed, is one too many: refused.
// - Trust: slots are claimed with compareSet, each claim, the master record, the closed record and
//   each done mark proved with the job's token; nothing a foreign client writes counts (See Note
//   [Rendezvous token] in launcher/rendezvous/records.cpp). Foreign bytes in a slot or in the closed
//   key are taken over; while its round is open a node puts its own claim back when a foreign write
//   replaced it, and the round's node 0 writes the master record over whatever the key holds.
// - Master: the round's node 0 publishes "<addr> <port>" (its address towards the endpoint, by the
//   kernel's route lookup, and a free port on it); every member waits for it, then marks itself
//   done. Everything is bounded by --rdzv_timeout; a timeout says how many nodes had joined, and
//   whether a claim that looked like a launcher's did not verify (a different DDP_RDZV_TOKEN).
// - Lifetime: the serving node keeps the store until every member of the last round it joined has
//   marked itself done (bounded by the timeout), so nobody reads from a store that is gone.
// - Errors: one line each. c10d's exceptions carry a backtrace in what(); only the first line of
//   what_without_backtrace() is reported. c10d also logs a failed store operation as a warning with
//   a 17-line backtrace before it throws; unless the user asked for c10's logs (TORCH_CPP_LOG_LEVEL),
//   the launcher's process keeps only c10's fatal ones (FLAGS_caffe2_log_level, c10/util/Logging.h;
//   the workers are other processes and keep theirs).
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddp/base/detail/route.h"
#include "ddp/base/detail/store_values.h"
#include "ddp/base/str.h"
#include "ddp/elastic/detail/membership_keys.h"
#include "launcher/rendezvous/plugin/plugin_api.h"
#include "launcher/rendezvous/records.h"
#include "launcher/rendezvous/rounds.h"

namespace {

namespace rdzv = ddp::launcher::rendezvous;
using Clock = std::chrono::steady_clock;
using ddp::detail::bytes_to_text;
using ddp::detail::to_bytes;

struct Handle {
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::string run_id;
  std::string token;
  std::string where;  // "host:port"
  int max_nodes = 0;
  bool is_server = false;
  double timeout_s = 0;
  // The last round this node was a member of: a serving node waits for its members' done marks.
  int last_round = -1;
  int last_round_nodes = 0;
};

void set_error(char* error, std::size_t size, const std::string& text) { std::snprintf(error, size, "%s", text.c_str()); }

// c10d's exceptions carry a backtrace in what(): only the first line, without it.
std::string one_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return ddp::first_line(c10_error != nullptr ? c10_error->what_without_backtrace() : e.what());
}

std::optional<std::string> try_get(c10d::TCPStore& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  return bytes_to_text(store.get(key));
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

// Not `pause`: POSIX has one (unistd.h, which LibTorch 2.14's headers include), and the call would be ambiguous.
void sleep_before_next_poll() { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string done_mark_key(const std::string& round_id, int rank) { return rdzv::done_key(round_id) + "/" + std::to_string(rank); }

// A client first waits, with a real deadline, for the store to accept connections: c10d's own
// connect retries overshoot the timeout about twofold (See Note [Bounded connect to the master] in
// ddp/base/detail/route.h). Throws when nothing accepted a connection within --rdzv_timeout.
c10::intrusive_ptr<c10d::TCPStore> open_store(const ddp_rdzv_request& req) {
  if (req.listen_fd < 0 && !ddp::detail::wait_until_listening(req.endpoint_host, req.endpoint_port, deadline_after(req.timeout_s))) {
    throw std::runtime_error("nothing accepted a connection there");
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(req.endpoint_port);
  opts.isServer = req.listen_fd >= 0;
  if (opts.isServer) opts.masterListenFd = req.listen_fd;
  opts.waitWorkers = false;
  opts.timeout = std::chrono::milliseconds(static_cast<long long>(req.timeout_s * 1000));
  return c10::make_intrusive<c10d::TCPStore>(req.endpoint_host, opts);
}

// One node's way through the rounds to a closed one it is a member of.
class Round {
 public:
  Round(Handle& handle, const ddp_rdzv_round_request& req)
      : handle_(handle),
        store_(*handle.store),
        req_(req),
        token_(handle.token),
        id_(handle.run_id),
        nonce_(rdzv::random_nonce()),
        started_(Clock::now()),
        rules_{req.min_nodes, req.max_nodes, req.last_call_s, req.timeout_s} {}

  bool run(ddp_rdzv_round_result* result) {
    const int first = std::max(0, req_.after_round + 1);
    int round = first;
    while (true) {
      round = first_open_round(round);
      if (fixed_size() && round > first) return one_too_many(result);
      const int slot = take_slot(round, result);
      if (slot == kRoundFull) {  // MAX launchers' claims: it closes without this node
        if (fixed_size()) return one_too_many(result);
        ++round;
        continue;
      }
      if (slot < 0) return false;
      std::vector<int> members;
      if (!wait_for_close(round, slot, members, result)) return false;
      const int rank = rdzv::node_rank_in(members, slot);
      if (rank < 0) {  // claimed after the round closed: the next one
        if (fixed_size()) return one_too_many(result);
        ++round;
        continue;
      }
      result->round = round;
      result->node_rank = rank;
      result->nnodes = static_cast<int>(members.size());
      if (!read_master(round, rank, result)) return false;
      store_.set(done_mark_key(rdzv::round_id(id_, round), rank), to_bytes(claim_of(round, rank)));
      handle_.last_round = round;
      handle_.last_round_nodes = result->nnodes;
      return true;
    }
  }

 private:
  static constexpr int kRoundFull = -2;

  bool fixed_size() const { return req_.min_nodes == req_.max_nodes; }
  std::string prefix() const { return "rendezvous '" + id_ + "' at " + handle_.where; }
  std::string timeout_text() const { return std::to_string(static_cast<int>(req_.timeout_s)) + " s (--rdzv_timeout)"; }
  std::string claim_of(int round, int slot) const {
    return rdzv::make_claim(token_, rdzv::round_id(id_, round), req_.max_nodes, slot, nonce_);
  }
  bool is_claim(int round, int slot, const std::string& value) const {
    const bool valid = rdzv::is_valid_claim(token_, rdzv::round_id(id_, round), req_.max_nodes, slot, value);
    if (!valid && value.rfind("claim ", 0) == 0) saw_unproved_claim_ = true;
    return valid;
  }
  // What a timeout adds when a claim that looked like a launcher's did not verify.
  std::string token_hint() const {
    return saw_unproved_claim_ ? " (a claim in the store did not verify: does every launcher have the same "
                                 "DDP_RDZV_TOKEN?)"
                               : "";
  }
  void note(const std::string& line) const {
    if (req_.note != nullptr) req_.note(line.c_str());
  }
  bool fail(ddp_rdzv_round_result* result, const std::string& text) const {
    set_error(result->error, sizeof result->error, text);
    return false;
  }
  bool one_too_many(ddp_rdzv_round_result* result) const {
    return fail(result, prefix() + " already has all " + std::to_string(req_.max_nodes) +
                            " nodes: this node is one too many (same --rdzv_id reused, or --nnodes differs between nodes?)");
  }

  // Writes this node's claim to `slot` unless it holds another launcher's; what the slot holds after.
  std::string claim(int round, int slot) {
    const std::string key = rdzv::slot_key(rdzv::round_id(id_, round), slot);
    const std::string mine = claim_of(round, slot);
    const std::string current = bytes_to_text(store_.compareSet(key, {}, to_bytes(mine)));
    if (current == mine || is_claim(round, slot, current)) return current;
    // Foreign bytes or a launcher that left: take the slot over, unless someone else does first.
    return bytes_to_text(store_.compareSet(key, to_bytes(current), to_bytes(mine)));
  }

  int first_open_round(int round) {
    while (closed_members(round)) ++round;
    return round;
  }

  // This node's slot in `round`; kRoundFull when every slot holds a launcher's claim; -1 (error
  // set) when foreign writes kept it from every slot until the timeout.
  int take_slot(int round, ddp_rdzv_round_result* result) {
    while (true) {
      bool all_launchers = true;
      for (int slot = 0; slot < req_.max_nodes; ++slot) {
        const std::string now = claim(round, slot);
        if (now == claim_of(round, slot)) return slot;
        all_launchers = all_launchers && is_claim(round, slot, now);
      }
      if (all_launchers) return kRoundFull;
      if (seconds_since(started_) >= req_.timeout_s) {
        fail(result, prefix() + " timed out after " + timeout_text() + " before this node could claim a slot of round " +
                         std::to_string(round) + token_hint());
        return -1;
      }
      sleep_before_next_poll();
    }
  }

  // The valid claims of `round`, ascending; this node's own (`slot`) put back if a foreign write
  // replaced it. nullopt (error set) when another launcher took this node's slot meanwhile.
  std::optional<std::vector<int>> claims(int round, int slot, ddp_rdzv_round_result* result) {
    std::vector<int> slots;
    for (int s = 0; s < req_.max_nodes; ++s) {
      std::optional<std::string> value = try_get(store_, rdzv::slot_key(rdzv::round_id(id_, round), s));
      if (s == slot && value != claim_of(round, s)) {
        if (value && is_claim(round, s, *value)) {
          fail(result, prefix() + ": another launcher took this node's slot " + std::to_string(s) + " of round " +
                           std::to_string(round) + " after a foreign client overwrote it; start the node again");
          return std::nullopt;
        }
        value = claim(round, s);
      }
      if (value && is_claim(round, s, *value)) slots.push_back(s);
    }
    return slots;
  }

  // The member slots of `round` once a launcher of this job closed it; a value that is not such a
  // record is a foreign write, not a close.
  std::optional<std::vector<int>> closed_members(int round) {
    const auto value = try_get(store_, rdzv::closed_key(id_, round));
    if (!value) return std::nullopt;
    std::string problem;
    return rdzv::parse_closed_record(token_, id_, round, req_.max_nodes, *value, problem);
  }

  // Writes the closed record unless a launcher's is there; foreign bytes are written over.
  void close(int round, const std::vector<int>& joined) {
    const std::string key = rdzv::closed_key(id_, round);
    const std::string record = rdzv::make_closed_record(token_, id_, round, joined);
    const std::string current = bytes_to_text(store_.compareSet(key, {}, to_bytes(record)));
    if (current != record && !closed_members(round)) store_.compareSet(key, to_bytes(current), to_bytes(record));
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
      const std::optional<std::vector<int>> joined = claims(round, slot, result);
      if (!joined) return false;
      if (static_cast<int>(joined->size()) != last_joined) {
        last_joined = static_cast<int>(joined->size());
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
        close(round, *joined);
        continue;  // read back whichever close won
      }
      if (step == rdzv::RoundStep::kTimedOut) {
        const std::string key = rdzv::slot_key(rdzv::round_id(id_, round), slot);
        store_.compareSet(key, to_bytes(claim_of(round, slot)), to_bytes("left"));  // a retry can still complete
        if (auto closed = closed_members(round); closed && rdzv::node_rank_in(*closed, slot) >= 0) {
          members = *closed;  // closed with this node just before it left: it is a member after all
          store_.compareSet(key, to_bytes("left"), to_bytes(claim_of(round, slot)));
          return true;
        }
        return fail(result, timed_out_line(round, last_joined, told_full));
      }
      if (!told_full && req_.after_round < 0 && job_is_full(round)) {  // a newcomer, not a member
        told_full = true;
        note(prefix() + ": the job runs with its maximum of " + std::to_string(req_.max_nodes) + " nodes (--nnodes " +
             std::to_string(req_.min_nodes) + ":" + std::to_string(req_.max_nodes) +
             "): this node waits for a place (a node leaving) until --rdzv_timeout");
      }
      sleep_before_next_poll();
    }
  }

  std::string timed_out_line(int round, int joined, bool told_full) const {
    if (req_.after_round < 0 && round > 0 && !fixed_size()) {
      return prefix() + ": the running job did not admit this node into round " + std::to_string(round) + " within " +
             timeout_text() + ": the job is at its maximum of " + std::to_string(req_.max_nodes) +
             " nodes, has used up its --max_restarts, or has ended";
    }
    if (fixed_size()) {
      return prefix() + " timed out after " + timeout_text() + ": " + std::to_string(joined) + " of " +
             std::to_string(req_.max_nodes) + " nodes joined; waited for the other " +
             std::to_string(req_.max_nodes - joined) + token_hint();
    }
    return prefix() + ": " + std::to_string(joined) + (joined == 1 ? " node" : " nodes") + " joined within " +
           timeout_text() + ", fewer than the minimum of " + std::to_string(req_.min_nodes) + " (--nnodes " +
           std::to_string(req_.min_nodes) + ":" + std::to_string(req_.max_nodes) + ")" +
           (told_full ? "; the running job stayed at its maximum of nodes" : "") + token_hint();
  }

  bool read_master(int round, int rank, ddp_rdzv_round_result* result) {
    const std::string rid = rdzv::round_id(id_, round);
    if (rank == 0) {
      store_.set(rdzv::master_key(rid),
                 to_bytes(rdzv::make_master_record(token_, rid, {req_.advertise_addr, req_.advertise_port})));
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
      if (seconds_since(started_) >= req_.timeout_s) return fail(result, prefix() + ": round " + std::to_string(round) + ": " + problem);
      sleep_before_next_poll();
    }
  }

  Handle& handle_;
  c10d::TCPStore& store_;
  const ddp_rdzv_round_request& req_;
  rdzv::Token token_;
  std::string id_;
  std::string nonce_;
  Clock::time_point started_;
  rdzv::RoundRules rules_;
  mutable bool saw_unproved_claim_ = false;
};

}  // namespace

#define DDP_RDZV_EXPORT extern "C" __attribute__((visibility("default")))

DDP_RDZV_EXPORT void* ddp_rdzv_open(const ddp_rdzv_request* req, ddp_rdzv_result* result) {
  std::memset(result, 0, sizeof *result);
  if (req->quiet_c10_logs != 0) FLAGS_caffe2_log_level = 3;  // FATAL only: see Note [Dynamic rendezvous]
  auto handle = std::make_unique<Handle>();
  handle->run_id = req->run_id;
  handle->token = req->token;
  handle->max_nodes = req->nnodes;
  handle->timeout_s = req->timeout_s;
  handle->is_server = req->listen_fd >= 0;
  handle->where = std::string(req->endpoint_host) + ":" + std::to_string(req->endpoint_port);
  try {
    handle->store = open_store(*req);
  } catch (const std::exception& e) {
    set_error(result->error, sizeof result->error,
              "rendezvous '" + handle->run_id + "': could not reach the store at " + handle->where + " within " +
                  std::to_string(static_cast<int>(req->timeout_s)) +
                  " s (--rdzv_timeout); waited for the node that serves it (the one whose address is the endpoint) "
                  "to come up: " + one_line(e));
    return nullptr;
  }
  return handle.release();
}

DDP_RDZV_EXPORT int ddp_rdzv_round(void* opaque, const ddp_rdzv_round_request* req, ddp_rdzv_round_result* result) {
  std::memset(result, 0, sizeof *result);
  auto& handle = *static_cast<Handle*>(opaque);
  try {
    Round round(handle, *req);
    return round.run(result) ? 0 : -1;
  } catch (const std::exception& e) {
    // A client's store connection broken mid-round: the chaos trials' restart jobs whose store host
    // was lost said only "Broken pipe".
    const std::string hint = handle.is_server ? ""
                                              : " (the store lives in the launcher at that endpoint: if its host or "
                                                "launcher is gone, this job cannot go on; start it again)";
    set_error(result->error, sizeof result->error,
              "rendezvous '" + handle.run_id + "' at " + handle.where + " failed: " + one_line(e) + hint);
    return -1;
  }
}

DDP_RDZV_EXPORT void ddp_rdzv_release(void* opaque) {
  std::unique_ptr<Handle> handle(static_cast<Handle*>(opaque));
  if (!handle || !handle->is_server || handle->last_round < 0) return;
  const rdzv::Token token(handle->token);
  const std::string rid = rdzv::round_id(handle->run_id, handle->last_round);
  const auto deadline = deadline_after(handle->timeout_s);
  try {
    for (int rank = 0; rank < handle->last_round_nodes && Clock::now() < deadline; ++rank) {
      while (Clock::now() < deadline) {
        const auto value = try_get(*handle->store, done_mark_key(rid, rank));
        if (value && rdzv::is_valid_claim(token, rid, handle->max_nodes, rank, *value)) break;
        sleep_before_next_poll();
      }
    }
  } catch (const std::exception&) {
    // The store is going away either way.
  }
}

DDP_RDZV_EXPORT int ddp_rdzv_waiting(void* opaque, int round) {
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

DDP_RDZV_EXPORT int ddp_rdzv_mark_gone(void* opaque, const char* prefix, const char* node_key, int first_round_workers) {
  auto& handle = *static_cast<Handle*>(opaque);
  try {
    c10d::PrefixStore job(prefix, handle.store);
    const auto mark = ddp::detail::membership_keys::mark_node_gone(job, node_key, first_round_workers);
    return mark.marked > 0 ? mark.marked : mark.already ? -2 : 0;
  } catch (const std::exception&) {
    return -1;
  }
}

DDP_RDZV_EXPORT int ddp_rdzv_publish(void* opaque, const char* name, const char* addr, int port, ddp_rdzv_endpoint* out) {
  std::memset(out, 0, sizeof *out);
  auto& handle = *static_cast<Handle*>(opaque);
  const std::string id = rdzv::endpoint_id(handle.run_id, name);
  try {
    handle.store->set(rdzv::master_key(id), to_bytes(rdzv::make_master_record(rdzv::Token(handle.token), id, {addr, port})));
    return 0;
  } catch (const std::exception& e) {
    set_error(out->error, sizeof out->error,
              "rendezvous '" + handle.run_id + "' at " + handle.where + ": could not publish " + name + ": " + one_line(e));
    return -1;
  }
}

DDP_RDZV_EXPORT int ddp_rdzv_lookup(void* opaque, const char* name, double timeout_s, ddp_rdzv_endpoint* out) {
  std::memset(out, 0, sizeof *out);
  auto& handle = *static_cast<Handle*>(opaque);
  const rdzv::Token token(handle.token);
  const std::string id = rdzv::endpoint_id(handle.run_id, name);
  const auto deadline = deadline_after(timeout_s);
  std::string problem = "nothing was published there";
  try {
    while (true) {
      if (const auto value = try_get(*handle.store, rdzv::master_key(id))) {
        if (auto endpoint = rdzv::parse_master_record(token, id, *value, problem)) {
          std::snprintf(out->addr, sizeof out->addr, "%s", endpoint->addr.c_str());
          out->port = endpoint->port;
          return 0;
        }
      }
      if (Clock::now() >= deadline) break;
      sleep_before_next_poll();
    }
  } catch (const std::exception& e) {
    problem = one_line(e);
  }
  set_error(out->error, sizeof out->error,
            "rendezvous '" + handle.run_id + "' at " + handle.where + ": no " + name + " within " +
                std::to_string(static_cast<int>(timeout_s)) + " s (--rdzv_timeout): " + problem);
  return -1;
}
