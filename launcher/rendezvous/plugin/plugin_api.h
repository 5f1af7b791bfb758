#pragma once
// The C interface of the rendezvous plugin (libddp_launch_rdzv.so). The plugin links LibTorch for
// c10d's TCPStore; ddp_launch dlopen()s it only for --rdzv_endpoint, so its common path never loads
// LibTorch. Plain C types only: the two sides may be built with different C++ settings.
#ifdef __cplusplus
extern "C" {
#endif

// Opening the job's store (every c10d job's membership is rounds in it: See Note [Dynamic
// rendezvous] in launcher/rendezvous/plugin/plugin.cpp; a fixed --nnodes N job has MIN = MAX = N).
struct ddp_rdzv_request {
  const char* endpoint_host;
  int endpoint_port;
  const char* run_id;          // keys live under "ddp_rdzv/<run_id>/"
  int nnodes;                  // the job's max_nodes
  // >= 0: this node serves the store on this socket, bound to exactly the endpoint and listening
  // (the store takes it over); -1: this node is a client.
  int listen_fd;
  double timeout_s;
  const char* token;           // the job's secret (DDP_RDZV_TOKEN), "" when none: see Note [Rendezvous token]
  // 1: print only c10's fatal logs (the plugin reports every failure in one line itself); 0: leave
  // c10's logging as the user set it (TORCH_CPP_LOG_LEVEL).
  int quiet_c10_logs;
};

struct ddp_rdzv_result {
  char error[1024];  // on failure: one line saying what went wrong
};

// Releases the handle; a serving node first waits (bounded) until every member of the last round
// it joined has read that round's master.
typedef void (*ddp_rdzv_release_fn)(void* handle);

// The rounds (See Note [Elastic rounds] in launcher/rendezvous/rounds.cpp).
struct ddp_rdzv_round_request {
  int min_nodes;
  int max_nodes;
  int after_round;      // join the first open round after this one (-1: the job's first open round)
  int expected_nodes;   // close as soon as this many joined (>= min_nodes); 0: none known
  double last_call_s;   // close at >= min_nodes once no node joined for this long
  double timeout_s;     // --rdzv_timeout: below min_nodes for this long, give up
  // Where the other nodes reach this node's workers if it gets node rank 0 (its address towards the
  // endpoint), and a free port there for MASTER_PORT, fresh for each round.
  const char* advertise_addr;
  int advertise_port;
  // Called (from the calling thread) with one line to log, e.g. that the job is at max_nodes and
  // this node waits for a place; may be NULL.
  void (*note)(const char* line);
};

struct ddp_rdzv_round_result {
  int round;
  int node_rank;
  int nnodes;        // the round's members
  char master_addr[256];
  int master_port;
  int nodes_joined;  // on failure: how many nodes had joined when it gave up
  char error[1024];
};

// Opens (serving, with request->listen_fd >= 0) the job's store; joins nothing. Returns a handle for
// the calls below, or NULL with result->error set. Release it with ddp_rdzv_release.
typedef void* (*ddp_rdzv_open_fn)(const struct ddp_rdzv_request* request, struct ddp_rdzv_result* result);
// Joins the next round and waits (bounded) until it closes: 0 and result filled, or -1 with
// result->error set.
typedef int (*ddp_rdzv_round_fn)(void* handle, const struct ddp_rdzv_round_request* request,
                                 struct ddp_rdzv_round_result* result);
// How many launchers wait to join the round after `round` (>= 0; -1: the store is unreachable).
typedef int (*ddp_rdzv_waiting_fn)(void* handle, int round);

// --recovery live: marks the workers of the node `node_key` (their member ids start "<node_key>/";
// or one worker's key "<node key>/local<L>") gone in the training's membership under `prefix`,
// exactly once per worker and round (See Note
// [Marking a lost node gone] in ddp/elastic/detail/membership_keys.h; `first_round_workers`: how many it has
// before any round closed). Returns how many were marked (> 0), 0 when none of them is in the
// training now, -2 when another launcher marked them first, -1 when the store is unreachable.
typedef int (*ddp_rdzv_mark_gone_fn)(void* handle, const char* prefix, const char* node_key, int first_round_workers);

// The launchers' own channels (the job channel, the live job's liveness channel) listen on ports
// the OS picked (bind to port 0); the launcher that listens publishes where, the others look it up:
// one port per job, the rendezvous endpoint's (See Note [One port per job] in launcher/rendezvous/rendezvous.h).
struct ddp_rdzv_endpoint {
  char addr[256];
  int port;
  char error[1024];  // on failure: one line saying what went wrong
};
// Publishes addr:port under the job's `name` (a word: "job_channel/r3"), proved with the job's
// token. 0, or -1 with out->error set.
typedef int (*ddp_rdzv_publish_fn)(void* handle, const char* name, const char* addr, int port,
                                   struct ddp_rdzv_endpoint* out);
// Waits, at most timeout_s, for the endpoint published under `name`: 0 with out filled, or -1 with
// out->error set (not published in time, or a record no launcher of this job wrote).
typedef int (*ddp_rdzv_lookup_fn)(void* handle, const char* name, double timeout_s, struct ddp_rdzv_endpoint* out);

#define DDP_RDZV_PUBLISH_SYMBOL "ddp_rdzv_publish"
#define DDP_RDZV_LOOKUP_SYMBOL "ddp_rdzv_lookup"
#define DDP_RDZV_MARK_GONE_SYMBOL "ddp_rdzv_mark_gone"
#define DDP_RDZV_OPEN_SYMBOL "ddp_rdzv_open"
#define DDP_RDZV_ROUND_SYMBOL "ddp_rdzv_round"
#define DDP_RDZV_WAITING_SYMBOL "ddp_rdzv_waiting"
#define DDP_RDZV_RELEASE_SYMBOL "ddp_rdzv_release"

#ifdef __cplusplus
}
#endif
