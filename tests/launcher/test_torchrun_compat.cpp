// Process tests of torchrun's command line (docs/launcher.md, "torchrun's flags"): real torchrun
// command lines with a binary print the same dry run as the same job in ddp_launch's spellings, and
// the flags that cannot apply to a binary are refused with one line. See Note [torchrun's command
// line] in launcher/config/torchrun_flags.cpp.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "ddp/base/str.h"
#include "tests/launcher/process_harness.h"

using namespace ddp::launcher::testing;
using namespace std::chrono_literals;

TEST_CASE("torchrun command lines with a binary run unchanged, with torchrun's meaning", "[process][dry_run]") {
  // Each real torchrun command line (a binary: --no-python) must print the same dry run as the
  // same job written in ddp_launch's own spellings, with every setting on the dry run's lines.
  TempDir dir;
  const std::string w = worker_path();
  const std::string logs = dir.path() + "/logs";
  struct Case {
    std::vector<std::string> torchrun;
    std::vector<std::string> ours;
    std::map<std::string, std::string> env;  // for the torchrun line
  };
  const std::vector<Case> cases = {
      {{"--nproc-per-node=2", "--no-python", w, "--lr", "0.1"}, {"--nproc_per_node", "2", w, "--lr", "0.1"}, {}},
      {{"--nnodes=2", "--node-rank=1", "--master-addr=10.1.2.3", "--master-port=29501", "--nproc_per_node=2", "--no_python", w},
       {"--nnodes", "2", "--node_rank", "1", "--master_addr", "10.1.2.3", "--master_port", "29501", "--nproc_per_node", "2", w},
       {}},
      {{"--nnodes=1:1", "--rdzv-backend=static", "--rdzv-id=job7", "--max-restarts=3", "--monitor-interval=0.5",
        "--role=trainer", "--start-method=spawn", "--event-log-handler=null", "--duplicate-stdout-filters=", "--no-python", w},
       {"--nnodes", "1", "--rdzv_id", "job7", "--max_restarts", "3", "--monitor_interval", "0.5", "--role", "trainer", w},
       {}},
      {{"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--rdzv-id=j",
        "--rdzv-conf=join_timeout=900,last_call_timeout=30,close_timeout=10,read_timeout=60", "--local-addr=10.0.0.5",
        "--no-python", w},
       {"--nnodes", "2", "--rdzv_endpoint", "127.0.0.1:29400", "--rdzv_id", "j", "--rdzv_timeout", "900", "--local_addr",
        "10.0.0.5", w},
       {}},
      {{"--nproc_per_node", "2", "--log-dir", logs, "-r3", "-t", "0:1", "--local-ranks-filter=0", "--no-python", w},
       {"--nproc_per_node", "2", "--log_dir", logs, "--redirects", "3", "--tee", "0:1", "--local_ranks_filter", "0", w},
       {}},
      {{"--nproc_per_node", "2", "-r=2", "--no-python", w}, {"--nproc_per_node", "2", "--redirects", "2", w}, {}},
      {{"--signals-to-handle=SIGTERM,SIGINT,SIGUSR1,SIGUSR2", "--shutdown-timeout=15", "--no-python", w},
       {"--signals_to_handle", "SIGTERM,SIGINT,SIGUSR1,SIGUSR2", "--shutdown_grace", "15", w},
       {}},
      {{"--nproc_per", "2", "--max_rest", "1", "--no-python", "--", w}, {"--nproc_per_node", "2", "--max_restarts", "1", w}, {}},
      // torchrun's PET_ variables, and a flag winning over its variable.
      {{w},
       {"--nnodes", "2", "--node_rank", "1", "--master_addr", "10.1.2.3", "--nproc_per_node", "2", "--max_restarts", "2",
        "--role", "r", w},
       {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_MASTER_ADDR", "10.1.2.3"}, {"PET_NPROC_PER_NODE", "2"},
        {"PET_MAX_RESTARTS", "2"}, {"PET_ROLE", "r"}, {"PET_NO_PYTHON", "1"}, {"PET_START_METHOD", "fork"}}},
      {{"--nproc_per_node", "2", w}, {"--nproc_per_node", "2", w}, {{"PET_NPROC_PER_NODE", "3"}, {"PET_MODULE", "0"}, {"PET_LOG_DIR", ""}}},
      {{"--no-python", w}, {"--shutdown_grace", "7", w}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}}},
  };
  for (const auto& c : cases) {
    std::vector<std::string> torchrun = c.torchrun;
    torchrun.insert(torchrun.begin(), "--dry_run");
    std::vector<std::string> ours = c.ours;
    ours.insert(ours.begin(), "--dry_run");
    INFO(ddp::join(torchrun, " ") << "  vs  " << ddp::join(ours, " "));
    const auto theirs_run = run_launcher(torchrun, c.env, 10s);
    const auto ours_run = run_launcher(ours, {}, 10s);
    INFO(theirs_run.err);
    CHECK(theirs_run.exit_code == 0);
    CHECK(ours_run.exit_code == 0);
    CHECK_THAT(theirs_run.out, Catch::Contains("]: command: " + w));
    CHECK(theirs_run.out == ours_run.out);
  }
  // What the spellings above mean, once in plain words (the comparisons rest on these lines).
  const auto roles = run_launcher({"--dry_run", "--role=trainer", "--signals-to-handle=SIGTERM,SIGUSR1", "--no-python", w});
  CHECK_THAT(roles.out, Catch::Contains("ROLE_NAME=trainer"));
  CHECK_THAT(roles.out, Catch::Contains("forwarded signals SIGTERM,SIGUSR1;"));
  // --virtual_local_rank: LOCAL_RANK=0 everywhere, each worker sees only its inherited GPU.
  const auto virtual_ranks = run_launcher({"--dry_run", "--nproc_per_node", "2", "--virtual-local-rank", "--no-python", w},
                                          {{"CUDA_VISIBLE_DEVICES", "6,GPU-abc"}});
  INFO(virtual_ranks.err);
  CHECK(count_of(virtual_ranks.out, "LOCAL_RANK=0 ") == 2);
  CHECK_THAT(virtual_ranks.out, Catch::Contains("RANK=1 LOCAL_RANK=0"));
  CHECK_THAT(virtual_ranks.out, Catch::Contains("CUDA_VISIBLE_DEVICES=6 "));
  CHECK_THAT(virtual_ranks.out, Catch::Contains("CUDA_VISIBLE_DEVICES=GPU-abc "));
  const auto defaults = run_launcher({"--dry_run", "--no-python", w});
  CHECK_THAT(defaults.out, Catch::Contains("ROLE_NAME=default"));
  CHECK_THAT(defaults.out, Catch::Contains("forwarded signals SIGTERM,SIGINT,SIGHUP,SIGQUIT;"));
  CHECK_THAT(defaults.out, Catch::Contains("[rank 0]: output: stdout to console, stderr to console"));
}

