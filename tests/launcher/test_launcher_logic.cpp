// Unit tests of ddp_launch's pure logic: flags, environment, host lists, GPU choice, error files.
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <algorithm>
#include <fstream>
#include <numeric>
#include <set>

#include "launcher/config/config.h"
#include "tests/launcher/config_support.h"
#include "ddp/base/detail/error_file.h"
#include "launcher/resources/gpu_select.h"
#include "ddp/base/detail/hostlist.h"
#include "launcher/process/line_splitter.h"
#include "launcher/process/log_layout.h"
#include "launcher/resources/resources.h"
#include "launcher/agent/supervisor.h"
#include "launcher/agent/worker_variables.h"
#include "launcher/process/worker_process.h"

using namespace ddp::launcher;
using namespace ddp::launcher::agent;
using namespace ddp::launcher::config;
using namespace ddp::launcher::process;
using namespace ddp::launcher::rendezvous;
using namespace ddp::launcher::resources;
using namespace ddp::launcher::testing;
using ddp::EnvironmentSnapshot;
using ddp::UsageError;
using ddp::detail::WorkerError;
using ddp::detail::parse_error_json;
using ddp::detail::read_error_file;
using ddp::detail::format_error_json;
using ddp::detail::write_error_file;

namespace {

std::map<std::string, std::string> as_map(const std::vector<std::pair<std::string, std::string>>& vars) {
  return {vars.begin(), vars.end()};
}

}  // namespace

