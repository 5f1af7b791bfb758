#pragma once
// The command lines of a one-command job (docs/launcher.md "One command, every host"): what each
// host runs over --ssh_cmd, built from the local launcher's own flags. Pure: unit-tested.
#include <string>
#include <utility>
#include <vector>

#include "launcher/hosts/hostfile.h"

namespace ddp::launcher::hosts {

// One word for a POSIX shell: as is when it holds only characters no shell treats specially,
// else in single quotes (a ' inside becomes '\''). See Note [Remote command line].
std::string quote_for_shell(const std::string& word);

// What every host's command line is made of.
struct RemoteJob {
  std::string launcher_path;  // this ddp_launch, absolute: the same path on every host
  std::string working_dir;    // the local working directory: the same on every host
  std::vector<std::pair<std::string, std::string>> env;  // forwarded NAME=VALUE, in order
  std::vector<std::string> passed_flags;  // the local flags each host gets (passed_on_flags)
  std::vector<std::string> program;       // the training binary as given, and its arguments
  std::string master_addr;
  int nnodes = 1;
  // --nproc_per_node was given: it is among passed_flags; else each host runs its slots.
  bool nproc_given = false;
  bool gpus_given = false;  // --gpus was given: a slot subset cannot choose the GPUs too
  // Elastic membership (--nnodes MIN:MAX, See Note [Elastic rounds]): "MIN:MAX", and each host
  // joins the c10d rendezvous instead of taking a fixed node rank: --rdzv_endpoint and --rdzv_id
  // are added with these values, or passed on as given (empty here).
  std::string elastic_nnodes;
  std::string rdzv_endpoint;
  std::string rdzv_id;
};

// Flags that only the local launcher reads (the host list, how to reach the hosts) or that the
// local launcher sets per host (the node's place in the job).
bool is_local_only_flag(const std::string& name);

// `launcher_args` (normalised: "--name" or "--name=value", values as separate words after a
// "--name") without the local-only flags and their values.
std::vector<std::string> passed_on_flags(const std::vector<std::string>& launcher_args);

// Every value of flag `name` ("--env A --env=B" -> {"A", "B"}).
std::vector<std::string> flag_values(const std::vector<std::string>& launcher_args, const std::string& name);

// Whether flag `name` is among launcher_args.
bool has_flag(const std::vector<std::string>& launcher_args, const std::string& name);

// The command line node `node_rank` runs on `host`: cd to the working directory, the forwarded
// variables, the launcher with the passed flags plus --nnodes, --node_rank, --master_addr,
// --nproc_per_node (from the slots unless given) and --watch_stdin; `check` puts --dry_run in
// place of --watch_stdin (the start-up check). Throws UsageError when the slots cannot be given.
std::string remote_command_line(const RemoteJob& job, const HostSlots& host, int node_rank, bool check);

// The workers each host runs: the slots it may use, which must be the same on every host (a
// node's ranks are node_rank * nproc + local_rank), unless --nproc_per_node is given (then 0).
// Throws UsageError naming the hosts that differ.
int uniform_slot_count(const std::vector<HostSlots>& hosts);

// The argv that starts `remote_line` on `host`: /bin/sh -c 'exec SSH_CMD "$@"' sh HOST REMOTE_LINE,
// so --ssh_cmd (a command and its options) may hold quotes and variables, is called exactly as
// ssh, and is this launcher's child itself (it gets the parent-death signal).
std::vector<std::string> ssh_argv(const std::string& ssh_cmd, const std::string& host, const std::string& remote_line);

}  // namespace ddp::launcher::hosts
