#pragma once
// Outside input quoted in an error message: one line, whatever the input holds.
#include <string>
#include <string_view>

namespace ddp {

// `text` with every control character (and backslash) as \xNN: a one-line error that quotes a
// flag's value, a variable or a file's line stays one line.
inline std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : text) {
    if (c >= 0x20 && c != 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace ddp