TEST_CASE("flags take torchrun's names in both spellings", "[launcher][config]") {
  const auto a = parse({"--nproc_per_node", "4", "--nnodes=2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                        "--master_port=1234", "/bin/true"});
  CHECK(a.nproc.number == 4);
  CHECK(a.nnodes == 2);
  CHECK(a.node_rank == 1);
  CHECK(a.master_addr == "10.0.0.1");
  CHECK(a.master_port == 1234);
  const auto b = parse({"--nproc-per-node=3", "--max-restarts", "2", "--shutdown-grace", "0.5", "/bin/true"});
  CHECK(b.nproc.number == 3);
  CHECK(b.max_restarts == 2);
  CHECK(b.shutdown_grace_s == Approx(0.5));
}

TEST_CASE("defaults follow torchrun", "[launcher][config]") {
  const auto c = parse({"/bin/true"});
  CHECK(c.nnodes == 1);
  CHECK(c.node_rank == 0);
  CHECK(c.nproc.number == 1);
  CHECK(c.master_addr == "127.0.0.1");
  CHECK(c.master_port == 0);  // one node: a free port (See Note [Free port on one node])
  CHECK(c.run_id == "none");
  CHECK(c.max_restarts == 0);
  CHECK(c.shutdown_grace_s == Approx(10));
  CHECK_FALSE(c.dry_run);
}

TEST_CASE("the worker's arguments pass verbatim, flags included", "[launcher][config]") {
  const auto c = parse({"--nproc_per_node", "2", "/bin/echo", "--nproc_per_node", "9", "a b", "--", "-x"});
  CHECK(c.program_path == "/bin/echo");
  CHECK(c.program_args == std::vector<std::string>{"/bin/echo", "--nproc_per_node", "9", "a b", "--", "-x"});
  CHECK(c.nproc.number == 2);
  const auto d = parse({"--", "true", "-v"});
  CHECK(d.program_args == std::vector<std::string>{"true", "-v"});
  CHECK(d.program_path == "/usr/bin/true");  // found through PATH like execvp
}

TEST_CASE("host names, addresses and values that start with '-' are accepted", "[launcher][config]") {
  CHECK(parse({"--master_addr", "node_1.cluster.local.", "--nnodes", "2", "--node_rank", "1", "/bin/true"}).master_addr ==
        "node_1.cluster.local.");
  CHECK(parse({"--master_addr", "fe80::1", "/bin/true"}).master_addr == "fe80::1");
  CHECK(parse({"--rdzv_endpoint", "[::1]:29400", "--nnodes", "2", "/bin/true"}).rdzv_host == "::1");
  CHECK(parse({"--log_line_prefix_template", "-", "/bin/true"}).log_line_prefix_template == "-");
  CHECK_THAT(usage_error({"--max_restarts", "-2", "/bin/true"}), Catch::Contains("--max_restarts must be"));  // a value
}

TEST_CASE("nproc_per_node accepts gpu, cpu and auto", "[launcher][config]") {
  CHECK(parse({"--nproc_per_node", "gpu", "/bin/true"}).nproc.kind == NprocRequest::Kind::kGpu);
  CHECK(parse({"--nproc_per_node", "cpu", "/bin/true"}).nproc.kind == NprocRequest::Kind::kCpu);
  CHECK(parse({"--nproc_per_node", "auto", "/bin/true"}).nproc.kind == NprocRequest::Kind::kAuto);
  CHECK(parse({"--gpus", "0,3,5", "/bin/true"}).nproc.number == 3);
  CHECK(parse({"--gpus", "auto:2", "/bin/true"}).nproc.number == 2);
}

TEST_CASE("standalone means one node on loopback with a free port", "[launcher][config]") {
  const auto c = parse({"--standalone", "--nproc_per_node", "2", "/bin/true"});
  CHECK(c.master_addr == "127.0.0.1");
  CHECK(c.master_port == 0);
  CHECK(c.node_rank == 0);
  CHECK(c.run_id != "none");
}

TEST_CASE("bad input is one clear UsageError", "[launcher][config]") {
  struct Case {
    std::vector<std::string> args;
    std::string expected;  // a part of the message
  };
  const std::vector<Case> cases = {
      {{"--bogus", "/bin/true"}, "unknown flag '--bogus'"},
      {{"-x", "/bin/true"}, "unknown flag '-x'"},
      {{"--nnodes", "two", "/bin/true"}, "--nnodes expects an integer, got 'two'"},
      {{"--nnodes", "1:4", "/bin/true"}, "elastic"},
      {{"--nproc_per_node", "0", "/bin/true"}, "--nproc_per_node"},
      {{"--nproc_per_node", "1.5", "/bin/true"}, "expects an integer"},
      {{"--nnodes", "2", "--node_rank", "2", "/bin/true"}, "--node_rank 2 must be below --nnodes 2"},
      {{"--node_rank", "-1", "/bin/true"}, "--node_rank must be in"},
      {{"--nnodes", "2", "--master_port", "0", "/bin/true"}, "--master_port 0"},
      {{"--master_port", "70000", "/bin/true"}, "--master_port must be in 0..65535"},
      {{"--master_port", "12x", "/bin/true"}, "expects an integer"},
      {{"--shutdown_grace", "-1", "/bin/true"}, "--shutdown_grace"},
      {{"--monitor_interval", "0", "/bin/true"}, "--monitor_interval must be > 0"},
      {{"--redirects", "4", "/bin/true"}, "--redirects must be in 0..3"},
      {{"--tee", "0:1,x", "/bin/true"}, "LOCAL_RANK:STREAMS"},
      {{"--gpus", "0,0", "/bin/true"}, "names GPU 0 twice"},
      {{"--gpus", "a,b", "/bin/true"}, "--gpus"},
      {{"--nproc_per_node", "4", "--gpus", "0,1", "/bin/true"}, "give one GPU per worker"},
      {{"--rdzv_endpoint", ":29400", "/bin/true"}, "has no host"},
      // faults.launch_fuzz, seed 1502050767: --dry_run taken as --local_addr's value, then a real run
      // waiting 600 s for a rendezvous host named "-m". See Note [A flag is never a value].
      {{"--local-addr", "--dry_run", "--rdzv_endpoint=-m", "false"}, "--local_addr needs a value, but the next argument '--dry_run' is a flag"},
      {{"--rdzv_endpoint=-m", "--dry_run", "/bin/true"}, "--rdzv_endpoint '-m' is not a host name"},
      {{"--master_addr", "-m", "/bin/true"}, "is a flag"},
      {{"--master_addr=a b", "/bin/true"}, "--master_addr 'a b' is not a host name"},
      {{"--local_addr=node-.x", "/bin/true"}, "is not a host name"},
      {{"--rdzv_endpoint", "job/1:29400", "/bin/true"}, "is not a host name"},
      {{"--rdzv_endpoint", "h:1", "--node_rank", "0", "/bin/true"}, "exclude each other"},
      {{"--standalone", "--nnodes", "2", "/bin/true"}, "--standalone"},
      {{"--nproc_per_node", "2"}, "no training binary"},
      {{"--nproc_per_node"}, "--nproc_per_node needs a value"},
      {{"/nonexistent/worker"}, "does not exist"},
      {{"/etc/passwd"}, "not executable"},
      {{"/tmp"}, "is a directory"},
      {{"surely-not-a-program-xyz"}, "not found in PATH"},
  };
  for (const auto& c : cases) {
    INFO(ddp::join(c.args, " "));
    const std::string msg = usage_error(c.args);
    CHECK_THAT(msg, Catch::Contains(c.expected));
    CHECK(msg.find('\n') == std::string::npos);
  }
}

TEST_CASE("Slurm's variables fill in what the flags leave out", "[launcher][config][slurm]") {
  const auto slurm = plain_env({{"SLURM_NNODES", "3"},
                                {"SLURM_NODEID", "2"},
                                {"SLURM_JOB_NODELIST", "gpu[07-09]"},
                                {"SLURM_JOB_ID", "123456"}});
  const auto c = parse({"--nproc_per_node", "4", "/bin/true"}, slurm);
  CHECK(c.nnodes == 3);
  CHECK(c.node_rank == 2);
  CHECK(c.master_addr == "gpu07");
  CHECK(c.master_port == 10000 + 123456 % 50000);
  // Explicit flags win.
  const auto d = parse({"--nnodes", "1", "--node_rank", "0", "--master_addr", "h", "--master_port", "2000", "/bin/true"},
                       slurm);
  CHECK(d.nnodes == 1);
  CHECK(d.node_rank == 0);
  CHECK(d.master_addr == "h");
  CHECK(d.master_port == 2000);
  CHECK_THAT(usage_error({"/bin/true"}, plain_env({{"SLURM_NNODES", "x"}, {"SLURM_NODEID", "0"}, {"SLURM_JOB_NODELIST", "a"}})),
             Catch::Contains("SLURM_NNODES='x'"));
  CHECK_THAT(usage_error({"/bin/true"}, plain_env({{"SLURM_NNODES", "2"}, {"SLURM_NODEID", "2"}, {"SLURM_JOB_NODELIST", "a,b"}})),
             Catch::Contains("SLURM_NODEID=2"));
}

TEST_CASE("Slurm host lists expand", "[launcher][hostlist]") {
  using V = std::vector<std::string>;
  CHECK(ddp::detail::expand_hostlist("ns[3182447,3185995,3186000-3186002]") ==
        V{"ns3182447", "ns3185995", "ns3186000", "ns3186001", "ns3186002"});
  CHECK(ddp::detail::expand_hostlist("node[001-003]") == V{"node001", "node002", "node003"});
  CHECK(ddp::detail::expand_hostlist("node[8-11]") == V{"node8", "node9", "node10", "node11"});
  CHECK(ddp::detail::expand_hostlist("a[1-2],b3") == V{"a1", "a2", "b3"});
  CHECK(ddp::detail::expand_hostlist("single") == V{"single"});
  CHECK(ddp::detail::expand_hostlist("x-1.cluster,y") == V{"x-1.cluster", "y"});
  CHECK(ddp::detail::expand_hostlist("r[1-2]-n[01,03]") == V{"r1-n01", "r1-n03", "r2-n01", "r2-n03"});
  for (const char* bad : {"a[1-2", "a]1[", "a[]", "a[3-1]", "a[x]", "a,,b", "", "a[1-2]]", "a[[1]]"}) {
    INFO(bad);
    CHECK_THROWS_AS(ddp::detail::expand_hostlist(bad), UsageError);
  }
}

TEST_CASE("worker environment for several nnodes x nproc", "[launcher][env]") {
  for (int nnodes : {1, 2, 3}) {
    for (int nproc : {1, 2, 4}) {
      std::set<int> ranks;
      for (int node_rank = 0; node_rank < nnodes; ++node_rank) {
        NodeAssignment node;
        node.nnodes = nnodes;
        node.node_rank = node_rank;
        node.nproc_per_node = nproc;
        node.master_addr = "10.1.2.3";
        node.master_port = 4242;
        node.run_id = "job7";
        node.max_restarts = 3;
        for (int lr = 0; lr < nproc; ++lr) {
          WorkerSlot slot;
          slot.local_rank = lr;
          slot.restart_count = 1;
          slot.error_file = "/e/" + std::to_string(lr);
          const auto vars = as_map(launcher_variables(node, slot));
          const int rank = node_rank * nproc + lr;
          ranks.insert(rank);
          CHECK(vars.at("RANK") == std::to_string(rank));
          CHECK(vars.at("LOCAL_RANK") == std::to_string(lr));
          CHECK(vars.at("WORLD_SIZE") == std::to_string(nnodes * nproc));
          CHECK(vars.at("LOCAL_WORLD_SIZE") == std::to_string(nproc));
          CHECK(vars.at("GROUP_RANK") == std::to_string(node_rank));
          CHECK(vars.at("GROUP_WORLD_SIZE") == std::to_string(nnodes));
          CHECK(vars.at("ROLE_NAME") == "default");
          CHECK(vars.at("ROLE_RANK") == std::to_string(rank));
          CHECK(vars.at("ROLE_WORLD_SIZE") == std::to_string(nnodes * nproc));
          CHECK(vars.at("MASTER_ADDR") == "10.1.2.3");
          CHECK(vars.at("MASTER_PORT") == "4242");
          CHECK(vars.at("TORCHELASTIC_RESTART_COUNT") == "1");
          CHECK(vars.at("TORCHELASTIC_MAX_RESTARTS") == "3");
          CHECK(vars.at("TORCHELASTIC_RUN_ID") == "job7");
          CHECK(vars.at("TORCHELASTIC_ERROR_FILE") == "/e/" + std::to_string(lr));
          CHECK(vars.count("CUDA_VISIBLE_DEVICES") == 0);
          CHECK(vars.size() == 16);
        }
      }
      CHECK(static_cast<int>(ranks.size()) == nnodes * nproc);
    }
  }
}

TEST_CASE("inherited variables pass through; OMP_NUM_THREADS=1 only when unset and nproc > 1", "[launcher][env]") {
  NodeAssignment node;
  node.nproc_per_node = 2;
  WorkerSlot slot;
  slot.visible_gpu = "5";
  const std::map<std::string, std::string> inherited{{"HOME", "/h"}, {"RANK", "99"}};
  const auto env = worker_environment(inherited, node, slot);
  auto has = [&](const std::string& kv) { return std::find(env.begin(), env.end(), kv) != env.end(); };
  CHECK(has("HOME=/h"));
  CHECK(has("RANK=0"));
  CHECK_FALSE(has("RANK=99"));
  CHECK(has("OMP_NUM_THREADS=1"));
  CHECK(has("CUDA_VISIBLE_DEVICES=5"));
  CHECK(has("CUDA_DEVICE_ORDER=PCI_BUS_ID"));
  CHECK_FALSE(needs_omp_default({{"OMP_NUM_THREADS", "4"}}, 2));
  CHECK_FALSE(needs_omp_default({}, 1));
  const auto kept = worker_environment({{"OMP_NUM_THREADS", "4"}}, node, WorkerSlot{});
  CHECK(std::find(kept.begin(), kept.end(), "OMP_NUM_THREADS=4") != kept.end());
}

TEST_CASE("--cpu_bind exclusive: contiguous slices of the launcher's CPUs, OMP_NUM_THREADS their size", "[launcher][cpu]") {
  CHECK(parse({"/bin/true"}).cpu_bind == CpuBind::kNone);
  CHECK(parse({"--cpu-bind=exclusive", "/bin/true"}).cpu_bind == CpuBind::kExclusive);
  CHECK_THAT(usage_error({"--cpu_bind", "cores", "/bin/true"}),
             Catch::Contains("--cpu_bind: unknown value 'cores' (choose none or exclusive)"));

  using Slices = std::vector<std::vector<int>>;
  CHECK(exclusive_cpu_slices({0, 1}, 2) == Slices{{0}, {1}});
  CHECK(exclusive_cpu_slices({0, 1, 2, 3, 4, 5, 6, 7}, 3) == Slices{{0, 1, 2}, {3, 4, 5}, {6, 7}});
  CHECK(exclusive_cpu_slices({2, 3, 8, 9, 10}, 1) == Slices{{2, 3, 8, 9, 10}});
  CHECK(exclusive_cpu_slices({4, 6, 8, 10}, 4) == Slices{{4}, {6}, {8}, {10}});
  // Every CPU exactly once, sizes differing by at most one, for every worker count up to the CPUs.
  std::vector<int> sixteen(16);
  std::iota(sixteen.begin(), sixteen.end(), 0);
  for (int nproc = 1; nproc <= 16; ++nproc) {
    const Slices slices = exclusive_cpu_slices(sixteen, nproc);
    REQUIRE(slices.size() == static_cast<size_t>(nproc));
    std::vector<int> all;
    for (const auto& s : slices) all.insert(all.end(), s.begin(), s.end());
    CHECK(all == sixteen);
    CHECK(slices.front().size() - slices.back().size() <= 1);
  }
  try {
    exclusive_cpu_slices({0, 1}, 3);
    FAIL("3 workers on 2 CPUs were accepted");
  } catch (const UsageError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("needs a CPU per worker: 3 workers, 2 CPUs (0-1)"));
  }
  CHECK(format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK(format_cpu_list({5}) == "5");
  CHECK(format_cpu_list({}).empty());

  LaunchConfig bound = parse({"--cpu_bind", "exclusive", "/bin/true"});
  MachineResources machine(4, nullptr);
  std::string how;
  CHECK(resolve_cpu_binding(bound, {}, 2, {}, machine, how) == Slices{{0, 1}, {2, 3}});
  CHECK(how == "--cpu_bind exclusive");
  CHECK(resolve_cpu_binding(parse({"/bin/true"}), {}, 2, {}, machine, how).empty());

  // OMP_NUM_THREADS: the user's value wins; pinned workers get their CPU count; else torchrun's rule.
  WorkerSlot pinned;
  pinned.cpus = {2, 3, 4};
  CHECK(omp_threads_default({}, 2, pinned) == "3");
  CHECK(omp_threads_default({}, 1, pinned) == "3");
  CHECK_FALSE(omp_threads_default({{"OMP_NUM_THREADS", "8"}}, 2, pinned));
  CHECK(omp_threads_default({}, 2, WorkerSlot{}) == "1");
  CHECK_FALSE(omp_threads_default({}, 1, WorkerSlot{}));
  NodeAssignment node;
  node.nproc_per_node = 2;
  const auto env = worker_environment({}, node, pinned);
  CHECK(std::find(env.begin(), env.end(), "OMP_NUM_THREADS=3") != env.end());
}

namespace {

class FakeGpus : public GpuProvider {
 public:
  std::vector<GpuInfo> list;
  std::vector<GpuInfo> gpus() override { return list; }
};

GpuInfo gpu(int index, double free_gib, std::vector<GpuProcess> procs = {}) {
  GpuInfo g;
  g.index = index;
  g.name = "FakeGPU";
  g.total_bytes = 80ull << 30;
  g.free_bytes = static_cast<std::uint64_t>(free_gib * (1ull << 30));
  g.processes = std::move(procs);
  return g;
}

}  // namespace

TEST_CASE("GPU selection with a fake NVML", "[launcher][gpu]") {
  FakeGpus fake;
  fake.list = {gpu(0, 10), gpu(1, 79, {{4242, "python", 1ull << 30}}), gpu(2, 70), gpu(3, 75)};
  GpuProvider& provider = fake;
  // Busy GPU 1 is refused; most free first (3, 2), reported in index order.
  CHECK(select_gpus(provider.gpus(), GpuSelectionOptions{2, false}) == std::vector<int>{2, 3});
  CHECK(select_gpus(provider.gpus(), GpuSelectionOptions{3, false}) == std::vector<int>{0, 2, 3});
  // With --allow_busy_gpus the busy one (most free memory) is taken.
  CHECK(select_gpus(provider.gpus(), GpuSelectionOptions{1, true}) == std::vector<int>{1});
  // Too few: the error lists every GPU with its free memory and its processes.
  try {
    select_gpus(provider.gpus(), GpuSelectionOptions{4, false});
    FAIL("expected a UsageError");
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("needs 4 free GPUs, 3 qualify"));
    CHECK_THAT(msg, Catch::Contains("GPU 1 (FakeGPU): 79.0 GiB free of 80.0 GiB, busy: pid 4242 (python) 1.0 GiB"));
    CHECK_THAT(msg, Catch::Contains("GPU 0 (FakeGPU): 10.0 GiB free"));
    CHECK_THAT(msg, Catch::Contains("--allow_busy_gpus"));
  }
  fake.list.clear();
  CHECK_THROWS_WITH(select_gpus(provider.gpus(), GpuSelectionOptions()), Catch::Contains("NVML reports none"));
}

TEST_CASE("gpus and stream specs parse", "[launcher][config]") {
  CHECK(parse_gpu_request("0,3,5").list == std::vector<int>{0, 3, 5});
  CHECK(parse_gpu_request("auto").mode == GpuRequest::Mode::kAuto);
  CHECK(parse_gpu_request("auto:3").auto_count == 3);
  const auto all = parse_stream_spec("--redirects", "3");
  CHECK(all.for_local_rank(0) == StdStreams::kBoth);
  CHECK(all.for_local_rank(7) == StdStreams::kBoth);
  const auto map = parse_stream_spec("--tee", "0:1,1:2");
  CHECK(map.for_local_rank(0) == StdStreams::kOut);
  CHECK(map.for_local_rank(1) == StdStreams::kErr);
  CHECK(map.for_local_rank(2) == StdStreams::kNone);
  CHECK_THROWS_AS(parse_stream_spec("--tee", "0:1,0:2"), UsageError);
}

TEST_CASE("error files in torchrun's format", "[launcher][error_file]") {
  const std::string torchrun_text =
      R"({"message": {"message": "RuntimeError: boom \"x\"\nline2 \u00e9", "extraInfo": {"py_callstack": "Traceback...", "timestamp": "1700000000"}}})";
  const auto e = parse_error_json(torchrun_text);
  REQUIRE(e);
  CHECK(e->message == "RuntimeError: boom \"x\"\nline2 \xc3\xa9");
  CHECK(e->callstack == "Traceback...");
  CHECK(e->timestamp == 1700000000);
  const auto plain = parse_error_json(R"({"message": "plain text"})");
  REQUIRE(plain);
  CHECK(plain->message == "plain text");
  CHECK_FALSE(plain->timestamp);
  for (const char* bad : {"", "{", "[]", R"({"msg": "x"})", R"({"message": 3})", R"({"message": {"extraInfo": {}}})",
                          R"({"message": "x"} trailing)"}) {
    INFO(bad);
    CHECK_FALSE(parse_error_json(bad));
  }
  WorkerError w;
  w.message = "tab\there \"quoted\" \x01";
  w.callstack = "frame 1\nframe 2";
  w.timestamp = 42;
  const auto back = parse_error_json(format_error_json(w));
  REQUIRE(back);
  CHECK(back->message == w.message);
  CHECK(back->callstack == w.callstack);
  CHECK(back->timestamp == 42);

  char dir[] = "/tmp/ddp_error_file_test_XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/error.json";
  CHECK_FALSE(read_error_file(path));
  REQUIRE(write_error_file(path, w));
  REQUIRE(read_error_file(path));
  CHECK(read_error_file(path)->message == w.message);
  std::remove(path.c_str());
  rmdir(dir);
}

