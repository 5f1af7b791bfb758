#pragma once
// What the rendezvous writes to and reads from the c10d store, and how each value is checked:
// torch-free, so the plugin (which links LibTorch) and the unit tests share it.
// See Note [Rendezvous token] in launcher/rendezvous/records.cpp.
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher::rendezvous {

// The keys of rendezvous `run_id`.
std::string slot_key(const std::string& run_id, int slot);
std::string master_key(const std::string& run_id);
std::string done_key(const std::string& run_id);
// A launcher's published endpoint `name` (ddp_rdzv_publish) is recorded as the master of rendezvous
// "<run_id>/endpoint/<name>": master_key and the master record's proof, under that id.
std::string endpoint_id(const std::string& run_id, const std::string& name);

// The job's secret, as the launchers present it (DDP_RDZV_TOKEN; empty: no secret, see the Note).
class Token {
 public:
  explicit Token(std::string secret) : secret_(std::move(secret)) {}
  // HMAC-SHA256 of `message` under the token, lower-case hex.
  std::string proof(const std::string& message) const;
  // Whether `proof_hex` is proof(message) (compared in constant time).
  bool verify(const std::string& message, const std::string& proof_hex) const;

 private:
  std::string secret_;
};

// A launcher's claim of node rank `slot`: "claim <nonce> <proof>".
std::string make_claim(const Token& token, const std::string& run_id, int nnodes, int slot, const std::string& nonce);
// Whether `value` (read from slot_key(run_id, slot)) is a claim a launcher of this job made.
bool is_valid_claim(const Token& token, const std::string& run_id, int nnodes, int slot, const std::string& value);

struct MasterRecord {
  std::string addr;
  int port = 0;
};
// "master <addr> <port> <proof>", written by the node that got rank 0.
std::string make_master_record(const Token& token, const std::string& run_id, const MasterRecord& master);
// The master a launcher of this job published; nullopt with `error` set to one line naming the key
// and (printably, cut short) the value when it is malformed or not from a launcher of this job.
std::optional<MasterRecord> parse_master_record(const Token& token, const std::string& run_id,
                                                const std::string& value, std::string& error);

// `value` as one printable line of at most 80 characters (for error messages).
std::string printable_value(const std::string& value);

// Elastic rounds (See Note [Elastic rounds] in launcher/rendezvous/rounds.cpp): round R of rendezvous
// `run_id` is rendezvous "<run_id>/r<R>" for slot_key, master_key and claims (run ids have no '/').
std::string round_id(const std::string& run_id, int round);
// Where round R's member list is written once it closes.
std::string closed_key(const std::string& run_id, int round);
// "closed <slots> <proof>": round R closed with the launchers of these slots (ascending).
std::string make_closed_record(const Token& token, const std::string& run_id, int round,
                               const std::vector<int>& member_slots);
// The member slots of a closed record a launcher of this job wrote; nullopt with `error` set (one
// line naming the key) when it is malformed or unproved.
std::optional<std::vector<int>> parse_closed_record(const Token& token, const std::string& run_id, int round,
                                                    int max_nodes, const std::string& value, std::string& error);

// 16 random bytes, hex: a launcher's nonce.
std::string random_nonce();

}  // namespace ddp::launcher::rdzv