TEST_CASE("torchrun flags that cannot apply to a binary: one line saying why, exit 2", "[process][bad_input]") {
  const std::string w = worker_path();
  struct Case {
    std::vector<std::string> args;
    std::string expected;
    std::map<std::string, std::string> env;
  };
  const std::vector<Case> cases = {
      {{"-m", "--no-python", w}, "--no_python and -m/--module exclude each other", {}},
      {{w}, "--no_python and -m/--module exclude each other", {{"PET_MODULE", "1"}, {"PET_NO_PYTHON", "1"}}},
      {{"--run-path", "--no_python", w}, "--no_python and --run_path exclude each other", {}},
      {{"/nonexistent/train.py"}, "training script '/nonexistent/train.py' does not exist", {}},
      {{"--python", "/nonexistent/python", "-m", "json.tool"}, "Python interpreter (--python) '/nonexistent/python' does not exist", {}},
      {{"-m", "json.tool"}, "Python interpreter (PYTHON) 'no-such-python-xyz' not found in PATH", {{"PYTHON", "no-such-python-xyz"}}},
      // A malformed PET_ variable is named (the user never typed the flag); both spellings of one.
      {{w}, "PET_NPROC_PER_NODE='two' (torchrun's variable for --nproc_per_node): --nproc_per_node", {{"PET_NPROC_PER_NODE", "two"}}},
      {{w}, "PET_N_PROC_PER_NODE='0' (torchrun's variable for --nproc_per_node)", {{"PET_N_PROC_PER_NODE", "0"}}},
      {{w}, "PET_NPROC_PER_NODE='3' and PET_N_PROC_PER_NODE='2' disagree", {{"PET_NPROC_PER_NODE", "3"}, {"PET_N_PROC_PER_NODE", "2"}}},
      {{w}, "PET_MASTER_PORT='0' (torchrun's variable for --master_port): --master_port 0", {{"PET_NNODES", "2"}, {"PET_MASTER_PORT", "0"}}},
      {{w}, "PET_MAX_RESTARTS='-1'", {{"PET_MAX_RESTARTS", "-1"}}},
      {{w}, "PET_RDZV_ENDPOINT='h:x'", {{"PET_RDZV_ENDPOINT", "h:x"}}},
      {{w}, "PET_SIGNALS_TO_HANDLE='SIGFOO'", {{"PET_SIGNALS_TO_HANDLE", "SIGFOO"}}},
      {{"--rdzv-endpoint", "localhost:0", "--nnodes", "2", w}, "port 0 (a free port) works on one node only", {}},
      {{"--logs-specs", "custom", w}, "--logs_specs custom: names a Python entry point", {}},
      {{"--numa-binding", "cores", w}, "--numa_binding: invalid choice 'cores' (choose from node, socket, exclusive, core-complex)", {}},
      {{"--numa-binding", "node", "--cpu_bind", "exclusive", w}, "--numa_binding and --cpu_bind exclusive both pin the workers", {}},
      {{"--event-log-handler", "console", w}, "no torchelastic event log", {}},
      {{"--start-method", "thread", w}, "invalid choice 'thread'", {}},
      {{"--rdzv-conf", "is_host=1", w}, "--rdzv_conf is_host", {}},
      {{"--rdzv-conf", "bogus=1", w}, "unknown key 'bogus'", {}},
      // Control bytes in what is quoted stay on one line (fuzz_rdzv_conf found a newline in a key).
      {{"--rdzv-conf", "bog\nus=1", w}, "unknown key 'bog\\x0aus'", {}},
      {{"--cpu_bind", "none\r", w}, "--cpu_bind: unknown value 'none\\x0d'", {}},
      {{"--rdzv-conf", "join_timeout=soon", w}, "join_timeout=soon: expected a number of seconds", {}},
      {{"--rdzv-conf", "join_timeout=5", "--rdzv_timeout", "6", w}, "disagree", {}},
      {{"--signals-to-handle", "SIGKILL", w}, "SIGKILL cannot be forwarded", {}},
      {{"--signals-to-handle", "SIGTERM,SIGFOO", w}, "unknown signal 'SIGFOO'", {}},
      {{"--nproc-per-node", "xpu", w}, "not Intel XPUs", {}},
      {{"--nnodes", "1:4", w}, "(elastic membership) needs the c10d rendezvous", {}},
      {{"--shutdown-timeout", "5", "--shutdown-grace", "6", w}, "are one setting", {}},
      {{"--log", "x", w}, "ambiguous flag '--log'", {}},
      {{w}, "PET_STANDALONE (0: off, other integers: on, as torchrun reads it) expects an integer, got 'yes'",
       {{"PET_STANDALONE", "yes"}}},
  };
  for (const auto& c : cases) {
    INFO(ddp::join(c.args, " "));
    const auto outcome = run_launcher(c.args, c.env, 10s);
    INFO(outcome.err);
    CHECK(outcome.exit_code == 2);
    CHECK(count_lines(outcome.err) == 1);
    CHECK(outcome.err.rfind("ddp_launch: error: ", 0) == 0);
    CHECK_THAT(outcome.err, Catch::Contains(c.expected));
    CHECK(outcome.out.empty());
  }
}

