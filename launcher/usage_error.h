#pragma once
#include "ddp/error.h"

namespace ddp::launcher {

// Bad input (flags, environment, worker binary): main() prints it as one line on stderr and exits
// with kUsageExitCode before any worker starts.
class UsageError : public ddp::InvalidArgument {
 public:
  using ddp::InvalidArgument::InvalidArgument;
};

constexpr int kUsageExitCode = 2;

}  // namespace ddp::launcher
