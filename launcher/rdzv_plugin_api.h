#pragma once
// The C interface of the rendezvous plugin (libddp_launch_rdzv.so). The plugin links LibTorch for
// c10d's TCPStore; ddp_launch dlopen()s it only for --rdzv_endpoint, so its common path never loads
// LibTorch. Plain C types only: the two sides may be built with different C++ settings.
#ifdef __cplusplus
extern "C" {
#endif

struct ddp_rdzv_request {
  const char* endpoint_host;
  int endpoint_port;
  const char* run_id;          // keys live under "ddp_rdzv/<run_id>/"
  int nnodes;
  // >= 0: this node serves the store on this socket, bound to exactly the endpoint and listening
  // (the store takes it over); -1: this node is a client.
  int listen_fd;
  const char* advertise_addr;  // where the other nodes reach this node's workers, if it gets rank 0
  int advertise_port;          // a free port there, for MASTER_PORT if it gets rank 0
  double timeout_s;
  const char* token;           // the job's secret (DDP_RDZV_TOKEN), "" when none: see Note [Rendezvous token]
  // 1: print only c10's fatal logs (the plugin reports every failure in one line itself); 0: leave
  // c10's logging as the user set it (TORCH_CPP_LOG_LEVEL).
  int quiet_c10_logs;
};

struct ddp_rdzv_result {
  int node_rank;
  char master_addr[256];
  int master_port;
  int nodes_joined;  // on failure: how many nodes had joined when it gave up
  char error[1024];  // on failure: one line saying what went wrong
};

// Joins the rendezvous. Returns a handle (keep it until the workers are done: a serving node's store
// lives in it) or NULL with result->error set.
typedef void* (*ddp_rdzv_join_fn)(const struct ddp_rdzv_request* request, struct ddp_rdzv_result* result);
// Releases the handle; a serving node first waits (bounded) until every node has read the result.
typedef void (*ddp_rdzv_release_fn)(void* handle);

#define DDP_RDZV_JOIN_SYMBOL "ddp_rdzv_join"
#define DDP_RDZV_RELEASE_SYMBOL "ddp_rdzv_release"

#ifdef __cplusplus
}
#endif
