// Unit tests of the host list (launcher/hosts/hostfile.h) and of each host's command line
// (launcher/hosts/remote_command.h): the parsers, and the quoting run through a real /bin/sh.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "ddp/base/error.h"
#include "launcher/hosts/hostfile.h"
#include "launcher/hosts/remote_command.h"

using namespace ddp::launcher;
using namespace ddp::launcher::hosts;

namespace {

// Runs argv (no shell of ours in between) and returns its stdout.
std::string run_capture(const std::vector<std::string>& argv) {
  int out[2];
  REQUIRE(::pipe(out) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return text;
}

std::vector<std::string> split_nul(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\0') continue;
    out.push_back(text.substr(start, i - start));
    start = i + 1;
  }
  return out;
}

const std::vector<std::string> kAwkwardWords = {
    "plain", "two words", "it's", "\"double\"", "$HOME", "${PATH}", "`id`", "$(id)", "back\\slash", "new\nline",
    "", "*", "a;b", "!bang", "'", "''", "tab\there", "~", "-n", "x=y z", "%s"};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  return "<no UsageError>";
}

}  // namespace

TEST_CASE("hostfile: DeepSpeed's format, comments, blank lines, order", "[launcher][hostfile]") {
  const auto hosts = parse_hostfile("# the job\n\nworker-2 slots=4\n  worker-1   slots=4  # spare\nworker-0\n", "hf");
  REQUIRE(hosts.size() == 3);
  CHECK(hosts[0].host == "worker-2");
  CHECK(hosts[0].slots == 4);
  CHECK(hosts[0].local_ranks == std::vector<int>{0, 1, 2, 3});
  CHECK(hosts[1].host == "worker-1");
  CHECK(hosts[2].host == "worker-0");
  CHECK(hosts[2].slots == 1);
}

TEST_CASE("hostfile: a malformed line or a duplicate host names the line and the host", "[launcher][hostfile]") {
  CHECK(message_of([] { parse_hostfile("a slots=2\nb slots=two\n", "hf"); }).find("hf line 2 (host b)") !=
        std::string::npos);
  CHECK(message_of([] { parse_hostfile("a slots=2 gpus=3\n", "hf"); }) ==
        "hostfile hf line 1 (host a): 'a slots=2 gpus=3' is not 'HOST slots=N'");
  CHECK(message_of([] { parse_hostfile("a slots=0\n", "hf"); }).find("must be in 1..") != std::string::npos);
  CHECK(message_of([] { parse_hostfile("a slots=1\nb\n\na slots=2\n", "hf"); }) ==
        "hostfile hf line 4: host a is listed twice (also line 1); give each host once with its slots");
  CHECK(message_of([] { parse_hostfile("-oProxyCommand=x slots=1\n", "hf"); }).find("is not a host name") !=
        std::string::npos);
  CHECK(message_of([] { parse_hostfile("# nothing\n", "hf"); }) == "hostfile hf lists no hosts");
}

TEST_CASE("hosts: Horovod's -H list", "[launcher][hostfile]") {
  const auto hosts = parse_hosts_list("h1:4,h2:4,h3");
  REQUIRE(hosts.size() == 3);
  CHECK(hosts[1].host == "h2");
  CHECK(hosts[1].slots == 4);
  CHECK(hosts[2].slots == 1);
  CHECK(message_of([] { parse_hosts_list("h1:2,h1:2"); }).find("h1 is listed twice") != std::string::npos);
  CHECK(message_of([] { parse_hosts_list("h1:x"); }).find("--hosts slots of h1") != std::string::npos);
  CHECK(message_of([] { parse_hosts_list(""); }).find("--hosts is empty") != std::string::npos);
  // Control bytes in the input are quoted as \xNN: the error stays one line (found by fuzz_hostfile).
  for (const char* list : {"h1\nh2:2", "h1:2,h1:2\n", "h1:2\n"}) {
    const std::string message = message_of([&] { parse_hosts_list(list); });
    INFO(message);
    CHECK(message.find('\n') == std::string::npos);
    CHECK(message.find("\\x0a") != std::string::npos);
  }
  CHECK(message_of([] { parse_hosts_list("h\r1:2"); }).find("'h\\x0d1' is not a host name") != std::string::npos);
}

TEST_CASE("include/exclude: DeepSpeed's host@host:slots", "[launcher][hostfile]") {
  const auto all = parse_hosts_list("host1:4,host2:4,host3:4");
  const auto included = select_hosts(all, "host3@host2:0,1", "");
  REQUIRE(included.size() == 2);
  CHECK(included[0].host == "host2");  // the hosts' order, not the flag's
  CHECK(included[0].local_ranks == std::vector<int>{0, 1});
  CHECK(included[1].host == "host3");
  CHECK(included[1].local_ranks == std::vector<int>{0, 1, 2, 3});
  const auto excluded = select_hosts(all, "", "host1@host3:1,3");
  REQUIRE(excluded.size() == 2);
  CHECK(excluded[0].host == "host2");
  CHECK(excluded[1].local_ranks == std::vector<int>{0, 2});
  CHECK(select_hosts(all, "", "").size() == 3);
  CHECK(message_of([&] { select_hosts(all, "host1", "host2"); }).find("exclude each other") != std::string::npos);
  CHECK(message_of([&] { select_hosts(all, "host9", ""); }).find("host 'host9' is not one of the job's hosts") !=
        std::string::npos);
  CHECK(message_of([&] { select_hosts(all, "host1:4", ""); }).find("must be in 0..3") != std::string::npos);
  CHECK(message_of([&] { select_hosts(all, "", "host1@host2@host3"); }).find("leaves no host") != std::string::npos);
}

