// --numa_binding (See Note [NUMA binding] in launcher/resources/numa_binding.cpp): the topology read
// from fake sysfs roots of 2 and 4 NUMA nodes and from this machine's, the CPUs of each mode, the
// GPU workers' placement from their GPUs' PCI NUMA nodes, and the errors.
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>

#include "launcher/config/config.h"
#include "launcher/resources/numa_binding.h"
#include "launcher/resources/resources.h"
#include "tests/launcher/config_support.h"
#include "tests/support/temp_dir.h"

using namespace ddp::launcher::config;
using namespace ddp::launcher::resources;
using ddp::EnvironmentSnapshot;
using ddp::UsageError;
using Slices = std::vector<std::vector<int>>;

namespace {

// A sysfs tree in a temporary folder, removed at the end.
class FakeSysfs {
 public:
  std::string root() const { return dir_.path.string(); }

  void write(const std::string& path, const std::string& text) {
    const std::filesystem::path full = dir_.path / path;
    std::filesystem::create_directories(full.parent_path());
    std::ofstream(full) << text << "\n";
  }
  // A NUMA node's cpulist.
  void node(int n, const std::string& cpulist) { write("devices/system/node/node" + std::to_string(n) + "/cpulist", cpulist); }
  // A CPU: its socket, its hyperthread siblings and its L1d/L1i/L2 (its own) and L3 (`l3`) caches.
  void cpu(int c, int socket, const std::string& siblings, const std::string& l3) {
    const std::string dir = "devices/system/cpu/cpu" + std::to_string(c);
    write(dir + "/topology/physical_package_id", std::to_string(socket));
    write(dir + "/topology/thread_siblings_list", siblings);
    const std::string caches[][3] = {{"1", "Data", siblings}, {"1", "Instruction", siblings}, {"2", "Unified", siblings},
                                     {"3", "Unified", l3}};
    for (int i = 0; i < 4; ++i) {
      const std::string index = dir + "/cache/index" + std::to_string(i);
      write(index + "/level", caches[i][0]);
      write(index + "/type", caches[i][1]);
      write(index + "/shared_cpu_list", caches[i][2]);
    }
  }

 private:
  ddp::testing::TempDir dir_;
};

// 2 sockets, one node each, 4 cores x 2 hyperthreads per node (CPU i and i + 8 share a core), two
// L3 caches of 2 cores per node: node 0 = 0-3,8-11 (L3s 0-1,8-9 and 2-3,10-11), node 1 = 4-7,12-15.
void two_nodes(FakeSysfs& fs) {
  fs.node(0, "0-3,8-11");
  fs.node(1, "4-7,12-15");
  for (int c = 0; c < 16; ++c) {
    const int core = c % 8, pair = core / 2 * 2;
    fs.cpu(c, core / 4, std::to_string(core) + "," + std::to_string(core + 8),
           ddp::str(pair, "-", pair + 1, ",", pair + 8, "-", pair + 9));
  }
}

// 2 sockets of 2 nodes each, 4 CPUs per node (no hyperthreads), one L3 per node; node 4 holds memory only.
void four_nodes(FakeSysfs& fs) {
  for (int n = 0; n < 4; ++n) fs.node(n, ddp::str(n * 4, "-", n * 4 + 3));
  fs.node(4, "");
  for (int c = 0; c < 16; ++c) fs.cpu(c, c / 8, std::to_string(c), ddp::str(c / 4 * 4, "-", c / 4 * 4 + 3));
}

std::vector<int> range(int from, int to) {  // from..to inclusive
  std::vector<int> v(to - from + 1);
  std::iota(v.begin(), v.end(), from);
  return v;
}

class FakeGpus : public GpuProvider {
 public:
  explicit FakeGpus(std::vector<GpuInfo> list) : list_(std::move(list)) {}
  std::vector<GpuInfo> gpus() override { return list_; }

 private:
  std::vector<GpuInfo> list_;
};

}  // namespace

TEST_CASE("parse_cpu_list reads the kernel's cpulist format", "[launcher][numa]") {
  std::vector<int> cpus;
  CHECK(parse_cpu_list("0-3,8,10-11\n", cpus));
  CHECK(cpus == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_cpu_list("", cpus));
  CHECK(cpus.empty());
  for (const char* bad : {"3-1", "0,", ",1", "a", "1-", "0-3,x"}) {
    INFO(bad);
    CHECK_FALSE(parse_cpu_list(bad, cpus));
  }
}

