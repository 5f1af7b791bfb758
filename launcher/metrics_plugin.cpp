// The metrics plugin: cpp-httplib serving GET /metrics (see launcher/metrics_plugin_api.h).
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "launcher/metrics_plugin_api.h"

namespace {

struct MetricsServer {
  httplib::Server server;
  std::thread thread;
};

void append(void* sink, const char* data, size_t len) { static_cast<std::string*>(sink)->append(data, len); }

}  // namespace

extern "C" __attribute__((visibility("default"))) void* ddp_metrics_start(const char* addr, int port,
                                                                           ddp_metrics_render_fn render,
                                                                           void* context, char* error,
                                                                           size_t error_len) {
  auto s = std::make_unique<MetricsServer>();
  s->server.Get("/metrics", [render, context](const httplib::Request&, httplib::Response& res) {
    std::string body;
    render(context, &body, append);
    res.set_content(body, "text/plain; version=0.0.4; charset=utf-8");
  });
  s->server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ddp_launch: Prometheus metrics are at /metrics\n", "text/plain");
  });
  if (!s->server.bind_to_port(addr, port)) {
    std::snprintf(error, error_len, "cannot listen on %s:%d for --metrics_port (in use, or not an address of this machine)",
                  addr, port);
    return nullptr;
  }
  MetricsServer* raw = s.get();
  raw->thread = std::thread([raw] { raw->server.listen_after_bind(); });
  // stop() only stops a server that is running: wait (bounded) until it is.
  for (int i = 0; i < 2000 && !raw->server.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return s.release();
}

extern "C" __attribute__((visibility("default"))) void ddp_metrics_stop(void* handle) {
  std::unique_ptr<MetricsServer> s(static_cast<MetricsServer*>(handle));
  s->server.stop();
  if (s->thread.joinable()) s->thread.join();
}
