#pragma once
// Rendezvous: how this node learns its place in the job (node rank, master address and port), as
// torchrun's RendezvousHandler. Two implementations: static (the flags say it all: --node_rank,
// --master_addr, --master_port or Slurm's variables) and the c10d store (--rdzv_endpoint, in
// launcher/rdzv_client.h). The assignment is settled once, before anything else is built on it.
#include <memory>
#include <string>

#include "launcher/config.h"
#include "launcher/worker_env.h"

namespace ddp::launcher {

class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;
  // Settles this node's assignment: blocks (bounded by --rdzv_timeout) until it is known. Throws
  // UsageError for bad input (a master port in use), ddp::Error with one line otherwise. Keep the
  // handler alive until the workers are done (a serving node's store lives in it).
  virtual NodeAssignment next_rendezvous() = 0;
  // Whether next_rendezvous() needs other nodes (a dry run then shows placeholders).
  virtual bool is_dynamic() const = 0;
};

// What the flags alone say about this node (node rank 0 and the flags' master when a dynamic
// rendezvous assigns them). Pure.
NodeAssignment assignment_from_flags(const LaunchConfig& config, int nproc_per_node);

// The static rendezvous: assignment_from_flags(), with --master_port 0 replaced by a free port and,
// on the rank-0 node, the master port checked to be free.
std::unique_ptr<RendezvousHandler> make_static_rendezvous(const LaunchConfig& config, int nproc_per_node);

// The handler the configuration asks for: the store's with --rdzv_endpoint, else the static one.
std::unique_ptr<RendezvousHandler> make_rendezvous_handler(const LaunchConfig& config, int nproc_per_node);

}  // namespace ddp::launcher