TEST_CASE("--print-completion (torchrun 2.14): scripts the shells run, naming every flag the parser takes",
          "[process][completion]") {
  // bash sources the script and completes a prefix of --nproc_per_node, in both spellings.
  const std::string launcher = launcher_path();
  auto run_bash = [](const std::string& script) {
    Child shell({"/bin/bash", "-c", script});
    const auto outcome = shell.wait(20s);
    REQUIRE(outcome);
    return *outcome;
  };
  const auto bash = run_bash(
       "source <('" + launcher + "' --print-completion bash) || exit 3; "
       "for word in --npr --nproc-p --log_line; do COMP_WORDS=(ddp_launch \"$word\"); COMP_CWORD=1; _ddp_launch; "
       "echo \"$word -> ${COMPREPLY[*]}\"; done; complete -p ddp_launch");
  INFO(bash.out << bash.err);
  REQUIRE(bash.exit_code == 0);
  CHECK_THAT(bash.out, Catch::Contains("--npr -> --nproc_per_node --nproc-per-node\n"));
  CHECK_THAT(bash.out, Catch::Contains("--nproc-p -> --nproc-per-node\n"));
  CHECK_THAT(bash.out, Catch::Contains("--log_line -> --log_line_prefix_template\n"));
  CHECK_THAT(bash.out, Catch::Contains("complete -o filenames -F _ddp_launch ddp_launch"));
  // Every flag, in both spellings.
  const auto words = run_bash("source <('" + launcher + "' --print_completion=bash); COMP_WORDS=(ddp_launch --); "
                              "COMP_CWORD=1; _ddp_launch; printf '%s\\n' \"${COMPREPLY[@]}\"");
  REQUIRE(words.exit_code == 0);
  CHECK(count_lines(words.out) > 60);
  for (const std::string flag : {"--nnodes", "--rdzv-endpoint", "--collapse_lines", "--print-completion", "--ranks-filter"}) {
    CHECK_THAT(words.out, Catch::Contains(flag + "\n"));
  }
  const auto unknown = run_launcher({"--print-completion", "fish"}, {}, 10s);
  CHECK(unknown.exit_code == 2);
  CHECK(count_lines(unknown.err) == 1);
  CHECK_THAT(unknown.err, Catch::Contains("--print_completion: invalid choice 'fish' (choose from bash, zsh, tcsh)"));
  // zsh and tcsh: the scripts' shape (the shells are not installed here); each flag once, both spellings.
  const auto zsh = run_launcher({"--print-completion", "zsh"}, {}, 10s);
  REQUIRE(zsh.exit_code == 0);
  CHECK(zsh.out.rfind("#compdef ddp_launch\n", 0) == 0);
  CHECK_THAT(zsh.out, Catch::Contains("'(--nproc_per_node --nproc-per-node)'{--nproc_per_node,--nproc-per-node}'["));
  CHECK_THAT(zsh.out, Catch::Contains("'(--standalone)'--standalone'[Single node on loopback with a free port]' \\\n"));
  const auto tcsh = run_launcher({"--print-completion", "tcsh"}, {}, 10s);
  REQUIRE(tcsh.exit_code == 0);
  CHECK_THAT(tcsh.out, Catch::Contains("complete ddp_launch 'c/--/(nnodes node_rank node-rank "));
}
