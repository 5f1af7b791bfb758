#pragma once
// Rendezvous: how this node learns its place in the job (node rank, master address and port), as
// torchrun's RendezvousHandler. Two implementations: static (the flags say it all: --node_rank,
// --master_addr, --master_port or Slurm's variables) and the c10d store's rounds (--rdzv_endpoint,
// in launcher/rendezvous/store_rendezvous.h). The assignment is settled once, before anything else is built on it.
#include <memory>
#include <string>

#include "launcher/config/config.h"

namespace ddp::launcher::rendezvous {

// Note [One port per job]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A job needs one fixed port, as under torchrun: the rendezvous endpoint's (--rdzv_endpoint), or
// --master_port for a static multi-node job. Everything else the launchers tell each other goes
// over a port the OS picked (bind to port 0), found through that one port:
// - with a rendezvous store, the launcher that listens (node 0's job channel, the store host's
//   liveness channel under --recovery live) publishes its address and port in the store, proved
//   with the job's token (EndpointDirectory, the plugin's ddp_rdzv_publish); the others look it
//   up, bounded by --rdzv_timeout;
// - a static multi-node job has no store: node 0's launcher listens on --master_port itself (its
//   job channel, as torchrun's static rendezvous serves its store there), and its workers' store
//   gets a port the OS picked on node 0; the coordinator tells every launcher that port in its
//   welcome ("store <port>"), so a node starts its workers only once node 0's launcher is up
//   (MASTER_PORT in their environment is that port).
// A free port's neighbour is not free: no channel ever listens on a fixed offset of another port.
struct Endpoint {
  std::string addr;
  int port = 0;
};

// Where the launchers' own channels listen (See Note [One port per job]).
class EndpointDirectory {
 public:
  virtual ~EndpointDirectory() = default;
  // Publishes this launcher's listening `endpoint` as `name`. Throws ddp::Error with one line.
  virtual void publish(const std::string& name, const Endpoint& endpoint) = 0;
  // The endpoint published as `name`, waiting at most timeout_s. Throws ddp::TimeoutError.
  virtual Endpoint lookup(const std::string& name, double timeout_s) = 0;
};

// Where this node sits in the job, once rendezvous (static or dynamic) is done.
struct NodeAssignment {
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string run_id = "none";
  int max_restarts = 0;
  std::string role = "default";  // ROLE_NAME (--role)
  // --recovery live: the prefix of this node's workers' member ids ("" : "node<node_rank>"); See
  // Note [Lost hosts in a live job] in launcher/channel/live_watch.cpp.
  std::string live_node_key;
};

// One closed rendezvous round, as this node sees it.
struct RendezvousRound {
  int round = 0;        // the job's round number: TORCHELASTIC_RESTART_COUNT of an elastic job's workers
  NodeAssignment node;  // node rank, nnodes (the round's members), master of the round
};

// The one rendezvous interface, as torchrun's RendezvousHandler: the static rendezvous (the flags
// say it all) and the c10d store's rounds (store_rendezvous.h: one round for a fixed-size job).
class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;
  // Joins the first open round after `after_round` (-1: the job's first) and blocks, bounded by
  // --rdzv_timeout, until it closes; `expected_nodes` (0: unknown) lets an elastic round close
  // without the last call. A fixed-size job has one round. Throws UsageError for bad input (a
  // master port in use), ddp::Error with one line otherwise (below MIN: how many came, and MIN).
  virtual RendezvousRound next_rendezvous(int after_round, int expected_nodes) = 0;
  // How many launchers wait to join the round after `round`; 0 where no newcomer can join (the
  // static rendezvous, a fixed-size job), -1 when the store did not answer.
  virtual int num_nodes_waiting(int round) = 0;
  // The store's directory of the launchers' channels; nullptr for the static rendezvous (no store:
  // See Note [One port per job]). Valid after next_rendezvous().
  virtual EndpointDirectory* directory() { return nullptr; }
  // This node is done with the rendezvous: a store it serves goes away once every node has read
  // the round (bounded by --rdzv_timeout). Called once the launchers' channels are closed.
  virtual void shutdown() {}
};

// What the flags alone say about this node (node rank 0 and the flags' master when a dynamic
// rendezvous assigns them). Pure.
NodeAssignment assignment_from_flags(const config::LaunchConfig& config, int nproc_per_node);

// The handler the configuration asks for: the static one (assignment_from_flags(), with
// --master_port 0 replaced by a free port and, on the rank-0 node, the master port checked to be
// free) without --rdzv_endpoint; with it, the c10d store's rounds (MIN = MAX for a fixed --nnodes).
std::unique_ptr<RendezvousHandler> make_rendezvous_handler(const config::LaunchConfig& config, int nproc_per_node);

}  // namespace ddp::launcher::rendezvous
