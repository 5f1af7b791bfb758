#pragma once
// Where the ranks of a process group sit: which host each rank is on and its place among that
// host's ranks, and the choice between the flat and the hierarchical collective algorithms that
// follows from it. Torch-free and pure except this_host_identity(). See Note [Host topology].
#include <string>
#include <vector>

namespace ddp {

// Which algorithm the collectives over CPU tensors use (`--algorithm flat|hierarchical|auto`).
// See Note [Hierarchical collectives] in ddp/distributed/hierarchical_collectives.h.
enum class CollectiveAlgorithm { kAuto, kFlat, kHierarchical };

const char* to_string(CollectiveAlgorithm algorithm);
// "flat", "hierarchical" or "auto"; anything else throws ddp::UsageError naming the three.
CollectiveAlgorithm parse_collective_algorithm(const std::string& text);

// Note [Host topology]
// ~~~~~~~~~~~~~~~~~~~~
// Each rank publishes one string that names its host (this_host_identity(), or a made-up name in
// the in-process tests); ranks with the same string share a host. Hosts are numbered in the order
// of their lowest rank and a rank's local rank is its place among its host's ranks by global rank,
// so every rank derives the same topology from the same strings without further exchange, and
// torchrun's layout (rank = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK) maps onto itself. The
// launcher's LOCAL_WORLD_SIZE settles one case without any exchange: equal to the world size, every
// rank is on one host, and every rank sees the same. (LOCAL_WORLD_SIZE 1 does not: hosts may differ,
// and a rank that skipped the exchange would leave the others waiting for its identity.)
struct Topology {
  std::vector<int> host_of_rank;        // host index of each rank
  std::vector<int> local_rank_of_rank;  // place of each rank among its host's ranks
  std::vector<std::vector<int>> ranks_of_host;  // global ranks of each host, ascending

  int world_size() const { return static_cast<int>(host_of_rank.size()); }
  int hosts() const { return static_cast<int>(ranks_of_host.size()); }
  // True when every host has the same number of ranks.
  bool uniform() const;
  // The ranks of host 0 (meaningful when uniform()).
  int ranks_per_host() const { return ranks_of_host.empty() ? 0 : static_cast<int>(ranks_of_host[0].size()); }
  // The global ranks with local rank `local_rank`, by host.
  std::vector<int> ranks_with_local_rank(int local_rank) const;
  // "2 hosts x 2 ranks", "1 host x 3 ranks", "2 hosts with 3, 1 ranks".
  std::string describe() const;
};

// The topology of ranks 0..n-1 whose hosts are named identity_of_rank[0..n-1].
Topology topology_from_identities(const std::vector<std::string>& identity_of_rank);
// Every rank on one host, or every rank on a host of its own.
Topology single_host_topology(int world_size);
Topology one_rank_per_host_topology(int world_size);

// A string that differs between hosts and between network namespaces of one host (the namespace
// hosts of scripts/netns-cluster.sh) and is the same for every process of one of them: the host
// name, the kernel's boot id and the network namespace's inode.
std::string this_host_identity();

// The algorithm the group uses, given what was asked for and where the ranks are.
struct AlgorithmChoice {
  bool hierarchical = false;
  std::string reason;  // one line, for the log: why this algorithm
};
AlgorithmChoice choose_algorithm(CollectiveAlgorithm requested, const Topology& topology);

}  // namespace ddp
