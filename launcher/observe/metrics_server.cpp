#include "launcher/observe/metrics_server.h"

#include <spdlog/spdlog.h>

#include "ddp/base/error.h"
#include "launcher/observe/metrics_plugin_api.h"
#include "launcher/process/net.h"
#include "launcher/resources/nvml_provider.h"
#include "launcher/process/plugin_loader.h"

#ifndef DDP_METRICS_PLUGIN_NAME
#define DDP_METRICS_PLUGIN_NAME "libddp_launch_metrics.so"
#endif

namespace ddp::launcher::observe {
namespace {

int answer_into(void* context, const char* path, void* sink, ddp_metrics_write_fn write) {
  std::string body;
  const int status = static_cast<MetricsServer*>(context)->answer(path, body);
  write(sink, body.data(), body.size());
  return status;
}

}  // namespace

MetricsServer::MetricsServer(const std::string& addr, int port, const ProgressBoard& board, double stall_s)
    : board_(board), stall_s_(stall_s) {
  switch (process::probe_bind(addr, port)) {
    case process::BindProbe::kInUse:
      throw UsageError(ddp::str("--metrics_port ", port, " on ", addr, " is already in use: pick another port"));
    case process::BindProbe::kNotLocal:
    case process::BindProbe::kUnresolvable:
      throw UsageError(ddp::str("--metrics_addr ", addr, " is not an address of this machine"));
    case process::BindProbe::kFree:
      break;
  }
  process::SharedLibrary lib = process::SharedLibrary::load_plugin(DDP_METRICS_PLUGIN_NAME, "--metrics_port");
  lib.keep_loaded();  // its threads are joined in stop, but unloading buys nothing
  auto start = lib.symbol<ddp_metrics_start_fn>(DDP_METRICS_START_SYMBOL);
  stop_ = lib.symbol<ddp_metrics_stop_fn>(DDP_METRICS_STOP_SYMBOL);
  try {
    gpus_ = resources::load_nvml_provider();
  } catch (const std::exception& e) {
    spdlog::debug("no GPU series in the metrics: {}", e.what());
  }
  char error[512] = {0};
  handle_ = start(addr.c_str(), port, answer_into, this, error, sizeof error);
  if (handle_ == nullptr) throw UsageError(error);
  const bool v6 = addr.find(':') != std::string::npos;
  spdlog::info("serving Prometheus metrics at http://{}{}{}:{}/metrics (probes: /healthz, /readyz)", v6 ? "[" : "",
               addr, v6 ? "]" : "", port);
}

MetricsServer::~MetricsServer() {
  if (handle_ != nullptr) stop_(handle_);
}

std::string MetricsServer::render() {
  std::vector<resources::GpuInfo> gpus;
  if (gpus_) {
    std::lock_guard<std::mutex> lock(gpu_mutex_);
    try {
      gpus = gpus_->gpus();
    } catch (const std::exception& e) {
      spdlog::warn("metrics: reading the GPUs failed: {}", e.what());
    }
  }
  return render_prometheus(board_.snapshot(), gpus);
}

int MetricsServer::answer(const std::string& path, std::string& body) {
  if (path == "/metrics") {
    body = render();
    return 200;
  }
  if (path != "/healthz" && path != "/readyz") {
    body = "not found\n";
    return 404;
  }
  const ProbeAnswer probe = path == "/healthz" ? board_.liveness(SteadyClock::now(), stall_s_) : board_.readiness();
  body = probe.text + "\n";
  return probe.ok ? 200 : 503;
}

}  // namespace ddp::launcher::observe
