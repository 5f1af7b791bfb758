#include "ddp/distributed/topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "ddp/base/error.h"
#include "ddp/base/str.h"

namespace ddp {

const char* to_string(CollectiveAlgorithm algorithm) {
  switch (algorithm) {
    case CollectiveAlgorithm::kAuto: return "auto";
    case CollectiveAlgorithm::kFlat: return "flat";
    case CollectiveAlgorithm::kHierarchical: return "hierarchical";
  }
  return "?";
}

CollectiveAlgorithm parse_collective_algorithm(const std::string& text) {
  if (text == "auto") return CollectiveAlgorithm::kAuto;
  if (text == "flat") return CollectiveAlgorithm::kFlat;
  if (text == "hierarchical") return CollectiveAlgorithm::kHierarchical;
  throw UsageError(str("unknown collective algorithm '", text, "': use flat, hierarchical or auto"));
}

bool Topology::uniform() const {
  return std::all_of(ranks_of_host.begin(), ranks_of_host.end(),
                     [&](const std::vector<int>& ranks) { return ranks.size() == ranks_of_host[0].size(); });
}

std::vector<int> Topology::ranks_with_local_rank(int local_rank) const {
  std::vector<int> ranks;
  for (const auto& host : ranks_of_host) {
    if (local_rank < static_cast<int>(host.size())) ranks.push_back(host[static_cast<std::size_t>(local_rank)]);
  }
  return ranks;
}

std::string Topology::describe() const {
  const int n = hosts();
  if (uniform()) {
    return str(n, n == 1 ? " host x " : " hosts x ", ranks_per_host(), ranks_per_host() == 1 ? " rank" : " ranks");
  }
  std::vector<std::size_t> sizes;
  for (const auto& host : ranks_of_host) sizes.push_back(host.size());
  return str(n, " hosts with ", join(sizes, ", "), " ranks");
}

Topology topology_from_identities(const std::vector<std::string>& identity_of_rank) {
  Topology topology;
  std::map<std::string, int> host_index;
  for (const std::string& identity : identity_of_rank) {
    auto [it, inserted] = host_index.emplace(identity, topology.hosts());
    if (inserted) topology.ranks_of_host.emplace_back();
    auto& ranks = topology.ranks_of_host[static_cast<std::size_t>(it->second)];
    topology.host_of_rank.push_back(it->second);
    topology.local_rank_of_rank.push_back(static_cast<int>(ranks.size()));
    ranks.push_back(static_cast<int>(topology.host_of_rank.size()) - 1);
  }
  return topology;
}

Topology single_host_topology(int world_size) {
  return topology_from_identities(std::vector<std::string>(static_cast<std::size_t>(world_size), "host"));
}

Topology one_rank_per_host_topology(int world_size) {
  std::vector<std::string> identities;
  for (int r = 0; r < world_size; ++r) identities.push_back(str("host ", r));
  return topology_from_identities(identities);
}

std::string this_host_identity() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat ns {};
  const auto netns = ::stat("/proc/self/ns/net", &ns) == 0 ? static_cast<unsigned long long>(ns.st_ino) : 0ULL;
  return str(name, "/", boot_id, "/net:", netns);
}

AlgorithmChoice choose_algorithm(CollectiveAlgorithm requested, const Topology& topology) {
  const std::string where = topology.describe();
  if (requested == CollectiveAlgorithm::kFlat) return {false, str("flat (as requested; ", where, ")")};
  const char* asked = requested == CollectiveAlgorithm::kAuto ? "auto" : "hierarchical requested";
  if (topology.hosts() <= 1) return {false, str("flat (", asked, ": ", where, ", nothing crosses hosts)")};
  if (!topology.uniform()) {
    return {false, str("flat (", asked, ": ", where,
                       "; the hierarchical algorithm needs the same number of ranks on every host)")};
  }
  if (topology.ranks_per_host() == 1) {
    return {false, str("flat (", asked, ": ", where, ", the flat ring already sends each byte across hosts once)")};
  }
  return {true, str("hierarchical (", asked, ": ", where,
                    ", sends 2(H-1)/H instead of 2(n-1)/n of each buffer across each host link)")};
}

}  // namespace ddp