TEST_CASE("console lines get one rank prefix; partial lines are flushed", "[launcher][output]") {
  CHECK(rank_prefix(3) == "[rank 3]: ");
  LineSplitter splitter(16);
  std::vector<std::string> lines;
  const LineSplitter::Emit emit = [&](std::string_view l) { lines.emplace_back(l); };
  splitter.feed("ab", emit);
  CHECK(lines.empty());
  splitter.feed("c\nde\nf", emit);
  CHECK(lines == std::vector<std::string>{"abc\n", "de\n"});
  splitter.feed("0123456789abcdefXYZ", emit);  // longer than max_line: emitted in a piece
  CHECK(lines.size() == 3);
  CHECK(lines[2] == "f0123456789abcde\n");
  splitter.flush(emit);
  CHECK(lines.back() == "fXYZ\n");
  splitter.flush(emit);
  CHECK(lines.size() == 4);
}

TEST_CASE("log path layout", "[launcher][logs]") {
  const auto f = worker_files("/logs/run1_Ab3dE9", 2, 5);
  CHECK(f.dir == "/logs/run1_Ab3dE9/attempt_2/5");
  CHECK(f.stdout_log == "/logs/run1_Ab3dE9/attempt_2/5/stdout.log");
  CHECK(f.stderr_log == "/logs/run1_Ab3dE9/attempt_2/5/stderr.log");
  CHECK(f.error_file == "/logs/run1_Ab3dE9/attempt_2/5/error.json");
  CHECK(attempt_dir("/logs/run1_Ab3dE9", 2) == "/logs/run1_Ab3dE9/attempt_2");
}