TEST_CASE(".ddp_env: NAME=VALUE lines", "[launcher][hostfile]") {
  const auto env = parse_env_file("# forwarded\nNCCL_DEBUG=INFO\n\nEMPTY=\nSPACED=a b = c\r\n", ".ddp_env");
  REQUIRE(env.size() == 3);
  CHECK(env[0] == std::make_pair(std::string("NCCL_DEBUG"), std::string("INFO")));
  CHECK(env[1].second.empty());
  CHECK(env[2].second == "a b = c");
  CHECK(message_of([] { parse_env_file("OK=1\n1BAD=2\n", ".ddp_env"); }).find(".ddp_env line 2") !=
        std::string::npos);
  CHECK(message_of([] { parse_env_file("no value\n", ".ddp_env"); }).find("is not NAME=VALUE") != std::string::npos);
}

TEST_CASE("quote_for_shell: sh reads back every word as it was", "[launcher][hostfile]") {
  CHECK(quote_for_shell("--nproc_per_node=2") == "--nproc_per_node=2");
  CHECK(quote_for_shell("it's") == "'it'\\''s'");
  std::string script = "printf '%s\\0'";
  for (const auto& word : kAwkwardWords) script += " " + quote_for_shell(word);
  CHECK(split_nul(run_capture({"/bin/sh", "-c", script})) == kAwkwardWords);
}

TEST_CASE("passed_on_flags: the host flags stay local, the rest go to every host", "[launcher][hostfile]") {
  const std::vector<std::string> args = {"--hostfile", "hf",       "--max_restarts", "3",
                                         "--env",      "A",        "--env=B",        "--tee=3",
                                         "--ssh_cmd",  "ssh -p 2", "--master_addr",  "h0",
                                         "--dry_run",  "--include=h1", "--nproc_per_node", "2"};
  CHECK(passed_on_flags(args) ==
        std::vector<std::string>{"--max_restarts", "3", "--tee=3", "--nproc_per_node", "2"});
  CHECK(flag_values(args, "env") == std::vector<std::string>{"A", "B"});
  CHECK(has_flag(args, "dry_run"));
  CHECK(!has_flag(args, "nnodes"));
}

TEST_CASE("remote_command_line: sh runs the launcher with every word intact", "[launcher][hostfile]") {
  // The "launcher" is sh printing its arguments, so the line is checked by the shell that runs it.
  const auto dir = std::filesystem::temp_directory_path() / ("ddp hostfile 'test' $x " + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  RemoteJob job;
  job.launcher_path = "/bin/sh";
  job.working_dir = dir.string();
  job.env = {{"FORWARDED", "a 'b' \"c\" $d"}, {"EMPTY", ""}};
  job.passed_flags = {"-c", "printf '%s\\0' \"$PWD\" \"$FORWARDED\" \"$EMPTY\" \"$@\"", "sh", "--tee=3"};
  job.program = {"./train", "--name", "it's $HOME"};
  job.program.insert(job.program.end(), kAwkwardWords.begin(), kAwkwardWords.end());
  job.master_addr = "host0";
  job.nnodes = 2;
  const HostSlots host{"host1", 2, {0, 1}};
  std::vector<std::string> expected = {dir.string(), "a 'b' \"c\" $d", "", "--tee=3", "--nnodes=2", "--node_rank=1",
                                       "--master_addr=host0", "--nproc_per_node=2", "--watch_stdin", "--"};
  expected.insert(expected.end(), job.program.begin(), job.program.end());
  const std::string line = remote_command_line(job, host, 1, false);
  CHECK(split_nul(run_capture({"/bin/sh", "-c", line})) == expected);
  // Through --ssh_cmd as ssh calls it (CMD HOST 'line'): a fake ssh that runs the line in sh.
  const std::string fake_ssh = "sh -c 'test \"$1\" = host1 && exec /bin/sh -c \"$2\"' fake_ssh";
  CHECK(split_nul(run_capture(ssh_argv(fake_ssh, "host1", line))) == expected);
  // The start-up check: --dry_run in place of --watch_stdin.
  std::replace(expected.begin(), expected.end(), std::string("--watch_stdin"), std::string("--dry_run"));
  CHECK(split_nul(run_capture({"/bin/sh", "-c", remote_command_line(job, host, 1, true)})) == expected);
  std::filesystem::remove(dir);
}

TEST_CASE("remote_command_line: a slot subset becomes --gpus; unequal hosts are refused", "[launcher][hostfile]") {
  RemoteJob job;
  job.launcher_path = "/opt/ddp/bin/ddp_launch";
  job.working_dir = "/work";
  job.program = {"./train"};
  job.master_addr = "h1";
  job.nnodes = 2;
  const HostSlots subset{"h2", 4, {1, 3}};
  CHECK(remote_command_line(job, subset, 1, false) ==
        "cd /work && exec /opt/ddp/bin/ddp_launch --nnodes=2 --node_rank=1 --master_addr=h1 --nproc_per_node=2 "
        "--gpus=1,3 --watch_stdin -- ./train");
  job.nproc_given = true;
  CHECK(message_of([&] { remote_command_line(job, subset, 1, false); }).find("choose the slots in one place") !=
        std::string::npos);
  CHECK(uniform_slot_count({{"a", 2, {0, 1}}, {"b", 4, {2, 3}}}) == 2);
  CHECK(message_of([] { uniform_slot_count({{"a", 2, {0, 1}}, {"b", 4, {0, 1, 2, 3}}}); }) ==
        "hosts a (2 slots) and b (4 slots) differ: every node runs the same number of workers (rank = node_rank * "
        "nproc + local_rank); give equal slots, or --nproc_per_node");
}
