#include "ddp/base/detail/hostlist.h"

#include <cctype>

#include "ddp/base/error.h"

namespace ddp::detail {
namespace {

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw UsageError(ddp::str("malformed Slurm host list '", text, "': ", why));
}

bool all_digits(const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; }

// "3186000-3186002" or "001-003" or "7" -> the numbers as text, keeping the zero padding of the
// lower bound (Slurm pads every number of a range to the width of its first bound).
std::vector<std::string> expand_range(const std::string& text, const std::string& item) {
  const auto dash = item.find('-');
  if (dash == std::string::npos) {
    if (!all_digits(item)) bad(text, ddp::str("'", item, "' is not a number"));
    return {item};
  }
  const std::string lo_text = item.substr(0, dash);
  const std::string hi_text = item.substr(dash + 1);
  if (!all_digits(lo_text) || !all_digits(hi_text) || lo_text.size() > 18 || hi_text.size() > 18) {
    bad(text, ddp::str("'", item, "' is not a range like 1-4"));
  }
  const long long lo = std::stoll(lo_text);
  const long long hi = std::stoll(hi_text);
  if (hi < lo) bad(text, ddp::str("range '", item, "' goes backwards"));
  if (hi - lo > 100000) bad(text, ddp::str("range '", item, "' is too large"));
  std::vector<std::string> out;
  for (long long v = lo; v <= hi; ++v) {
    std::string digits = std::to_string(v);
    if (digits.size() < lo_text.size()) digits.insert(0, lo_text.size() - digits.size(), '0');
    out.push_back(std::move(digits));
  }
  return out;
}

// One host expression without top-level commas, e.g. "rack[1-2]-n[01,03]".
std::vector<std::string> expand_one(const std::string& text, const std::string& expr) {
  std::vector<std::string> prefixes{""};
  size_t i = 0;
  while (i < expr.size()) {
    const size_t open = expr.find('[', i);
    const std::string literal = expr.substr(i, open == std::string::npos ? std::string::npos : open - i);
    if (literal.find(']') != std::string::npos) bad(text, "']' without '['");
    for (auto& p : prefixes) p += literal;
    if (open == std::string::npos) break;
    const size_t close = expr.find(']', open);
    if (close == std::string::npos) bad(text, "'[' without ']'");
    const std::string inside = expr.substr(open + 1, close - open - 1);
    if (inside.empty()) bad(text, "empty brackets");
    if (inside.find('[') != std::string::npos) bad(text, "nested brackets");
    std::vector<std::string> numbers;
    size_t start = 0;
    while (start <= inside.size()) {
      size_t comma = inside.find(',', start);
      if (comma == std::string::npos) comma = inside.size();
      for (auto& n : expand_range(text, inside.substr(start, comma - start))) numbers.push_back(n);
      start = comma + 1;
    }
    std::vector<std::string> next;
    for (const auto& p : prefixes) {
      for (const auto& n : numbers) next.push_back(p + n);
    }
    prefixes = std::move(next);
    i = close + 1;
  }
  return prefixes;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& text) {
  std::vector<std::string> hosts;
  int depth = 0;
  std::string current;
  auto flush = [&] {
    if (current.empty()) bad(text, "empty host name");
    for (auto& h : expand_one(text, current)) hosts.push_back(std::move(h));
    current.clear();
  };
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) bad(text, "unbalanced brackets");
    if (c == ',' && depth == 0) {
      flush();
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      bad(text, "whitespace in host list");
    } else {
      current += c;
    }
  }
  if (depth != 0) bad(text, "'[' without ']'");
  flush();
  return hosts;
}

}  // namespace ddp::detail
