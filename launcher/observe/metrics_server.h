#pragma once
// ddp_launch --metrics_port: serves the ProgressBoard (and NVML's GPU facts, when there is a
// driver) in Prometheus text format at http://ADDR:PORT/metrics. The HTTP server lives in a
// plugin loaded only here (see launcher/observe/metrics_plugin_api.h); no idle or slow client can keep it
// from answering a scrape (see Note [Metrics endpoint admission] in launcher/observe/metrics_plugin.cpp).
#include <memory>
#include <mutex>
#include <string>

#include "launcher/resources/gpu_select.h"
#include "launcher/observe/progress_board.h"

namespace ddp::launcher::observe {

class MetricsServer {
 public:
  // Starts serving. Throws UsageError (one line) when addr:port cannot be bound, ddp::Error when
  // the plugin is missing. `stall_s`: when /healthz says the supervision loop is stuck.
  MetricsServer(const std::string& addr, int port, const ProgressBoard& board, double stall_s);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The exposition text of this moment (what a scrape gets); called on the plugin's I/O thread.
  std::string render();
  // GET `path`: its HTTP status and body (/metrics, /healthz, /readyz; 404 otherwise).
  int answer(const std::string& path, std::string& body);

 private:
  const ProgressBoard& board_;
  double stall_s_;
  std::mutex gpu_mutex_;
  std::unique_ptr<resources::GpuProvider> gpus_;  // null without NVML
  void* handle_ = nullptr;
  void (*stop_)(void*) = nullptr;
};

}  // namespace ddp::launcher::observe
