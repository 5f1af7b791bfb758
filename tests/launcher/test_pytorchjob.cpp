// A Kubernetes PyTorchJob's pods, reproduced: the training operator starts each pod's container with
// `ddp_launch BINARY` and nothing else, and configures it only through the environment (PET_* for the
// launcher, plus the pod-level MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK of a non-elastic job). Two
// "pods" are two launchers on this machine; each worker records its environment.
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "launcher/process/net.h"
#include "tests/launcher/process_harness.h"

using namespace ddp::launcher;
using namespace ddp::launcher::process;
using namespace ddp::launcher::testing;
using namespace std::chrono_literals;

namespace {

// Starts one `ddp_launch WORKER --out DIR` per pod environment, at once, and waits for all.
void run_pods(const std::vector<std::map<std::string, std::string>>& pods, const TempDir& dir) {
  std::vector<std::unique_ptr<Child>> launchers;
  for (const auto& pod : pods) {
    launchers.push_back(std::make_unique<Child>(
        std::vector<std::string>{launcher_path(), worker_path(), "--out", dir.path()}, pod));
  }
  for (auto& launcher : launchers) {
    const auto outcome = launcher->wait(60s);
    REQUIRE(outcome);
    INFO(outcome->err);
    CHECK(outcome->exit_code == 0);
  }
}

// Every worker of a 2 pods x 2 workers job, with the launcher's ranks (not the pod's RANK/WORLD_SIZE).
void check_workers(const TempDir& dir, const std::string& run_id) {
  std::set<std::string> ports;
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    REQUIRE(wait_for_files(dir.path(), "rank" + std::to_string(rank) + ".", 1, 5s));
    const auto r = read_record(dir.path() + "/rank" + std::to_string(rank) + ".attempt0");
    CHECK(r.env.at("RANK") == std::to_string(rank));
    CHECK(r.env.at("WORLD_SIZE") == "4");
    CHECK(r.env.at("LOCAL_WORLD_SIZE") == "2");
    CHECK(r.env.at("GROUP_WORLD_SIZE") == "2");
    CHECK(r.env.at("TORCHELASTIC_MAX_RESTARTS") == "2");
    CHECK(r.env.at("TORCHELASTIC_RUN_ID") == run_id);
    ports.insert(r.env.at("MASTER_PORT"));
  }
  CHECK(ports.size() == 1);
}

}  // namespace

TEST_CASE("a non-elastic PyTorchJob's pods: ddp_launch BINARY starts the right workers", "[process][env]") {
  TempDir dir;
  const std::string port = std::to_string(pick_free_port("127.0.0.1"));
  std::vector<std::map<std::string, std::string>> pods;
  for (int pod = 0; pod < 2; ++pod) {
    // What the operator sets in pod `pod` of a job with 2 replicas (Master + Worker), nprocPerNode 2.
    pods.push_back({{"PET_NNODES", "2"}, {"PET_NPROC_PER_NODE", "2"}, {"PET_NODE_RANK", std::to_string(pod)},
                    {"PET_MASTER_ADDR", "127.0.0.1"}, {"PET_MASTER_PORT", port}, {"PET_MAX_RESTARTS", "2"},
                    {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}, {"WORLD_SIZE", "2"},
                    {"RANK", std::to_string(pod)}});
  }
  run_pods(pods, dir);
  check_workers(dir, "none");
}

TEST_CASE("an elastic PyTorchJob's pods (c10d rendezvous, older PET_N_PROC_PER_NODE)", "[process][env]") {
  TempDir dir;
  const std::string endpoint = "127.0.0.1:" + std::to_string(pick_free_port("127.0.0.1"));
  std::vector<std::map<std::string, std::string>> pods;
  for (int pod = 0; pod < 2; ++pod) {
    pods.push_back({{"PET_NNODES", "2:2"}, {"PET_N_PROC_PER_NODE", "2"}, {"PET_RDZV_BACKEND", "c10d"},
                    {"PET_RDZV_ENDPOINT", endpoint}, {"PET_RDZV_ID", "elastic-job"},
                    {"PET_RDZV_CONF", "join_timeout=30"}, {"PET_MAX_RESTARTS", "2"}});
  }
  run_pods(pods, dir);
  check_workers(dir, "elastic-job");
}
