#include "launcher/hosts/remote_command.h"

#include <algorithm>
#include <iterator>

#include "ddp/base/error.h"
#include "ddp/base/str.h"

namespace ddp::launcher::hosts {
namespace {

constexpr const char* kLocalOnlyFlags[] = {"hostfile", "hosts",     "include",        "exclude", "ssh_cmd",
                                           "env",      "nnodes",    "node_rank",      "master_addr",
                                           "dry_run",  "watch_stdin"};

// The flag name of a normalised launcher argument ("--name=v" -> "name"), or "" for a value.
std::string flag_name(const std::string& arg) {
  if (arg.rfind("--", 0) != 0) return "";
  return arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
}

bool takes_separate_value(const std::string& arg) {
  // Switches of the local-only list take no value; every other local-only flag does.
  const std::string name = flag_name(arg);
  return arg.find('=') == std::string::npos && name != "dry_run" && name != "watch_stdin";
}

}  // namespace

// Note [Remote command line]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// ssh joins its arguments with spaces and hands the result to the remote user's login shell: the
// line must mean the same to sh, bash, dash, zsh and ksh. Every word that holds anything but
// [A-Za-z0-9_./=:,+@%-] is put in single quotes, inside which no POSIX shell expands anything; a
// single quote itself ends the quoting, is escaped, and reopens it ('\''). Nothing else is assumed
// about the remote shell: no profile variables (forwarded ones are given to `env` on the line),
// no aliases (the launcher is named by its absolute path), `exec` so no shell waits in between and
// the launcher's stdin is ssh's channel (See Note [Stopping the hosts]). The line is passed as ONE
// argument of --ssh_cmd, as ssh's own `ssh HOST 'cmd'`.
std::string quote_for_shell(const std::string& word) {
  static const char kSafe[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./=:,+@%-";
  if (!word.empty() && word.find_first_not_of(kSafe) == std::string::npos) return word;
  std::string out = "'";
  for (char ch : word) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

bool is_local_only_flag(const std::string& name) {
  return std::find(std::begin(kLocalOnlyFlags), std::end(kLocalOnlyFlags), name) != std::end(kLocalOnlyFlags);
}

std::vector<std::string> passed_on_flags(const std::vector<std::string>& launcher_args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < launcher_args.size(); ++i) {
    const std::string& arg = launcher_args[i];
    if (is_local_only_flag(flag_name(arg))) {
      if (takes_separate_value(arg)) ++i;
      continue;
    }
    out.push_back(arg);
  }
  return out;
}

std::vector<std::string> flag_values(const std::vector<std::string>& launcher_args, const std::string& name) {
  std::vector<std::string> out;
  for (size_t i = 0; i < launcher_args.size(); ++i) {
    const std::string& arg = launcher_args[i];
    if (flag_name(arg) != name) continue;
    const auto eq = arg.find('=');
    if (eq != std::string::npos) {
      out.push_back(arg.substr(eq + 1));
    } else if (i + 1 < launcher_args.size()) {
      out.push_back(launcher_args[++i]);
    }
  }
  return out;
}

bool has_flag(const std::vector<std::string>& launcher_args, const std::string& name) {
  return std::any_of(launcher_args.begin(), launcher_args.end(),
                     [&](const std::string& arg) { return flag_name(arg) == name; });
}

int uniform_slot_count(const std::vector<HostSlots>& hosts) {
  DDP_CHECK(!hosts.empty(), "uniform_slot_count needs hosts");
  const size_t n = hosts.front().local_ranks.size();
  for (const HostSlots& h : hosts) {
    if (h.local_ranks.size() != n) {
      throw UsageError(ddp::str("hosts ", hosts.front().host, " (", n, " slots) and ", h.host, " (",
                                h.local_ranks.size(),
                                " slots) differ: every node runs the same number of workers (rank = node_rank * "
                                "nproc + local_rank); give equal slots, or --nproc_per_node"));
    }
  }
  return static_cast<int>(n);
}

std::string remote_command_line(const RemoteJob& job, const HostSlots& host, int node_rank, bool check) {
  std::vector<std::string> words{job.launcher_path};
  words.insert(words.end(), job.passed_flags.begin(), job.passed_flags.end());
  if (job.elastic_nnodes.empty()) {
    words.push_back(ddp::str("--nnodes=", job.nnodes));
    words.push_back(ddp::str("--node_rank=", node_rank));
    words.push_back("--master_addr=" + job.master_addr);
  } else {  // node ranks come from the rounds (See Note [Elastic rounds])
    words.push_back("--nnodes=" + job.elastic_nnodes);
    if (!job.rdzv_endpoint.empty()) words.push_back("--rdzv_endpoint=" + job.rdzv_endpoint);
    if (!job.rdzv_id.empty()) words.push_back("--rdzv_id=" + job.rdzv_id);
  }
  const bool subset = static_cast<int>(host.local_ranks.size()) != host.slots;
  if (subset && (job.nproc_given || job.gpus_given)) {
    throw UsageError(ddp::str("--include/--exclude choose some slots of ", host.host, ", and --",
                              job.nproc_given ? "nproc_per_node" : "gpus",
                              " is given too: choose the slots in one place"));
  }
  if (!job.nproc_given) words.push_back(ddp::str("--nproc_per_node=", host.local_ranks.size()));
  if (subset) words.push_back("--gpus=" + ddp::join(host.local_ranks, ","));  // DeepSpeed's meaning of slots
  words.push_back(check ? "--dry_run" : "--watch_stdin");
  words.push_back("--");
  words.insert(words.end(), job.program.begin(), job.program.end());

  std::string line = "cd " + quote_for_shell(job.working_dir) + " && exec ";
  if (!job.env.empty()) {
    line += "env";
    for (const auto& [name, value] : job.env) line += " " + quote_for_shell(name + "=" + value);
    line += " ";
  }
  for (size_t i = 0; i < words.size(); ++i) line += (i == 0 ? "" : " ") + quote_for_shell(words[i]);
  return line;
}

std::vector<std::string> ssh_argv(const std::string& ssh_cmd, const std::string& host, const std::string& remote_line) {
  return {"/bin/sh", "-c", "exec " + ssh_cmd + " \"$@\"", "sh", host, remote_line};
}

}  // namespace ddp::launcher::hosts
