#pragma once
// --numa_binding node|socket|exclusive|core-complex: each local worker's CPUs from the machine's
// NUMA topology, read from sysfs. See Note [NUMA binding] in numa_binding.cpp.
#include <map>
#include <string>
#include <vector>

#include "launcher/config/config.h"

namespace ddp::launcher::resources {

// What sysfs tells of the CPUs: each NUMA node's CPUs, and of each CPU its socket, its physical
// core and its last-level cache (a core and a cache are named by their lowest CPU).
struct CpuTopology {
  std::map<int, std::vector<int>> node_cpus;  // NUMA node -> its CPUs, ascending
  std::map<int, int> socket_of;               // CPU -> topology/physical_package_id
  std::map<int, int> core_of;                 // CPU -> lowest CPU of topology/thread_siblings_list
  std::map<int, int> llc_of;                  // CPU -> lowest CPU sharing its highest-level cache
};

// Reads ROOT/devices/system/node/node*/cpulist and, for each of those CPUs,
// ROOT/devices/system/cpu/cpuN/{topology,cache}; ROOT is /sys on a real machine (tests give a fake
// one). A machine without node folders is one node holding ROOT/devices/system/cpu/online. Throws
// UsageError naming the file that could not be read.
CpuTopology read_cpu_topology(const std::string& sysfs_root);

// The NUMA node of a PCI device (a GPU, "0000:3b:00.0"), from ROOT/bus/pci/devices/ID/numa_node;
// -1 (a machine of one node) reads as 0. Throws UsageError when the file cannot be read.
int pci_numa_node(const std::string& sysfs_root, const std::string& pci_bus_id);

// Where a local worker is bound: its NUMA node, and its share of that node's CPUs for exclusive and
// core-complex (share `share` of `shares`).
struct NumaPlacement {
  int node = 0;
  int share = 0;
  int shares = 1;
};

// CPU-only workers: nproc workers over the nodes that hold any of `allowed`, in contiguous blocks of
// local ranks (4 workers on 2 nodes: 0 0 1 1); each worker's share among its node's workers.
std::vector<NumaPlacement> spread_over_nodes(const CpuTopology& topology, const std::vector<int>& allowed, int nproc);

// GPU workers: local rank i uses visible GPU `gpu_of[i]`; `visible_gpu_nodes[v]` is the NUMA node of
// visible GPU v. A worker's share is its GPU's place among the visible GPUs of its node: torchrun's
// rule, so two jobs on other GPUs of one node never get the same CPUs with exclusive.
std::vector<NumaPlacement> gpu_placements(const std::vector<int>& visible_gpu_nodes, const std::vector<int>& gpu_of);

// The CPUs of each placed worker for `mode`, within `allowed` (the launcher's affinity), ascending.
// Throws UsageError when a node holds none of `allowed`, or has fewer cores than shares (exclusive).
std::vector<std::vector<int>> numa_cpu_slices(config::NumaBinding mode, const CpuTopology& topology,
                                              const std::vector<int>& allowed,
                                              const std::vector<NumaPlacement>& placements);

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; false for anything else.
bool parse_cpu_list(const std::string& text, std::vector<int>& cpus);

}  // namespace ddp::launcher::resources
