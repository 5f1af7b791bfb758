#pragma once
// JSON values as text, for the writers of this project's JSON files (the error file, the collective
// log, the examples' metrics record). Escaping and number formatting are nlohmann-json's; this header
// does not include it (see Note [JSON through nlohmann-json]).
#include <string>
#include <string_view>

namespace ddp::detail {

// Note [JSON through nlohmann-json]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every JSON text this project reads or writes goes through nlohmann-json (Debian
// nlohmann-json3-dev), included from .cpp files only: it is a large header, and a public header that
// included it would make every user of ddp::ddp compile it. Readers parse with it directly
// (ddp/base/detail/error_file.cpp, the tests). Writers keep the layout their readers and tests rely on
// (one collective per line, torchrun's spacing in error files, inline arrays in the metrics record),
// so they lay out the text themselves and take each value from these functions.

// `text` as a JSON string literal, quotes included. Bytes that are not UTF-8 become U+FFFD (a
// message may hold anything; the file must stay valid JSON).
std::string json_string(std::string_view text);

// `value` as a JSON number in its shortest exact form ("0.9", "2.25", "1e+300"); "null" when it is
// not finite (JSON has no NaN or infinity).
std::string json_number(double value);

}  // namespace ddp::detail
