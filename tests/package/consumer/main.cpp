// Uses the installed headers and library: prints "ddp <version> torch <version>", checks that a
// tensor computation runs through the linked LibTorch, and that a world-size-1 process group
// (file:// rendezvous, Gloo) all-reduces a tensor. Includes <ddp/ddp.h> only, as a user's program
// does (whole_api_probe.cpp, generated, names every public type through it).
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <unistd.h>

#include <ddp/ddp.h>

int main() {
  const auto sum = torch::ones({4}).sum().item<float>();
  if (sum != 4.0f) {
    std::cerr << "unexpected tensor sum " << sum << "\n";
    return 1;
  }
  const auto rendezvous = std::filesystem::temp_directory_path() /
                          ("ddp_consumer_rendezvous_" + std::to_string(::getpid()));
  std::filesystem::remove(rendezvous);
  ddp::InitOptions init;
  init.backend = "gloo";
  init.init_method = "file://" + rendezvous.string();
  init.rank = 0;
  init.world_size = 1;
  init.timeout = std::chrono::seconds(30);
  auto pg = ddp::init_process_group(init);
  auto t = torch::full({3}, 2.0f);
  pg->allreduce(t);
  pg->destroy();
  std::filesystem::remove(rendezvous);
  if (t.sum().item<float>() != 6.0f) {
    std::cerr << "unexpected all-reduce result " << t << "\n";
    return 1;
  }
  std::cout << "ddp " << ddp::version() << " torch " << ddp::torch_version() << " allreduce ok\n";
  return 0;
}
