// Calls only the library, no LibTorch function of its own, and is linked with --as-needed: its link
// keeps no LibTorch library, so it starts only when the installed libddp.so finds LibTorch's
// libraries by itself (its install run path), as a user's program whose link drops them does.
#include <cstdio>

#include <ddp/ddp.h>

int main() {
  std::printf("ddp %s torch %s\n", ddp::version().c_str(), ddp::torch_version().c_str());
  return 0;
}