namespace {

// A loader of FakeGpus that counts how often NVML would have been loaded.
GpuProviderLoader fake_loader(std::vector<GpuInfo> gpus, int* loads) {
  return [gpus, loads] {
    ++*loads;
    auto fake = std::make_unique<FakeGpus>();
    fake->list = gpus;
    return std::unique_ptr<GpuProvider>(std::move(fake));
  };
}

GpuProviderLoader no_driver(int* loads) {
  return [loads]() -> std::unique_ptr<GpuProvider> {
    ++*loads;
    throw UsageError("cannot load libnvidia-ml.so.1");
  };
}

}  // namespace

TEST_CASE("nproc_per_node gpu|cpu|auto and --gpus auto resolve against the machine", "[launcher][gpu]") {
  const std::vector<GpuInfo> four = {gpu(0, 70), gpu(1, 10, {{7, "other", 60ull << 30}}), gpu(2, 79), gpu(3, 50)};
  int loads = 0;
  {
    MachineResources machine(16, fake_loader(four, &loads));
    CHECK(resolve_nproc(parse({"--nproc_per_node", "gpu", "/bin/true"}), plain_env(), machine) == 4);
    CHECK(resolve_nproc(parse({"--nproc_per_node", "auto", "/bin/true"}), plain_env(), machine) == 4);
    CHECK(resolve_nproc(parse({"--nproc_per_node", "cpu", "/bin/true"}), plain_env(), machine) == 16);
    // --gpus auto:3 (three workers): the free GPUs 0, 2, 3; the busy GPU 1 is refused.
    const auto c = parse({"--gpus", "auto:3", "/bin/true"});
    CHECK(resolve_visible_gpus(c, plain_env(), resolve_nproc(c, plain_env(), machine), machine) ==
          std::vector<std::string>{"0", "2", "3"});
    // Four workers need the busy one too: refused with the list, unless --allow_busy_gpus.
    const auto all = parse({"--nproc_per_node", "gpu", "--gpus", "auto", "/bin/true"});
    CHECK_THROWS_WITH(resolve_visible_gpus(all, plain_env(), 4, machine), Catch::Contains("pid 7 (other)"));
    const auto busy_ok = parse({"--nproc_per_node", "gpu", "--gpus", "auto", "--allow_busy_gpus", "/bin/true"});
    CHECK(resolve_visible_gpus(busy_ok, plain_env(), 4, machine) == std::vector<std::string>{"0", "1", "2", "3"});
    CHECK(loads == 1);  // NVML is loaded once
  }
  {
    // Without --gpus or a GPU count, NVML is not loaded.
    MachineResources machine(16, fake_loader(four, &loads));
    loads = 0;
    CHECK(resolve_nproc(parse({"--nproc_per_node", "2", "/bin/true"}), plain_env(), machine) == 2);
    CHECK(resolve_visible_gpus(parse({"--nproc_per_node", "2", "/bin/true"}), plain_env(), 2, machine).empty());
    CHECK(loads == 0);
  }
  {
    // No driver: gpu is an error, auto falls back to the CPUs, --gpus 0,1 still works.
    MachineResources machine(6, no_driver(&loads));
    CHECK_THROWS_WITH(resolve_nproc(parse({"--nproc_per_node", "gpu", "/bin/true"}), plain_env(), machine),
                      Catch::Contains("libnvidia-ml.so.1"));
    CHECK(resolve_nproc(parse({"--nproc_per_node", "auto", "/bin/true"}), plain_env(), machine) == 6);
    CHECK(resolve_visible_gpus(parse({"--gpus", "4,1", "/bin/true"}), plain_env(), 2, machine) == std::vector<std::string>{"4", "1"});
    CHECK_THROWS_AS(resolve_visible_gpus(parse({"--gpus", "auto", "/bin/true"}), plain_env(), 1, machine), UsageError);
  }
}

