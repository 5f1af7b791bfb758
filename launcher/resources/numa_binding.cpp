#include "launcher/resources/numa_binding.h"

#include <algorithm>
#include <dirent.h>
#include <fstream>
#include <set>

#include "ddp/base/error.h"
#include "launcher/resources/resources.h"

// Note [NUMA binding]
// ~~~~~~~~~~~~~~~~~~~
// torchrun's --numa-binding (torch/numa/binding.py) binds worker i to CPUs near GPU i: node, every
// CPU of the GPU's NUMA node; socket, every CPU of the nodes of that node's socket; exclusive, the
// node's physical cores split among the node's GPUs, in GPU order, the lower GPUs one core more when
// it does not divide (whole cores: a core's hyperthreads stay together); core-complex, one group of
// cores sharing a last-level cache, the node's GPUs taking the groups in turn (larger groups first).
// Always within the launcher's own affinity, so a Slurm or cgroup cpuset is respected. ddp_launch
// does the same with the GPU each worker gets (--gpus, an inherited CUDA_VISIBLE_DEVICES, else local
// rank i -> GPU i), its NUMA node read from /sys/bus/pci/devices/<id>/numa_node; a worker's share is
// its GPU's place among the visible GPUs of its node, not among this job's workers, so two jobs on
// other GPUs of one node never get the same cores. Without GPUs (torchrun fails there) the workers
// are CPU workers: local ranks in contiguous blocks over the NUMA nodes that hold the launcher's
// CPUs (4 workers, 2 nodes: 0 0 1 1), each sharing its node with the workers of its block. Binding
// itself is the --cpu_bind path (sched_setaffinity between fork and exec, OMP_NUM_THREADS = the CPU
// count unless set): torchrun wraps the command in numactl or binds in the child the same way.

namespace ddp::launcher::resources {
namespace {

bool read_text(const std::string& path, std::string& text) {
  std::ifstream in(path);
  if (!in) return false;
  std::getline(in, text);
  return true;
}

std::string must_read(const std::string& path) {
  std::string text;
  if (!read_text(path, text)) {
    throw UsageError(ddp::str("--numa_binding: cannot read ", path, " (is /sys mounted?); bind with --cpu_bind exclusive instead"));
  }
  return text;
}

std::vector<int> must_read_cpu_list(const std::string& path) {
  std::vector<int> cpus;
  if (!parse_cpu_list(must_read(path), cpus)) throw UsageError(ddp::str("--numa_binding: ", path, " holds no CPU list"));
  return cpus;
}

int must_read_int(const std::string& path) {
  const std::string text = must_read(path);
  try {
    std::size_t used = 0;
    const int value = std::stoi(text, &used);
    if (text.find_first_not_of(" \t\r\n", used) == std::string::npos) return value;
  } catch (const std::exception&) {
  }
  throw UsageError(ddp::str("--numa_binding: ", path, " holds '", text, "', not a number"));
}

// The numbers N of the folders PREFIX<N> in `dir`, ascending; empty when `dir` is missing.
std::vector<int> numbered_folders(const std::string& dir, const std::string& prefix) {
  std::vector<int> numbers;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return numbers;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > prefix.size() && name.rfind(prefix, 0) == 0 &&
        name.find_first_not_of("0123456789", prefix.size()) == std::string::npos) {
      numbers.push_back(std::stoi(name.substr(prefix.size())));
    }
  }
  ::closedir(d);
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

// The lowest CPU sharing cpuN's highest-level cache; the CPU itself when sysfs lists no cache.
int last_level_cache_of(const std::string& cpu_dir, int cpu) {
  int best_level = -1, owner = cpu;
  for (int index : numbered_folders(cpu_dir + "/cache", "index")) {
    const std::string dir = cpu_dir + "/cache/index" + std::to_string(index);
    std::string type;
    if (read_text(dir + "/type", type) && type == "Instruction") continue;
    const int level = must_read_int(dir + "/level");
    if (level <= best_level) continue;
    const std::vector<int> shared = must_read_cpu_list(dir + "/shared_cpu_list");
    best_level = level;
    owner = shared.empty() ? cpu : shared.front();
  }
  return owner;
}

std::vector<int> intersect(const std::vector<int>& a, const std::vector<int>& allowed) {
  std::vector<int> out;
  std::set_intersection(a.begin(), a.end(), allowed.begin(), allowed.end(), std::back_inserter(out));
  return out;
}

// The groups of `cpus` that share `owner_of`'s value, each ascending, ordered by their owner.
std::vector<std::vector<int>> group_by(const std::vector<int>& cpus, const std::map<int, int>& owner_of) {
  std::map<int, std::vector<int>> groups;
  for (int cpu : cpus) {
    const auto it = owner_of.find(cpu);
    groups[it == owner_of.end() ? cpu : it->second].push_back(cpu);
  }
  std::vector<std::vector<int>> out;
  for (auto& [owner, group] : groups) out.push_back(std::move(group));
  return out;
}

}  // namespace

