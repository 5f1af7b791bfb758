#pragma once
// The c10d-store rendezvous (--rdzv_endpoint): ddp_launch's side of it. It loads
// libddp_launch_rdzv.so (only then: the launcher's common path never loads LibTorch), binds the
// endpoint when this node can serve it, and asks the plugin for this node's assignment.
// See Note [Dynamic rendezvous] in rdzv_plugin.cpp.
#include <memory>
#include <string>

#include "launcher/rendezvous.h"

namespace ddp::launcher {

// Where this node stands towards the store: the address it advertises if it gets node rank 0, and
// the endpoint's socket, bound and listening, when this node serves the store (-1: a client).
struct StoreEndpoint {
  std::string advertise;
  int listen_fd = -1;
};
StoreEndpoint open_store_endpoint(const LaunchConfig& config);

std::unique_ptr<RendezvousHandler> make_store_rendezvous(const LaunchConfig& config, int nproc_per_node);

}  // namespace ddp::launcher
