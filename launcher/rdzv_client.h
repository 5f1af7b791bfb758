#pragma once
// ddp_launch's side of dynamic rendezvous: finds and loads libddp_launch_rdzv.so (only when
// --rdzv_endpoint is given) and asks it for this node's rank and the master address.
#include <memory>
#include <string>

namespace ddp::launcher {

struct RendezvousRequest {
  std::string endpoint_host;
  int endpoint_port = 0;
  std::string run_id;
  int nnodes = 1;
  double timeout_s = 600;
};

struct RendezvousOutcome {
  int node_rank = 0;
  std::string master_addr;
  int master_port = 0;
};

// Keeps the plugin and (on the serving node) the store alive; release it when the workers are done.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual const RendezvousOutcome& outcome() const = 0;
};

// Throws ddp::Error with a one-line message when the plugin is missing or the rendezvous fails.
std::unique_ptr<Rendezvous> join_rendezvous(const RendezvousRequest& request);

// Where the plugin is looked for: <dir of ddp_launch>/<rel>/libddp_launch_rdzv.so, rel = the install
// layout's bin->lib path, then ../lib (the build tree).
std::string find_rdzv_plugin();
// The same search for any of ddp_launch's plugins; `needed_for` (a flag) goes into the error.
std::string find_plugin(const std::string& file_name, const std::string& needed_for);

}  // namespace ddp::launcher
