#pragma once
// String building without fmt: see Note [Logging facade] in ddp/CMakeLists.txt.
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace ddp {

// Concatenates anything that has an operator<<: str("rank ", 3, " of ", 4) == "rank 3 of 4".
template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream out;
  if constexpr (sizeof...(Args) > 0) (out << ... << std::forward<Args>(args));
  return out.str();
}

// Joins a range with a separator: join(std::vector<int>{1, 2}, ", ") == "1, 2".
template <typename Range>
std::string join(const Range& items, const std::string& separator) {
  std::ostringstream out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out << separator;
    out << item;
    first = false;
  }
  return out.str();
}

// The text up to its first newline: exception messages (c10's carry hints and backtraces on later
// lines) become the one-line errors this project prints.
inline std::string first_line(std::string_view text) { return std::string(text.substr(0, text.find('\n'))); }

}  // namespace ddp