TEST_CASE("gpu and --gpus auto choose within an inherited CUDA_VISIBLE_DEVICES and agree on it", "[launcher][gpu]") {
  // Eight GPUs on the node; a Slurm allocation without device cgroups gives this job 2, 5 and 6.
  std::vector<GpuInfo> eight;
  for (int i = 0; i < 8; ++i) {
    eight.push_back(gpu(i, 70 + i));  // GPU 7 has the most free memory, then 6, ...
    eight.back().uuid = "GPU-" + std::string(1, static_cast<char>('a' + i)) + "0c0ffee-1111-2222-3333-44445555666" + std::to_string(i);
  }
  eight[5].processes = {{99, "neighbour", 1ull << 30}};
  int loads = 0;
  MachineResources machine(16, fake_loader(eight, &loads));
  const auto by_index = plain_env({{"CUDA_VISIBLE_DEVICES", "2,5,6"}});
  const auto gpu_count = parse({"--nproc_per_node", "gpu", "/bin/true"});
  CHECK(resolve_nproc(gpu_count, by_index, machine) == 3);
  const auto visible = visible_gpus(by_index, machine);
  REQUIRE(visible.size() == 3);
  CHECK(visible[1].info.index == 5);
  CHECK(visible[1].cuda_name == "5");
  // auto:2 takes the two free GPUs of the allocation, never 7 (the most free memory, not ours).
  CHECK(resolve_visible_gpus(parse({"--gpus", "auto:2", "/bin/true"}), by_index, 2, machine) ==
        std::vector<std::string>{"2", "6"});
  // gpu + auto: three workers need the busy GPU 5 of the allocation: refused, named; accepted with
  // --allow_busy_gpus, and the workers still get only the allocation's GPUs.
  const auto all = parse({"--nproc_per_node", "gpu", "--gpus", "auto", "/bin/true"});
  CHECK_THROWS_WITH(resolve_visible_gpus(all, by_index, resolve_nproc(all, by_index, machine), machine),
                    Catch::Contains("pid 99 (neighbour)"));
  const auto busy_ok = parse({"--nproc_per_node", "gpu", "--gpus", "auto", "--allow_busy_gpus", "/bin/true"});
  CHECK(resolve_visible_gpus(busy_ok, by_index, resolve_nproc(busy_ok, by_index, machine), machine) ==
        std::vector<std::string>{"2", "5", "6"});
  // --gpus 0,2 numbers the inherited entries, as torch.cuda would in this process.
  CHECK(resolve_visible_gpus(parse({"--gpus", "0,2", "/bin/true"}), by_index, 2, machine) ==
        std::vector<std::string>{"2", "6"});
  CHECK_THROWS_WITH(resolve_visible_gpus(parse({"--gpus", "3", "/bin/true"}), by_index, 1, machine),
                    Catch::Contains("has 3 entries"));
  // --virtual_local_rank (torchrun's): local rank i gets the i-th inherited entry, else GPU i.
  const auto virtual_ranks = parse({"--nproc_per_node", "2", "--virtual_local_rank", "/bin/true"});
  CHECK(resolve_visible_gpus(virtual_ranks, by_index, 2, machine) == std::vector<std::string>{"2", "5"});
  CHECK(resolve_visible_gpus(virtual_ranks, plain_env(), 2, machine) == std::vector<std::string>{"0", "1"});
  CHECK_THROWS_WITH(resolve_visible_gpus(parse({"--nproc_per_node", "4", "--virtual_local_rank", "/bin/true"}), by_index,
                                         4, machine),
                    Catch::Contains("--virtual_local_rank: local rank 3"));

  // UUIDs (and a unique prefix of one): the workers get the UUIDs as inherited.
  const auto by_uuid = plain_env({{"CUDA_VISIBLE_DEVICES", eight[3].uuid + "," + eight[1].uuid.substr(0, 8)}});
  CHECK(resolve_nproc(gpu_count, by_uuid, machine) == 2);
  CHECK(resolve_visible_gpus(parse({"--gpus", "auto:1", "/bin/true"}), by_uuid, 1, machine) ==
        std::vector<std::string>{eight[3].uuid});  // GPU 3 has more free memory than GPU 1

  // As CUDA reads it: the list ends at the first entry naming no GPU (9) or a GPU again (2).
  CHECK(resolve_nproc(gpu_count, plain_env({{"CUDA_VISIBLE_DEVICES", "4,9,1"}}), machine) == 1);
  CHECK(resolve_nproc(gpu_count, plain_env({{"CUDA_VISIBLE_DEVICES", "2,2,3"}}), machine) == 1);
  CHECK_THROWS_WITH(resolve_nproc(gpu_count, plain_env({{"CUDA_VISIBLE_DEVICES", ""}}), machine),
                    Catch::Contains("names no GPU of this machine"));
  CHECK(resolve_nproc(parse({"--nproc_per_node", "auto", "/bin/true"}), plain_env({{"CUDA_VISIBLE_DEVICES", "-1"}}),
                      machine) == 16);  // no GPU visible: auto counts the CPUs
  CHECK_THROWS_WITH(resolve_nproc(gpu_count, plain_env({{"CUDA_VISIBLE_DEVICES", "MIG-1234"}}), machine),
                    Catch::Contains("MIG instance"));
  CHECK(loads == 1);
}

