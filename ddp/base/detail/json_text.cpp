#include "ddp/base/detail/json_text.h"

#include <nlohmann/json.hpp>

namespace ddp::detail {

std::string json_string(std::string_view text) {
  return nlohmann::json(std::string(text)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string json_number(double value) { return nlohmann::json(value).dump(); }

}  // namespace ddp::detail
