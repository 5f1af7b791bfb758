#pragma once
// The hosts of a one-command job (docs/launcher.md "One command, every host"): a hostfile in
// DeepSpeed's / OpenMPI's format or Horovod's --hosts list, narrowed by DeepSpeed's --include /
// --exclude, into an ordered list of hosts with their worker slots. Pure: the caller reads files.
#include <string>
#include <utility>
#include <vector>

namespace ddp::launcher::hosts {

// One host of the job: its name as ssh is given it, its slot count, and the slots it may use
// (ascending, a subset of 0..slots-1; all of them unless --include/--exclude narrowed it).
struct HostSlots {
  std::string host;
  int slots = 1;
  std::vector<int> local_ranks;
};

// "host slots=N" per line ("host" alone: 1 slot, as OpenMPI), '#' comments, blank lines. A
// malformed line or a host listed twice throws UsageError naming `source` (the file), the line and
// the host. Order is the file's: it gives the node ranks.
std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& source);

// Horovod's -H: "host1:4,host2:4" ("host" alone: 1 slot). Throws UsageError.
std::vector<HostSlots> parse_hosts_list(const std::string& text);

// DeepSpeed's --include / --exclude: "host1@host2:0,2" names whole hosts or some of their slots.
// --include keeps only what it names (in the hosts' order); --exclude removes it (a host left
// without slots is dropped). Both empty: `hosts` unchanged. Both given, an unknown host or a slot
// out of range: UsageError.
std::vector<HostSlots> select_hosts(std::vector<HostSlots> hosts, const std::string& include,
                                    const std::string& exclude);

// The .ddp_env file: NAME=VALUE lines ('#' comments and blank lines skipped), in order. A line that
// is not NAME=VALUE with NAME a shell variable name throws UsageError naming `source` and the line.
std::vector<std::pair<std::string, std::string>> parse_env_file(const std::string& text, const std::string& source);

// Whether `name` is a portable environment variable name ([A-Za-z_][A-Za-z0-9_]*).
bool is_env_name(const std::string& name);

}  // namespace ddp::launcher::hosts
