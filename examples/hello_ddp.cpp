// The smallest program to start with ddp_launch (no LibTorch): prints where it runs and exits 0.
//   build/bin/ddp_launch --standalone --nproc_per_node 2 build/bin/hello_ddp
#include <cstdio>
#include <cstdlib>

int main() {
  auto get = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "?";
  };
  std::printf("hello from rank %s of %s (local rank %s, master %s:%s)\n", get("RANK"), get("WORLD_SIZE"),
              get("LOCAL_RANK"), get("MASTER_ADDR"), get("MASTER_PORT"));
  return 0;
}
