#pragma once
// The C interface of the metrics plugin (libddp_launch_metrics.so): an HTTP server (Debian's
// cpp-httplib, a compiled library that pulls in OpenSSL, zlib and brotli) that serves /metrics and
// the health endpoints /healthz and /readyz (See Note [Health endpoints] in progress_board.h).
// ddp_launch dlopen()s it only for --metrics_port, so that its common path keeps its fast start.
// Plain C types only.
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Appends len bytes to the response body.
typedef void (*ddp_metrics_write_fn)(void* sink, const char* data, size_t len);
// Writes the answer to GET `path` ("/metrics", "/healthz" or "/readyz") and returns its HTTP
// status; called on the server's threads, once per request.
typedef int (*ddp_metrics_render_fn)(void* context, const char* path, void* sink, ddp_metrics_write_fn write);

// Binds addr:port and serves GET /metrics, /healthz and /readyz on threads of its own (one accepts, one does all the
// connections' I/O with per-connection deadlines and a cap on open connections: see Note [Metrics
// endpoint admission] in metrics_plugin.cpp); render is called on the I/O thread. Returns a handle,
// or NULL with a one-line reason in error.
typedef void* (*ddp_metrics_start_fn)(const char* addr, int port, ddp_metrics_render_fn render, void* context,
                                      char* error, size_t error_len);
// Stops serving and joins the server's threads.
typedef void (*ddp_metrics_stop_fn)(void* handle);

#define DDP_METRICS_START_SYMBOL "ddp_metrics_start"
#define DDP_METRICS_STOP_SYMBOL "ddp_metrics_stop"

#ifdef __cplusplus
}
#endif
