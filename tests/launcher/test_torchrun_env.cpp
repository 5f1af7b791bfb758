// torchrun's environment around ddp_launch: PET_ variables (Kubeflow's PyTorchJob sets nothing
// else), the free port on one node, the endpoint forms, Python targets, and the worker's variables.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "launcher/config/config.h"
#include "launcher/agent/worker_variables.h"
#include "tests/launcher/config_support.h"

using namespace ddp::launcher;
using namespace ddp::launcher::agent;
using namespace ddp::launcher::config;
using namespace ddp::launcher::rendezvous;
using namespace ddp::launcher::testing;
using ddp::EnvironmentSnapshot;

TEST_CASE("a PyTorchJob's PET_ variables alone configure the node", "[launcher][config][pet]") {
  // Non-elastic PyTorchJob (the operator's variables; MASTER_*/RANK/WORLD_SIZE are the pod's too).
  const auto job = parse({"/bin/true"}, plain_env({{"PET_NNODES", "3"}, {"PET_NPROC_PER_NODE", "2"},
                                                       {"PET_NODE_RANK", "2"}, {"PET_MASTER_ADDR", "job-master-0"},
                                                       {"PET_MASTER_PORT", "23456"}, {"MASTER_ADDR", "job-master-0"},
                                                       {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "3"}, {"RANK", "2"}}));
  CHECK(job.nnodes == 3);
  CHECK(job.nproc.number == 2);
  CHECK(job.node_rank == 2);
  CHECK(job.master_addr == "job-master-0");
  CHECK(job.master_port == 23456);
  // Elastic PyTorchJob: a c10d endpoint, an id, the older spelling of nproc, restarts.
  const auto elastic = parse(
      {"/bin/true"}, plain_env({{"PET_NNODES", "2"}, {"PET_N_PROC_PER_NODE", "4"}, {"PET_RDZV_BACKEND", "c10d"},
                               {"PET_RDZV_ENDPOINT", "job-elastic-worker-0:23456"}, {"PET_RDZV_ID", "job-elastic"},
                               {"PET_RDZV_CONF", "join_timeout=120"}, {"PET_MAX_RESTARTS", "3"}}));
  CHECK(elastic.nnodes == 2);
  CHECK(elastic.nproc.number == 4);
  CHECK(elastic.rdzv_host == "job-elastic-worker-0");
  CHECK(elastic.rdzv_port == 23456);
  CHECK(elastic.rdzv_id == "job-elastic");
  CHECK(elastic.rdzv_timeout_s == Approx(120));
  CHECK(elastic.max_restarts == 3);
  CHECK_FALSE(elastic.node_rank.has_value());  // assigned at rendezvous
  // A flag beats its variable; PET_STANDALONE is a switch.
  CHECK(parse({"--nproc_per_node", "1", "/bin/true"}, plain_env({{"PET_N_PROC_PER_NODE", "4"}})).nproc.number == 1);
  CHECK(parse({"/bin/true"}, plain_env({{"PET_STANDALONE", "1"}})).standalone);
}

TEST_CASE("one node without --master_port: a free port; --master_port P: exactly P", "[launcher][config][pet]") {
  CHECK(parse({"/bin/true"}).master_port == 0);
  CHECK(parse({"--standalone", "/bin/true"}).master_port == 0);
  CHECK(parse({"--master_port", "29611", "/bin/true"}).master_port == 29611);
  const auto standalone = parse({"--standalone", "--master_port", "29611", "/bin/true"});
  CHECK(standalone.master_port == 29611);
  CHECK(standalone.master_addr == "127.0.0.1");
  CHECK(parse({"/bin/true"}, plain_env({{"PET_MASTER_PORT", "29612"}})).master_port == 29612);
  // Across nodes the port must be agreed in advance: torchrun's 29500.
  CHECK(parse({"--nnodes", "2", "--node_rank", "1", "/bin/true"}).master_port == 29500);
}