TEST_CASE("--numa_binding on a fake 2-node sysfs: CPU workers in blocks, each mode's CPUs", "[launcher][numa]") {
  FakeSysfs fs;
  two_nodes(fs);
  const CpuTopology t = read_cpu_topology(fs.root());
  REQUIRE(t.node_cpus.size() == 2);
  CHECK(t.node_cpus.at(1) == std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15});
  CHECK(t.core_of.at(9) == 1);
  CHECK(t.llc_of.at(10) == 2);  // the L3, not the L1i or L2 it also lists
  CHECK(t.socket_of.at(12) == 1);

  const std::vector<int> all = range(0, 15);
  const std::vector<NumaPlacement> four = spread_over_nodes(t, all, 4);
  REQUIRE(four.size() == 4);
  CHECK((four[0].node == 0 && four[1].node == 0 && four[2].node == 1 && four[3].node == 1));
  CHECK((four[1].share == 1 && four[1].shares == 2 && four[2].share == 0));
  CHECK(numa_cpu_slices(NumaBinding::kNode, t, all, four) ==
        Slices{{0, 1, 2, 3, 8, 9, 10, 11}, {0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}, {4, 5, 6, 7, 12, 13, 14, 15}});
  CHECK(numa_cpu_slices(NumaBinding::kSocket, t, all, four) == numa_cpu_slices(NumaBinding::kNode, t, all, four));
  // exclusive: whole cores (both hyperthreads), half of the node each.
  CHECK(numa_cpu_slices(NumaBinding::kExclusive, t, all, four) ==
        Slices{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}});
  CHECK(numa_cpu_slices(NumaBinding::kCoreComplex, t, all, four) ==
        Slices{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}});
  // Three workers on node 0 (of 6 over 2 nodes): 4 cores as 2, 1, 1; core complexes taken in turn.
  const std::vector<NumaPlacement> six = spread_over_nodes(t, all, 6);
  const Slices exclusive6 = numa_cpu_slices(NumaBinding::kExclusive, t, all, six);
  CHECK(Slices(exclusive6.begin(), exclusive6.begin() + 3) == Slices{{0, 1, 8, 9}, {2, 10}, {3, 11}});
  const Slices complex6 = numa_cpu_slices(NumaBinding::kCoreComplex, t, all, six);
  CHECK(Slices(complex6.begin(), complex6.begin() + 3) == Slices{{0, 1, 8, 9}, {2, 3, 10, 11}, {0, 1, 8, 9}});

  // Within the launcher's affinity (a cpuset of node 0's first hyperthreads): every worker on node
  // 0, its cores shared by 4, nothing outside the set.
  const std::vector<int> cpuset = {0, 1, 2, 3};
  const std::vector<NumaPlacement> in_set = spread_over_nodes(t, cpuset, 4);
  CHECK((in_set[3].node == 0 && in_set[3].shares == 4));
  CHECK(numa_cpu_slices(NumaBinding::kExclusive, t, cpuset, in_set) == Slices{{0}, {1}, {2}, {3}});
  CHECK(numa_cpu_slices(NumaBinding::kNode, t, cpuset, in_set)[2] == cpuset);

  // Errors, one line each: more workers than a node's cores (exclusive); a node outside the cpuset.
  CHECK_THROWS_WITH(numa_cpu_slices(NumaBinding::kExclusive, t, cpuset, spread_over_nodes(t, cpuset, 5)),
                    Catch::Contains("NUMA node 0 has 4 physical cores of the launcher's CPUs for 5 workers"));
  CHECK_THROWS_WITH(numa_cpu_slices(NumaBinding::kNode, t, cpuset, {NumaPlacement{1, 0, 1}}),
                    Catch::Contains("NUMA node 1 holds none of the launcher's CPUs (0-3)"));
}

TEST_CASE("--numa_binding on a fake 4-node sysfs: sockets of two nodes, a memory-only node", "[launcher][numa]") {
  FakeSysfs fs;
  four_nodes(fs);
  const CpuTopology t = read_cpu_topology(fs.root());
  REQUIRE(t.node_cpus.size() == 5);
  CHECK(t.node_cpus.at(4).empty());
  const std::vector<int> all = range(0, 15);
  // 3 workers over the 4 nodes that have CPUs: nodes 0, 1, 2; 8 workers: two per node.
  const std::vector<NumaPlacement> three = spread_over_nodes(t, all, 3);
  CHECK((three[0].node == 0 && three[1].node == 1 && three[2].node == 2));
  const std::vector<NumaPlacement> eight = spread_over_nodes(t, all, 8);
  CHECK((eight[5].node == 2 && eight[5].share == 1 && eight[5].shares == 2));
  // socket: the node's socket's two nodes.
  const Slices socket = numa_cpu_slices(NumaBinding::kSocket, t, all, three);
  CHECK(socket == Slices{range(0, 7), range(0, 7), range(8, 15)});
  CHECK(numa_cpu_slices(NumaBinding::kNode, t, all, three) == Slices{range(0, 3), range(4, 7), range(8, 11)});
  CHECK(numa_cpu_slices(NumaBinding::kExclusive, t, all, eight)[5] == std::vector<int>{10, 11});
  // One L3 per node: every core-complex worker of a node gets the node's one group.
  CHECK(numa_cpu_slices(NumaBinding::kCoreComplex, t, all, eight)[5] == range(8, 11));
}