TEST_CASE("observability flags: hang watchdog and metrics endpoint", "[config]") {
  const LaunchConfig defaults = parse({"/bin/true"});
  CHECK(defaults.hang_timeout_s == 0);
  CHECK(defaults.metrics_port == 0);
  CHECK(defaults.metrics_addr == "127.0.0.1");
  const LaunchConfig c = parse({"--hang-timeout", "2.5", "--metrics_port", "9400", "--metrics_addr", "::1", "/bin/true"});
  CHECK(c.hang_timeout_s == 2.5);
  CHECK(c.metrics_port == 9400);
  CHECK(c.metrics_addr == "::1");
  std::vector<const char*> help{"ddp_launch", "--help"};
  std::string help_text;  // with cxxopts' line wrapping undone
  for (char ch : parse_launch_args(2, help.data(), plain_env()).help_text) {
    const bool space = std::isspace(static_cast<unsigned char>(ch)) != 0;
    if (!space || (!help_text.empty() && help_text.back() != ' ')) help_text += space ? ' ' : ch;
  }
  CHECK_THAT(help_text, Catch::Contains("anything but loopback exposes the metrics on the network"));
  CHECK_THAT(usage_error({"--hang_timeout", "-1", "/bin/true"}), Catch::Contains("--hang_timeout expects a number"));
  CHECK_THAT(usage_error({"--metrics_port", "70000", "/bin/true"}), Catch::Contains("--metrics_port must be in 0..65535"));
  CHECK_THAT(usage_error({"--metrics_addr", "localhost", "/bin/true"}),
             Catch::Contains("--metrics_addr 'localhost' is not an IPv4 or IPv6 address"));
  CHECK_FALSE(defaults.stragglers);
  const LaunchConfig s = parse({"--straggler_action", "warn", "--straggler_factor", "2", "--straggler_window", "20", "/bin/true"});
  CHECK(s.stragglers);
  CHECK(s.straggler_factor == 2.0);
  CHECK(s.straggler_window == 20);
  CHECK(parse({"--straggler_action", "warn", "/bin/true"}).straggler_factor == 1.5);
  CHECK_THAT(usage_error({"--straggler_action", "slow", "/bin/true"}),
             Catch::Contains("--straggler_action: invalid choice 'slow' (choose from off, warn, replace)"));
  // replace: in elastic jobs only (See Note [Replacing a straggler]).
  const LaunchConfig r = parse({"--straggler_action", "replace", "--nnodes", "2:3", "--rdzv_endpoint", "h0:29400",
                                "/bin/true"});
  CHECK(r.stragglers);
  CHECK(r.replace_stragglers);
  CHECK_FALSE(s.replace_stragglers);
  CHECK_THAT(usage_error({"--straggler_action", "replace", "/bin/true"}),
             Catch::Contains("--straggler_action replace needs elastic membership (--nnodes MIN:MAX"));
  // and in live jobs (the node leaves, a spare or the survivors go on: Note [Replacing a straggler]).
  const LaunchConfig live = parse({"--straggler_action", "replace", "--nnodes", "2:3", "--rdzv_endpoint", "h0:29400",
                                   "--recovery", "live", "--spares", "1", "/bin/true"});
  CHECK(live.replace_stragglers);
  CHECK(live.recovery == Recovery::kLive);
  CHECK_THAT(usage_error({"--straggler_action", "warn", "--straggler_factor", "1", "/bin/true"}),
             Catch::Contains("--straggler_factor must be over 1"));
  CHECK_THAT(usage_error({"--straggler_action", "warn", "--straggler_factor", "nan", "/bin/true"}),
             Catch::Contains("--straggler_factor must be over 1"));
  CHECK_THAT(usage_error({"--straggler_action", "warn", "--straggler_window", "2", "/bin/true"}),
             Catch::Contains("--straggler_window"));
  CHECK_THAT(usage_error({"--straggler_window", "20", "/bin/true"}),
             Catch::Contains("--straggler_factor and --straggler_window need --straggler_action warn or replace"));
  // --spares: in --recovery live jobs only (See Note [Hot spares in ddp_launch]).
  CHECK(parse({"/bin/true"}).spares == 0);
  CHECK(parse({"--spares", "2", "--nnodes", "2:3", "--rdzv_endpoint", "h0:29400", "--recovery", "live", "/bin/true"}).spares == 2);
  CHECK_THAT(usage_error({"--spares", "1", "--nnodes", "2:3", "--rdzv_endpoint", "h0:29400", "/bin/true"}),
             Catch::Contains("--spares needs --recovery live"));
  CHECK_THAT(usage_error({"--spares", "-1", "/bin/true"}), Catch::Contains("--spares"));
  CHECK_THAT(usage_error({"--spares", "two", "/bin/true"}), Catch::Contains("--spares"));
  WorkerSlot slot;
  slot.agent_socket = "/tmp/x/agent.sock";
  const auto vars = launcher_variables(NodeAssignment{}, slot);
  CHECK(std::count(vars.begin(), vars.end(), std::make_pair(std::string("DDP_AGENT_SOCKET"), *slot.agent_socket)) == 1);
}

