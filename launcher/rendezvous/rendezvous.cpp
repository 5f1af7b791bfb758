#include "launcher/rendezvous/rendezvous.h"

#include "ddp/base/error.h"
#include "launcher/process/net.h"
#include "launcher/rendezvous/store_rendezvous.h"

namespace ddp::launcher::rendezvous {
namespace {

class StaticRendezvous : public RendezvousHandler {
 public:
  StaticRendezvous(const config::LaunchConfig& config, int nproc) : node_(assignment_from_flags(config, nproc)) {}

  RendezvousRound next_rendezvous(int, int) override {
    if (node_.master_port == 0) {
      node_.master_port = process::pick_free_port(node_.master_addr);
    } else if (node_.node_rank == 0 && process::probe_bind(node_.master_addr, node_.master_port) == process::BindProbe::kInUse) {
      throw UsageError(ddp::str("port ", node_.master_port, " on ", node_.master_addr,
                                " is already in use: pick another --master_port, or 0 for a free one"));
    }
    return {0, node_};
  }
  int num_nodes_waiting(int) override { return 0; }

 private:
  NodeAssignment node_;
};

}  // namespace

NodeAssignment assignment_from_flags(const config::LaunchConfig& c, int nproc_per_node) {
  NodeAssignment node;
  node.nnodes = c.nnodes;
  node.nproc_per_node = nproc_per_node;
  node.run_id = c.run_id;
  node.max_restarts = c.max_restarts;
  node.role = c.role;
  node.master_addr = c.master_addr;
  node.master_port = c.master_port;
  node.node_rank = c.node_rank.value_or(0);
  return node;
}

std::unique_ptr<RendezvousHandler> make_rendezvous_handler(const config::LaunchConfig& config, int nproc_per_node) {
  if (config.rdzv_host.empty()) return std::make_unique<StaticRendezvous>(config, nproc_per_node);
  return std::make_unique<StoreRendezvous>(config, nproc_per_node);
}

}  // namespace ddp::launcher::rendezvous
