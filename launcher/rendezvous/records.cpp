#include "launcher/rendezvous/records.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdio>
#include <random>
#include <sstream>
#include <vector>

#include "launcher/rendezvous/rounds.h"

namespace ddp::launcher::rendezvous {

// Note [Rendezvous token]
// ~~~~~~~~~~~~~~~~~~~~~~~
// c10d's TCPStore has no access control: any client that reaches the endpoint can add to counters
// and write keys. So the rendezvous counts nothing it cannot check:
// - node ranks are slots, not a counter: a launcher claims slot i (key ddp_rdzv/<id>/slot/<i>) with
//   compareSet, writing "claim <nonce> <proof>", where proof = HMAC-SHA256 under the job's token of
//   the run id, nnodes, i and the nonce. A slot holding anything else (a foreign client's bytes, a
//   launcher's "left") is free: a launcher replaces it with compareSet (atomic, so two launchers
//   never both win it). A join is counted only when its claim verifies;
// - the rank-0 node publishes "master <addr> <port> <proof>"; a node uses only a record that
//   verifies, and while it waits each node puts back its own slot (and rank 0 the master record)
//   when a foreign write replaced them;
// - every value read is checked before use: a malformed one is named, with its key, in one line.
// The token is the secret the job's launchers share: DDP_RDZV_TOKEN in every launcher's
// environment (never a flag: command lines are readable by every user through /proc). Without it
// the proofs are made under a fixed public key: a foreign client that merely adds to counters or
// writes bytes still takes no slot, but one that knows this scheme could forge a claim. Anyone who
// can read the traffic to the store sees the proofs, never the token (HMAC), and a proof is bound
// to its slot, run id and job size, so copying one to another slot does not verify.

namespace {

constexpr char kPublicKey[] = "ddp_launch rendezvous without DDP_RDZV_TOKEN";

std::string hex(const unsigned char* bytes, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[bytes[i] >> 4]);
    out.push_back(digits[bytes[i] & 15]);
  }
  return out;
}

std::vector<std::string> split_spaces(const std::string& text) {
  std::vector<std::string> parts;
  std::istringstream in(text);
  std::string part;
  while (in >> part) parts.push_back(part);
  return parts;
}

bool is_hex(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// A TCP port, strictly: digits only, 1..65535.
std::optional<int> parse_port(const std::string& text) {
  if (text.empty() || text.size() > 5 || text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  const int port = std::stoi(text);  // at most 5 digits: cannot throw
  if (port < 1 || port > 65535) return std::nullopt;
  return port;
}

std::string claim_message(const std::string& run_id, int nnodes, int slot, const std::string& nonce) {
  return "claim\n" + run_id + "\n" + std::to_string(nnodes) + "\n" + std::to_string(slot) + "\n" + nonce;
}

std::string master_message(const std::string& run_id, const std::string& addr, int port) {
  return "master\n" + run_id + "\n" + addr + "\n" + std::to_string(port);
}

std::string closed_message(const std::string& run_id, int round, const std::string& members) {
  return "closed\n" + run_id + "\n" + std::to_string(round) + "\n" + members;
}

}  // namespace

std::string slot_key(const std::string& run_id, int slot) {
  return "ddp_rdzv/" + run_id + "/slot/" + std::to_string(slot);
}
std::string master_key(const std::string& run_id) { return "ddp_rdzv/" + run_id + "/master"; }
std::string done_key(const std::string& run_id) { return "ddp_rdzv/" + run_id + "/done"; }
std::string endpoint_id(const std::string& run_id, const std::string& name) { return run_id + "/endpoint/" + name; }

std::string Token::proof(const std::string& message) const {
  const std::string key = secret_.empty() ? std::string(kPublicKey) : secret_;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ::HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
         message.size(), mac, &len);
  return hex(mac, len);
}

bool Token::verify(const std::string& message, const std::string& proof_hex) const {
  const std::string expected = proof(message);
  return proof_hex.size() == expected.size() && CRYPTO_memcmp(proof_hex.data(), expected.data(), expected.size()) == 0;
}

std::string make_claim(const Token& token, const std::string& run_id, int nnodes, int slot, const std::string& nonce) {
  return "claim " + nonce + " " + token.proof(claim_message(run_id, nnodes, slot, nonce));
}

bool is_valid_claim(const Token& token, const std::string& run_id, int nnodes, int slot, const std::string& value) {
  const auto parts = split_spaces(value);
  if (parts.size() != 3 || parts[0] != "claim" || !is_hex(parts[1]) || !is_hex(parts[2])) return false;
  return value == parts[0] + " " + parts[1] + " " + parts[2] &&
         token.verify(claim_message(run_id, nnodes, slot, parts[1]), parts[2]);
}

std::string make_master_record(const Token& token, const std::string& run_id, const MasterRecord& master) {
  return "master " + master.addr + " " + std::to_string(master.port) + " " +
         token.proof(master_message(run_id, master.addr, master.port));
}

std::optional<MasterRecord> parse_master_record(const Token& token, const std::string& run_id,
                                                const std::string& value, std::string& error) {
  const std::string where = "key '" + master_key(run_id) + "' holds '" + printable_value(value) + "'";
  const auto parts = split_spaces(value);
  if (parts.size() != 4 || parts[0] != "master") {
    error = where + ", not 'master <address> <port> <proof>'";
    return std::nullopt;
  }
  const auto port = parse_port(parts[2]);
  if (!port) {
    error = where + ": the port '" + printable_value(parts[2]) + "' is not a number in 1..65535";
    return std::nullopt;
  }
  if (!token.verify(master_message(run_id, parts[1], *port), parts[3])) {
    error = where + ", which no launcher of this job wrote (its proof does not match the job's DDP_RDZV_TOKEN)";
    return std::nullopt;
  }
  return MasterRecord{parts[1], *port};
}

std::string printable_value(const std::string& value) {
  std::string out;
  for (const unsigned char c : value) {
    if (out.size() >= 80) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::string round_id(const std::string& run_id, int round) { return run_id + "/r" + std::to_string(round); }
std::string closed_key(const std::string& run_id, int round) { return "ddp_rdzv/" + round_id(run_id, round) + "/closed"; }

std::string make_closed_record(const Token& token, const std::string& run_id, int round,
                               const std::vector<int>& member_slots) {
  const std::string members = format_members(member_slots);
  return "closed " + members + " " + token.proof(closed_message(run_id, round, members));
}

std::optional<std::vector<int>> parse_closed_record(const Token& token, const std::string& run_id, int round,
                                                    int max_nodes, const std::string& value, std::string& error) {
  const std::string where = "key '" + closed_key(run_id, round) + "' holds '" + printable_value(value) + "'";
  const auto parts = split_spaces(value);
  std::vector<int> members;
  if (parts.size() != 3 || parts[0] != "closed" || !parse_members(parts[1], max_nodes, members)) {
    error = where + ", not 'closed <slots> <proof>'";
    return std::nullopt;
  }
  if (!token.verify(closed_message(run_id, round, parts[1]), parts[2])) {
    error = where + ", which no launcher of this job wrote (its proof does not match the job's DDP_RDZV_TOKEN)";
    return std::nullopt;
  }
  return members;
}

std::string random_nonce() {
  std::random_device random;
  unsigned char bytes[16];
  for (auto& b : bytes) b = static_cast<unsigned char>(random());
  return hex(bytes, sizeof bytes);
}

}  // namespace ddp::launcher::rdzv