TEST_CASE("DDP_LOG_DIR is exported only when the launcher has a log folder", "[launcher][env]") {
  NodeAssignment node;
  WorkerSlot slot;
  slot.error_file = "/e/0";
  CHECK(as_map(launcher_variables(node, slot)).count("DDP_LOG_DIR") == 0);
  slot.log_dir = "/logs/run/attempt_2";
  CHECK(as_map(launcher_variables(node, slot)).at("DDP_LOG_DIR") == "/logs/run/attempt_2");
}

namespace {

WorkerExit failure(int rank, int pass, bool after_stop = false,
                   std::optional<int> written_ms = std::nullopt) {
  WorkerExit e;
  e.rank = rank;
  e.local_rank = rank;
  e.exit_code = 1;
  e.observed_pass = pass;
  e.after_stop = after_stop;
  if (written_ms) e.error_written = std::chrono::system_clock::time_point(std::chrono::milliseconds(*written_ms));
  return e;
}

}  // namespace

TEST_CASE("root cause: the earliest failure; within one monitor pass, the first error file, else the lowest rank",
          "[launcher][root_cause]") {
  SECTION("one failure") { CHECK(root_cause_index({failure(3, 1)}) == 0); }
  SECTION("an earlier pass wins over a lower rank") {
    CHECK(root_cause_index({failure(0, 5), failure(2, 4), failure(1, 6)}) == 1);
  }
  SECTION("failures before the launcher's stop win over those after it") {
    CHECK(root_cause_index({failure(0, 1, true), failure(1, 2, false)}) == 1);
  }
  SECTION("same pass, no error files: the lowest rank, whatever the order of reaping") {
    CHECK(root_cause_index({failure(2, 3), failure(1, 3), failure(3, 3)}) == 1);
    CHECK(root_cause_index({failure(1, 3), failure(2, 3)}) == 0);
  }
  SECTION("same pass, every one wrote an error file: the first written") {
    CHECK(root_cause_index({failure(0, 2, false, 500), failure(1, 2, false, 200), failure(2, 2, false, 300)}) == 1);
  }
  SECTION("same pass, equal error file times: the lowest rank") {
    CHECK(root_cause_index({failure(2, 2, false, 100), failure(1, 2, false, 100)}) == 1);
  }
  SECTION("same pass, one killed by a signal (no error file): times are not comparable, lowest rank") {
    auto killed = failure(2, 2);
    killed.signal = 9;
    CHECK(root_cause_index({failure(1, 2, false, 900), killed, failure(0, 2, false, 950)}) == 2);
  }
  SECTION("an error file time does not beat an earlier pass") {
    CHECK(root_cause_index({failure(0, 2, false, 100), failure(1, 1, false, 900)}) == 1);
  }
  SECTION("no failures is a programming error") { CHECK_THROWS_AS(root_cause_index({}), ddp::Error); }
}

TEST_CASE("root cause across hosts: the workers' rule over the hosts' summary times",
          "[launcher][root_cause]") {
  using std::chrono::milliseconds;
  using std::chrono::system_clock;
  const system_clock::time_point t0(milliseconds(1764644645123));  // 2025-12-02T03:04:05.123Z
  SECTION("a summary's time reads back as written, to the millisecond") {
    CHECK(format_failure_time(t0) == "2025-12-02T03:04:05.123Z");
    REQUIRE(parse_failure_time(format_failure_time(t0)));
    CHECK(*parse_failure_time(format_failure_time(t0)) == t0);
    CHECK(*parse_failure_time("1999-12-31T23:59:59.007Z") < *parse_failure_time("2000-01-01T00:00:00.000Z"));
  }
  SECTION("what is not such a time is nothing") {
    for (const char* text : {"", "yesterday", "2025-12-02T03:04:05Z", "2025-12-02T03:04:05.12Z",
                             "2025-12-02T03:04:05.123", "2025-12-02T03:04:05.123Z trailing"}) {
      INFO(text);
      CHECK_FALSE(parse_failure_time(text));
    }
  }
  // As root_cause in launcher/hosts/remote_launch.cpp builds them: a host with a time is pass 0,
  // without one pass 1; the first host to fail has tie 0.
  const auto host = [](std::optional<system_clock::time_point> time, int tie) {
    return FailureOrder{false, time ? 0 : 1, time, tie};
  };
  SECTION("the earliest summary time wins over the host that failed first") {
    CHECK(earliest_failure({host(t0 + milliseconds(40), 0), host(t0, 2), host(t0 + milliseconds(5), 3)}) == 1);
  }
  SECTION("a host without a time (ssh failed) loses to any host with one") {
    CHECK(earliest_failure({host(std::nullopt, 0), host(t0 + milliseconds(900), 2)}) == 1);
  }
  SECTION("no host gives a time: the first to fail") {
    CHECK(earliest_failure({host(std::nullopt, 3), host(std::nullopt, 0), host(std::nullopt, 2)}) == 1);
  }
  SECTION("equal times: the first to fail") {
    CHECK(earliest_failure({host(t0, 2), host(t0, 0)}) == 1);
  }
}

