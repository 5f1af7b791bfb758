#pragma once
// A c10d store holds bytes; the project keeps text in it (ranks, statuses, rendezvous records), and
// says how long it waited in seconds. One home for both conversions (the process group, the
// rendezvous plugin, main_process_first).
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::detail {

inline std::vector<uint8_t> to_bytes(std::string_view text) { return std::vector<uint8_t>(text.begin(), text.end()); }
inline std::string bytes_to_text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
// For messages: "waited 2.5 s".
inline double seconds_of(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

}  // namespace ddp::detail