TEST_CASE("--numa_binding places GPU workers near their GPUs, shares among the node's visible GPUs", "[launcher][numa]") {
  // 4 GPUs, two on each node; this job's workers use GPUs 1 and 2.
  const std::vector<NumaPlacement> p = gpu_placements({0, 0, 1, 1}, {1, 2});
  REQUIRE(p.size() == 2);
  CHECK((p[0].node == 0 && p[0].share == 1 && p[0].shares == 2));
  CHECK((p[1].node == 1 && p[1].share == 0 && p[1].shares == 2));

  FakeSysfs fs;
  two_nodes(fs);
  const char* ids[] = {"0000:1b:00.0", "0000:3b:00.0", "0000:9b:00.0", "0000:bb:00.0"};
  std::vector<GpuInfo> gpus;
  for (int i = 0; i < 4; ++i) {
    fs.write(ddp::str("bus/pci/devices/", ids[i], "/numa_node"), i < 2 ? "0" : "1");
    GpuInfo g;
    g.index = i;
    g.pci_bus_id = ids[i];
    gpus.push_back(g);
  }
  MachineResources machine(range(0, 15), [&] { return std::make_unique<FakeGpus>(gpus); }, fs.root());
  const LaunchConfig numa = ddp::launcher::testing::parse({"--numa_binding", "exclusive", "/bin/true"});
  std::string how;
  // Without --gpus: local rank i near GPU i (torchrun's rule).
  CHECK(resolve_cpu_binding(numa, {}, 4, {}, machine, how) ==
        Slices{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}});
  CHECK(how == "--numa_binding exclusive (GPU workers, each near its GPU)");
  // The GPUs chosen (--gpus 1,2): each worker's share is its GPU's, not its local rank's.
  CHECK(resolve_cpu_binding(numa, {}, 2, {"1", "2"}, machine, how) == Slices{{2, 3, 10, 11}, {4, 5, 12, 13}});
  // An inherited CUDA_VISIBLE_DEVICES=3,2: local rank 0 uses visible GPU 0, which is GPU 3 on node 1,
  // the first of that node's visible GPUs (as torch.cuda numbers them): the node's first half.
  MachineResources inherited(range(0, 15), [&] { return std::make_unique<FakeGpus>(gpus); }, fs.root());
  CHECK(resolve_cpu_binding(numa, EnvironmentSnapshot::from_map({{"CUDA_VISIBLE_DEVICES", "3,2"}}), 1, {}, inherited,
                            how) == Slices{{4, 5, 12, 13}});
  CHECK_THROWS_WITH(resolve_cpu_binding(numa, {}, 5, {}, machine, how),
                    Catch::Contains("binds worker i near GPU i, but 4 GPU(s) are visible for 5 workers"));
  // No GPU (NVML cannot be loaded): CPU workers over the nodes.
  MachineResources cpu_only(range(0, 15), []() -> std::unique_ptr<GpuProvider> { throw UsageError("no NVML here"); },
                            fs.root());
  CHECK(resolve_cpu_binding(numa, {}, 2, {}, cpu_only, how) == Slices{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}});
  CHECK(how == "--numa_binding exclusive (CPU workers over 2 NUMA node(s), no GPU (no NVML here))");
  // A sysfs without the files: one line naming the file.
  MachineResources no_sysfs(range(0, 15), nullptr, fs.root() + "/missing");
  CHECK_THROWS_WITH(resolve_cpu_binding(numa, {}, 2, {}, no_sysfs, how),
                    Catch::Contains("--numa_binding: cannot read " + fs.root() + "/missing/devices/system/cpu/online"));
}

TEST_CASE("--numa_binding on this machine's /sys", "[launcher][numa]") {
  const CpuTopology t = read_cpu_topology("/sys");
  REQUIRE_FALSE(t.node_cpus.empty());
  MachineResources machine = MachineResources::of_this_machine();
  const std::vector<int>& allowed = machine.cpus();
  // One worker per allowed CPU: each bound inside its node and the affinity.
  const std::vector<NumaPlacement> p = spread_over_nodes(t, allowed, static_cast<int>(allowed.size()));
  const Slices node = numa_cpu_slices(NumaBinding::kNode, t, allowed, p);
  REQUIRE(node.size() == allowed.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    const std::vector<int>& of_node = t.node_cpus.at(p[i].node);
    CHECK_FALSE(node[i].empty());
    for (int cpu : node[i]) CHECK(std::find(of_node.begin(), of_node.end(), cpu) != of_node.end());
    for (int cpu : node[i]) CHECK(std::find(allowed.begin(), allowed.end(), cpu) != allowed.end());
  }
  const std::vector<NumaPlacement> one_each = spread_over_nodes(t, allowed, 1);
  const Slices whole = numa_cpu_slices(NumaBinding::kExclusive, t, allowed, one_each);
  std::vector<int> expected;
  for (int cpu : t.node_cpus.at(one_each[0].node)) {
    if (std::find(allowed.begin(), allowed.end(), cpu) != allowed.end()) expected.push_back(cpu);
  }
  CHECK(whole == Slices{expected});  // one worker: the whole node, within the affinity
}