TEST_CASE("a worker not reaped after SIGKILL is reported with its state and ends the wait", "[launcher][unreaped]") {
  // See Note [Unreapable workers]. The injected waiter plays a sandbox that never reaps a worker
  // killed by a signal (it stays a zombie, state Z); workers that exit by themselves are reaped.
  // Rank 0 fails (exit 3); rank 1 ignores SIGTERM, so the launcher's SIGKILL ends it.
  SupervisorOptions options;
  options.program_path = "/bin/sh";
  options.program_args = {"sh", "-c", "if [ \"$LOCAL_RANK\" = 0 ]; then exit 3; fi; trap '' TERM; exec sleep 30"};
  options.monitor_interval_s = 0.02;
  options.shutdown_grace_s = 0.2;
  options.reap_timeout_s = 0.3;
  options.max_restarts = 2;  // not used: an unreaped worker stops the restarts
  std::vector<pid_t> left_unreaped;
  options.try_reap = [&](pid_t pid, int* status) -> pid_t {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid) return 0;
    if (info.si_code != CLD_EXITED) {
      if (std::find(left_unreaped.begin(), left_unreaped.end(), pid) == left_unreaped.end()) left_unreaped.push_back(pid);
      return 0;
    }
    return ::waitpid(pid, status, WNOHANG);
  };
  int groups = 0;
  const GroupFactory make_group = [&](int attempt) {
    ++groups;
    std::vector<WorkerLaunch> group;
    for (int lr = 0; lr < 2; ++lr) {
      WorkerLaunch w;
      w.local_rank = w.rank = lr;
      w.env = {"PATH=/usr/bin:/bin", "LOCAL_RANK=" + std::to_string(lr), "ATTEMPT=" + std::to_string(attempt)};
      w.stdout_to_console = w.stderr_to_console = false;
      group.push_back(std::move(w));
    }
    return group;
  };
  SignalPipe signals;
  const SupervisorResult result = supervise(options, signals, make_group);
  CHECK(groups == 1);
  CHECK(result.attempts == 1);
  CHECK(result.exit_code == 3);
  REQUIRE(result.root_cause);
  CHECK(result.root_cause->rank == 0);
  REQUIRE(result.other_failures.size() == 1);
  const WorkerExit& stuck = result.other_failures[0];
  CHECK(stuck.rank == 1);
  REQUIRE(stuck.unreaped);
  CHECK(*stuck.unreaped == "Z (zombie)");
  REQUIRE(left_unreaped == std::vector<pid_t>{static_cast<pid_t>(stuck.pid)});
  CHECK_THAT(format_failure_summary(result, "host"),
             Catch::Contains(ddp::str("not reaped after SIGKILL: pid ", stuck.pid, " state Z (zombie)")));
  // The test reaps its zombie: nothing is left behind.
  CHECK(::waitpid(stuck.pid, nullptr, 0) == stuck.pid);
}

TEST_CASE("a signal pipe's ignore() leaves SIGTERM no moment with its default action", "[launcher][signals]") {
  // See Note [SIGTERM after the workers]: SIGTERM is caught while the pipe is held, ignored once
  // ignore() is called, and still ignored after the pipe is gone; with the default action anywhere,
  // the SIGTERMs below would end this test binary.
  struct sigaction term_before {}, int_before {};
  ::sigaction(SIGTERM, nullptr, &term_before);
  ::sigaction(SIGINT, nullptr, &int_before);
  const auto caught = [](SignalPipe& signals, int wait_ms) {
    pollfd fd{signals.read_fd(), POLLIN, 0};
    ::poll(&fd, 1, wait_ms);
    const std::vector<int> sigs = signals.drain();
    return std::count(sigs.begin(), sigs.end(), SIGTERM);
  };
  const auto term_handler = [] {
    struct sigaction now {};
    ::sigaction(SIGTERM, nullptr, &now);
    return now.sa_handler;
  };
  {
    SignalPipe signals;
    ::kill(::getpid(), SIGTERM);
    CHECK(caught(signals, 2000) == 1);
    signals.ignore(SIGTERM);
    CHECK(term_handler() == SIG_IGN);
    ::kill(::getpid(), SIGTERM);
    CHECK(caught(signals, 100) == 0);
  }
  CHECK(term_handler() == SIG_IGN);
  ::kill(::getpid(), SIGTERM);
  struct sigaction int_after {};
  ::sigaction(SIGINT, nullptr, &int_after);
  CHECK(int_after.sa_handler == int_before.sa_handler);  // the others are restored
  ::sigaction(SIGTERM, &term_before, nullptr);
}

TEST_CASE("process states read from /proc/PID/stat", "[launcher][unreaped]") {
  CHECK(process_state(::getpid()) == "R (running)");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  // Not reaped yet: a zombie as soon as it has exited (bounded wait).
  std::string state;
  for (int i = 0; i < 500 && state != "Z (zombie)"; ++i) {
    state = process_state(child);
    if (state != "Z (zombie)") ::usleep(10000);
  }
  CHECK(state == "Z (zombie)");
  CHECK(::waitpid(child, nullptr, 0) == child);
  CHECK_THAT(process_state(child), Catch::StartsWith("unknown (/proc/"));
}
