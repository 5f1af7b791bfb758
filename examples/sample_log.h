#pragma once
// --log-samples DIR (a debug flag for the tests): each rank writes the indices of the samples it
// trains on, one "epoch index" line each, to a file of its own in DIR, so that a test can check that
// an epoch interrupted and resumed at another world size covered every sample exactly once.
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/base/detail/files.h"

namespace ddp::examples {

class SampleLog {
 public:
  // Creates DIR/samples-world<W>-rank<R>-pid<P>.txt (a new file: ddp/base/detail/files.h). Empty dir: off.
  SampleLog(const std::string& dir, int64_t world_size, int64_t rank);
  bool enabled() const { return fd_.valid(); }
  // Appends one line per sample of a trained micro-batch (no-op when off).
  void write(int64_t epoch, const std::vector<int64_t>& samples);

 private:
  std::string path_;
  detail::FileDescriptor fd_;
};

}  // namespace ddp::examples
