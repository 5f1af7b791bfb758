// ProcessGroup::abort() on the backend: an NCCL group's communicators are aborted through c10d's
// Backend::abort(), a Gloo group's backend is left alone (its waits poll the flag). See Note
// [Aborting a group] in ddp/distributed/process_group.cpp. A recording backend stands in for ProcessGroupNCCL,
// which needs a GPU; the CUDA build compiles the same call against it.
#include <catch2/catch.hpp>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <string>

#include "ddp/distributed/process_group.h"

namespace {

class RecordingBackend : public c10d::Backend {
 public:
  RecordingBackend() : c10d::Backend(0, 1) {}
  void abort() override { ++aborts; }
  const std::string getBackendName() const override { return "recording"; }
  int aborts = 0;
};

int aborts_after_two_aborts(const std::string& backend_name) {
  auto backend = c10::make_intrusive<RecordingBackend>();
  ddp::ProcessGroup::Info info;
  info.backend_name = backend_name;
  ddp::ProcessGroup group(info, c10::make_intrusive<c10d::HashStore>(), backend);
  CHECK_FALSE(group.aborted());
  group.abort();
  group.abort();
  CHECK(group.aborted());
  return backend->aborts;
}

}  // namespace

TEST_CASE("abort() aborts an NCCL group's communicators once and leaves a Gloo backend alone", "[group_abort]") {
  CHECK(aborts_after_two_aborts("nccl") == 1);
  CHECK(aborts_after_two_aborts("gloo") == 0);
}
