// Uses the installed headers and library: prints "ddp <version> torch <version>" and checks that a
// tensor computation runs through the linked LibTorch.
#include <torch/torch.h>

#include <iostream>

#include "ddp/version.h"

int main() {
  const auto sum = torch::ones({4}).sum().item<float>();
  if (sum != 4.0f) {
    std::cerr << "unexpected tensor sum " << sum << "\n";
    return 1;
  }
  std::cout << "ddp " << ddp::version() << " torch " << ddp::torch_version() << "\n";
  return 0;
}