TEST_CASE("--rdzv_endpoint HOST takes port 29400; HOST:0 on one node is a free port", "[launcher][config][pet]") {
  const auto bare = parse({"--nnodes", "2", "--rdzv_endpoint", "node1", "/bin/true"});
  CHECK(bare.rdzv_host == "node1");
  CHECK(bare.rdzv_port == 29400);
  const auto v6 = parse({"--nnodes", "2", "--rdzv_endpoint", "[fd00::1]", "/bin/true"});
  CHECK(v6.rdzv_host == "fd00::1");
  CHECK(v6.rdzv_port == 29400);
  CHECK(parse({"--nnodes", "2", "--rdzv_endpoint", "[fd00::1]:123", "/bin/true"}).rdzv_port == 123);
  const auto free = parse({"--rdzv_endpoint", "localhost:0", "/bin/true"});
  CHECK(free.rdzv_host.empty());  // one node: no rendezvous store, a free master port
  CHECK(free.master_port == 0);
  CHECK(free.node_rank == 0);
}

TEST_CASE("Python targets run as torchrun runs them", "[launcher][config][python]") {
  const std::string script = "/tmp/ddp_launch_test_target_" + std::to_string(::getpid()) + ".py";
  std::ofstream(script) << "print('hi')\n";
  const auto env = plain_env({{"PYTHON", "/bin/sh"}});  // any executable stands in for the interpreter
  const auto py = parse({script, "--epochs", "2"}, env);
  CHECK(py.program_path == "/bin/sh");
  CHECK(py.program_args == std::vector<std::string>{"/bin/sh", "-u", script, "--epochs", "2"});
  CHECK(parse({"--run_path", script}, env).program_args == std::vector<std::string>{"/bin/sh", "-u", script});
  CHECK(parse({"-m", "pkg.train", "x"}, env).program_args ==
        std::vector<std::string>{"/bin/sh", "-u", "-m", "pkg.train", "x"});
  // --python beats $PYTHON_EXEC beats $PYTHON.
  CHECK(parse({"--python", "/bin/true", script}, env).program_path == "/bin/true");
  CHECK(parse({script}, plain_env({{"PYTHON_EXEC", "/bin/true"}, {"PYTHON", "/bin/sh"}})).program_path ==
        "/bin/true");
  // Without any, python3 on PATH.
  CHECK_THROWS_WITH(parse({script}, EnvironmentSnapshot::from_map({{"PATH", "/nonexistent"}})),
                    Catch::Contains("'python3' not found in PATH"));
  // --no_python execs the target, whatever its name.
  const auto no_python = parse({"--no_python", "/bin/true"}, env);
  CHECK(no_python.program_args == std::vector<std::string>{"/bin/true"});
  std::remove(script.c_str());
}

TEST_CASE("workers get torchrun's whole environment", "[launcher][worker_env]") {
  NodeAssignment node;
  WorkerSlot slot;
  slot.signals_to_handle = "SIGTERM,SIGUSR1";
  std::map<std::string, std::string> vars;
  for (const auto& entry : worker_environment({}, node, slot)) {
    vars.emplace(entry.substr(0, entry.find('=')), entry.substr(entry.find('=') + 1));
  }
  CHECK(vars.at("ROLE_NAME") == "default");
  CHECK(vars.at("TORCHELASTIC_SIGNALS_TO_HANDLE") == "SIGTERM,SIGUSR1");
  CHECK(vars.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1");
  CHECK(vars.count("TORCHELASTIC_USE_AGENT_STORE") == 0);  // See Note [torchrun's worker environment]
  // The user's setting stays.
  bool kept = false;
  for (const auto& entry : worker_environment({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}}, node, slot)) {
    kept = kept || entry == "TORCH_NCCL_ASYNC_ERROR_HANDLING=3";
  }
  CHECK(kept);
  // The config carries --signals_to_handle's text as given.
  CHECK(parse({"--signals_to_handle", "SIGTERM,SIGUSR1", "/bin/true"}).signals_to_handle == "SIGTERM,SIGUSR1");
}

TEST_CASE("Slurm's placement outside an srun step is taken with a warning", "[launcher][config][slurm]") {
  std::map<std::string, std::string> batch = {{"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_NNODES", "3"},
                                              {"SLURM_NODEID", "0"}, {"SLURM_JOB_ID", "9"}};
  const auto in_batch_script = parse({"/bin/true"}, plain_env(batch));
  REQUIRE(in_batch_script.warnings.size() == 1);
  CHECK_THAT(in_batch_script.warnings[0], Catch::Contains("srun --ntasks-per-node 1 ddp_launch"));
  batch.emplace("SLURM_STEP_ID", "0");
  CHECK(parse({"/bin/true"}, plain_env(batch)).warnings.empty());
}
