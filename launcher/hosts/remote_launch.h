#pragma once
// One command, every host (docs/launcher.md "One command, every host"): ddp_launch --hostfile FILE
// or --hosts H:S,... starts one ddp_launch per host over --ssh_cmd, relays their output with the
// host's name in front, and stops every host on the first failure or a signal.
#include "ddp/base/worker_variables.h"
#include "launcher/config/config.h"

namespace ddp::launcher::hosts {

// Whether the flags ask to start every host (--hostfile or --hosts). Throws UsageError for the
// flags of that mode given without it (--include, --exclude, --env).
bool starts_every_host(const config::LaunchConfig& c);

// Reads the hosts, checks every one of them before anything starts (See Note [Start-up check]),
// then runs each node's ddp_launch and supervises them (See Note [Stopping the hosts]). Returns
// the job's exit code: the first failed host's, 128 + N after signal N, 2 for a host problem found
// by the check (one line per host, naming it). --dry_run prints each host's command instead.
int launch_on_hosts(const config::LaunchConfig& c, const EnvironmentSnapshot& env);

// --watch_stdin (what every host's ddp_launch is given): a thread that reads stdin and, when it
// closes, sends this process SIGTERM, which stops the workers as a Ctrl-C would.
void stop_when_stdin_closes();

}  // namespace ddp::launcher::hosts
