#include "ddp/base/detail/process_memory.h"

#include <fstream>
#include <sstream>
#include <string>

namespace ddp::detail {

std::int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      std::int64_t kib = 0;  // the line is "VmHWM:   1234 kB"
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

}  // namespace ddp::detail
