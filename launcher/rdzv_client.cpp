#include "launcher/rdzv_client.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <vector>

#include "ddp/base/error.h"
#include "launcher/net.h"
#include "launcher/rdzv_plugin_api.h"

#ifndef DDP_RDZV_PLUGIN_NAME
#define DDP_RDZV_PLUGIN_NAME "libddp_launch_rdzv.so"
#endif
#ifndef DDP_RDZV_PLUGIN_RELDIR
#define DDP_RDZV_PLUGIN_RELDIR "../lib"
#endif

namespace ddp::launcher {
namespace {

class PluginRendezvous : public Rendezvous {
 public:
  PluginRendezvous(void* lib, void* handle, ddp_rdzv_release_fn release, RendezvousOutcome outcome)
      : lib_(lib), handle_(handle), release_(release), outcome_(std::move(outcome)) {}
  ~PluginRendezvous() override {
    release_(handle_);
    // The plugin stays loaded: LibTorch does not support being unloaded.
    (void)lib_;
  }
  const RendezvousOutcome& outcome() const override { return outcome_; }

 private:
  void* lib_;
  void* handle_;
  ddp_rdzv_release_fn release_;
  RendezvousOutcome outcome_;
};

}  // namespace

std::string find_plugin(const std::string& file_name, const std::string& needed_for) {
  char exe[PATH_MAX] = {0};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string dir = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string(".");
  dir = dir.substr(0, dir.rfind('/'));
  std::vector<std::string> candidates{dir + "/" DDP_RDZV_PLUGIN_RELDIR "/" + file_name, dir + "/../lib/" + file_name};
  for (const auto& c : candidates) {
    if (::access(c.c_str(), R_OK) == 0) return c;
  }
  throw ddp::Error(ddp::str(needed_for, " needs the plugin ", file_name, ", looked for ", candidates.front(), " and ",
                            candidates.back(), ": build or install it with ddp_launch"));
}

std::string find_rdzv_plugin() { return find_plugin(DDP_RDZV_PLUGIN_NAME, "--rdzv_endpoint"); }

std::unique_ptr<Rendezvous> join_rendezvous(const RendezvousRequest& request) {
  const std::string path = find_rdzv_plugin();
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) throw ddp::Error(ddp::str("cannot load ", path, ": ", ::dlerror()));
  auto join = reinterpret_cast<ddp_rdzv_join_fn>(::dlsym(lib, DDP_RDZV_JOIN_SYMBOL));
  auto release = reinterpret_cast<ddp_rdzv_release_fn>(::dlsym(lib, DDP_RDZV_RELEASE_SYMBOL));
  if (join == nullptr || release == nullptr) throw ddp::Error(ddp::str(path, " is not a ddp_launch rendezvous plugin"));

  // See Note [Dynamic rendezvous] in rdzv_plugin.cpp.
  const bool serve = probe_bind(request.endpoint_host, request.endpoint_port) == BindProbe::kFree;
  const std::string advertise = local_address_towards(request.endpoint_host, request.endpoint_port);
  const int port = pick_free_port(advertise);
  ddp_rdzv_request req{request.endpoint_host.c_str(), request.endpoint_port, request.run_id.c_str(),
                       request.nnodes, serve ? 1 : 0, advertise.c_str(), port, request.timeout_s};
  ddp_rdzv_result result{};
  void* handle = join(&req, &result);
  if (handle == nullptr) throw ddp::TimeoutError(result.error);
  RendezvousOutcome outcome;
  outcome.node_rank = result.node_rank;
  outcome.master_addr = result.master_addr;
  outcome.master_port = result.master_port;
  return std::make_unique<PluginRendezvous>(lib, handle, release, std::move(outcome));
}

}  // namespace ddp::launcher