bool parse_cpu_list(const std::string& text, std::vector<int>& cpus) {
  std::set<int> out;
  std::string body = text;
  while (!body.empty() && (body.back() == '\n' || body.back() == ' ')) body.pop_back();
  if (body.empty()) {
    cpus.clear();
    return true;  // a node without CPUs (memory only) has an empty cpulist
  }
  std::size_t i = 0;
  while (i <= body.size()) {
    const std::size_t end = std::min(body.find(',', i), body.size());
    const std::string part = body.substr(i, end - i);
    const std::size_t dash = part.find('-');
    const std::string first = part.substr(0, dash), last = dash == std::string::npos ? first : part.substr(dash + 1);
    if (first.empty() || last.empty() || first.find_first_not_of("0123456789") != std::string::npos ||
        last.find_first_not_of("0123456789") != std::string::npos || first.size() > 6 || last.size() > 6) {
      return false;
    }
    const int lo = std::stoi(first), hi = std::stoi(last);
    if (hi < lo) return false;
    for (int cpu = lo; cpu <= hi; ++cpu) out.insert(cpu);
    i = end + 1;
  }
  cpus.assign(out.begin(), out.end());
  return true;
}

CpuTopology read_cpu_topology(const std::string& sysfs_root) {
  CpuTopology t;
  const std::string node_dir = sysfs_root + "/devices/system/node";
  for (int node : numbered_folders(node_dir, "node")) {
    t.node_cpus[node] = must_read_cpu_list(node_dir + "/node" + std::to_string(node) + "/cpulist");
  }
  if (t.node_cpus.empty()) t.node_cpus[0] = must_read_cpu_list(sysfs_root + "/devices/system/cpu/online");
  for (const auto& [node, cpus] : t.node_cpus) {
    for (int cpu : cpus) {
      const std::string dir = sysfs_root + "/devices/system/cpu/cpu" + std::to_string(cpu);
      t.socket_of[cpu] = must_read_int(dir + "/topology/physical_package_id");
      const std::vector<int> siblings = must_read_cpu_list(dir + "/topology/thread_siblings_list");
      t.core_of[cpu] = siblings.empty() ? cpu : siblings.front();
      t.llc_of[cpu] = last_level_cache_of(dir, cpu);
    }
  }
  return t;
}

int pci_numa_node(const std::string& sysfs_root, const std::string& pci_bus_id) {
  return std::max(must_read_int(sysfs_root + "/bus/pci/devices/" + pci_bus_id + "/numa_node"), 0);
}

