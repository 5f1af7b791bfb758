#include "examples/sample_log.h"

#include <unistd.h>

#include "ddp/base/str.h"

namespace ddp::examples {

SampleLog::SampleLog(const std::string& dir, int64_t world_size, int64_t rank) {
  if (dir.empty()) return;
  path_ = str(dir, "/samples-world", world_size, "-rank", rank, "-pid", ::getpid(), ".txt");
  fd_ = detail::create_new_file(path_, 0600, /*append=*/true);
}

void SampleLog::write(int64_t epoch, const std::vector<int64_t>& samples) {
  if (!fd_.valid() || samples.empty()) return;
  std::string lines;
  for (int64_t sample : samples) lines += str(epoch, " ", sample, "\n");
  detail::write_all(fd_.get(), lines.data(), lines.size(), path_);
}

}  // namespace ddp::examples