std::vector<NumaPlacement> spread_over_nodes(const CpuTopology& topology, const std::vector<int>& allowed, int nproc) {
  std::vector<int> nodes;
  for (const auto& [node, cpus] : topology.node_cpus) {
    if (!intersect(cpus, allowed).empty()) nodes.push_back(node);
  }
  if (nodes.empty()) {
    throw UsageError(ddp::str("--numa_binding: no NUMA node holds the launcher's CPUs (", format_cpu_list(allowed), ")"));
  }
  const auto block_of = [&](int lr) { return static_cast<std::size_t>(static_cast<long long>(lr) * nodes.size() / nproc); };
  std::vector<int> count(nodes.size(), 0), seen(nodes.size(), 0);
  for (int lr = 0; lr < nproc; ++lr) ++count[block_of(lr)];
  std::vector<NumaPlacement> out;
  for (int lr = 0; lr < nproc; ++lr) {
    const std::size_t block = block_of(lr);
    out.push_back({nodes[block], seen[block]++, count[block]});
  }
  return out;
}

std::vector<NumaPlacement> gpu_placements(const std::vector<int>& visible_gpu_nodes, const std::vector<int>& gpu_of) {
  std::vector<NumaPlacement> out;
  for (int gpu : gpu_of) {
    NumaPlacement p{visible_gpu_nodes.at(gpu), 0, 0};
    for (int v = 0; v < static_cast<int>(visible_gpu_nodes.size()); ++v) {
      if (visible_gpu_nodes[v] != p.node) continue;
      if (v < gpu) ++p.share;
      ++p.shares;
    }
    out.push_back(p);
  }
  return out;
}

std::vector<std::vector<int>> numa_cpu_slices(config::NumaBinding mode, const CpuTopology& topology,
                                              const std::vector<int>& allowed,
                                              const std::vector<NumaPlacement>& placements) {
  const auto cpus_of_node = [&](int node) {
    const auto it = topology.node_cpus.find(node);
    std::vector<int> cpus = it == topology.node_cpus.end() ? std::vector<int>{} : intersect(it->second, allowed);
    if (cpus.empty()) {
      throw UsageError(ddp::str("--numa_binding: NUMA node ", node, " holds none of the launcher's CPUs (",
                                format_cpu_list(allowed), "); run it where that node's CPUs are allowed"));
    }
    return cpus;
  };
  if (mode == config::NumaBinding::kNone) return {};
  std::vector<std::vector<int>> slices;
  for (const NumaPlacement& p : placements) {
    const std::vector<int> node_cpus = cpus_of_node(p.node);
    std::vector<int> cpus;
    switch (mode) {
      case config::NumaBinding::kNone:
      case config::NumaBinding::kNode:
        cpus = node_cpus;
        break;
      case config::NumaBinding::kSocket: {
        const int socket = topology.socket_of.at(node_cpus.front());
        for (const auto& [node, all] : topology.node_cpus) {
          for (int cpu : intersect(all, allowed)) {
            if (topology.socket_of.at(cpu) == socket) cpus.push_back(cpu);
          }
        }
        std::sort(cpus.begin(), cpus.end());
        break;
      }
      case config::NumaBinding::kExclusive: {
        const std::vector<std::vector<int>> cores = group_by(node_cpus, topology.core_of);
        const int n = static_cast<int>(cores.size());
        if (n < p.shares) {
          throw UsageError(ddp::str("--numa_binding exclusive: NUMA node ", p.node, " has ", n,
                                    " physical cores of the launcher's CPUs for ", p.shares,
                                    " workers; use --numa_binding node, or fewer workers"));
        }
        const int base = n / p.shares, extra = n % p.shares;
        const int start = p.share * base + std::min(p.share, extra);
        const int end = start + base + (p.share < extra ? 1 : 0);
        for (int c = start; c < end; ++c) cpus.insert(cpus.end(), cores[c].begin(), cores[c].end());
        std::sort(cpus.begin(), cpus.end());
        break;
      }
      case config::NumaBinding::kCoreComplex: {
        std::vector<std::vector<int>> caches = group_by(node_cpus, topology.llc_of);
        std::stable_sort(caches.begin(), caches.end(),
                         [](const auto& a, const auto& b) { return a.size() > b.size(); });  // larger first
        cpus = caches[p.share % caches.size()];
        break;
      }
    }
    slices.push_back(std::move(cpus));
  }
  return slices;
}

}  // namespace ddp::launcher::resources
