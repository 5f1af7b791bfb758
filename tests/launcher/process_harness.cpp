#include "tests/launcher/process_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace ddp::launcher::testing {

std::string launcher_path() { return DDP_TEST_LAUNCHER; }
std::string worker_path() { return DDP_TEST_WORKER; }

TempDir::TempDir() {
  char tmpl[] = "/tmp/ddp_launch_test_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

Child::Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& extra_env) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    std::string key(*e, static_cast<size_t>(eq - *e));
    if (key.rfind("SLURM_", 0) == 0 || key == "OMP_NUM_THREADS") continue;
    env[key] = eq + 1;
  }
  for (const auto& [k, v] : extra_env) env[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env_strings) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  start_ = std::chrono::steady_clock::now();
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execve(cargv[0], cargv.data(), cenv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
}

Child::~Child() {
  if (!done_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (err_fd_ >= 0) ::close(err_fd_);
}

void Child::pump() {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  ::poll(fds, 2, 20);
  for (int i = 0; i < 2; ++i) {
    if (fds[i].fd < 0 || fds[i].revents == 0) continue;
    char buf[65536];
    const ssize_t r = ::read(fds[i].fd, buf, sizeof buf);
    if (r > 0) {
      (i == 0 ? outcome_.out : outcome_.err).append(buf, static_cast<size_t>(r));
    } else {
      ::close(fds[i].fd);
      (i == 0 ? out_fd_ : err_fd_) = -1;
    }
  }
}

bool Child::wait_for_err(const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (outcome_.err.find(text) == std::string::npos) {
    if (done_ || err_fd_ < 0 || std::chrono::steady_clock::now() >= deadline) return false;
    pump();
  }
  return true;
}

const std::string& Child::err_so_far() {
  if (!done_ && err_fd_ >= 0) pump();
  return outcome_.err;
}

std::optional<LaunchOutcome> Child::wait(std::chrono::milliseconds timeout) {
  if (done_) return outcome_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<int> status;
  std::optional<std::chrono::steady_clock::time_point> drain_deadline;
  while (true) {
    pump();
    int st = 0;
    if (!status && ::waitpid(pid_, &st, WNOHANG) == pid_) {
      status = st;
      // Its workers may hold the pipes a little longer; read until EOF, but bounded.
      drain_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    }
    if (status && ((out_fd_ < 0 && err_fd_ < 0) || std::chrono::steady_clock::now() >= *drain_deadline)) {
      done_ = true;
      outcome_.exit_code = WIFSIGNALED(*status) ? 128 + WTERMSIG(*status) : WEXITSTATUS(*status);
      outcome_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      return outcome_;
    }
    if (!status && std::chrono::steady_clock::now() >= deadline) return std::nullopt;
  }
}

LaunchOutcome run_launcher(const std::vector<std::string>& launcher_args,
                           const std::map<std::string, std::string>& extra_env, std::chrono::milliseconds timeout) {
  std::vector<std::string> argv{launcher_path()};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  Child child(argv, extra_env);
  auto outcome = child.wait(timeout);
  if (!outcome) FAIL("ddp_launch did not finish within " << timeout.count() << " ms: " << Catch::Detail::stringify(launcher_args));
  return *outcome;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

size_t count_lines(const std::string& text) { return static_cast<size_t>(std::count(text.begin(), text.end(), '\n')); }

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

bool wait_for_files(const std::string& dir, const std::string& prefix, size_t count, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    size_t n = 0;
    for (const auto& name : list_dir(dir)) {
      if (name.rfind(prefix, 0) == 0 && name.find(".tmp") == std::string::npos) ++n;
    }
    if (n >= count) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<std::string> run_folders(const std::string& log_dir, const std::string& run_id) {
  std::vector<std::string> found;
  for (const auto& name : list_dir(log_dir)) {
    // <run_id>_ and mkdtemp's six characters
    if (name.size() == run_id.size() + 7 && name.rfind(run_id + "_", 0) == 0) found.push_back(log_dir + "/" + name);
  }
  return found;
}

std::string run_folder(const std::string& log_dir, const std::string& run_id) {
  const std::vector<std::string> found = run_folders(log_dir, run_id);
  INFO("run folders of '" << run_id << "' in " << log_dir);
  REQUIRE(found.size() == 1);
  return found.front();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

WorkerRecord read_record(const std::string& path) {
  WorkerRecord r;
  std::istringstream in(read_text(path));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("pid=", 0) == 0) r.pid = std::stoi(line.substr(4));
    if (line.rfind("argv=", 0) == 0) r.argv.push_back(line.substr(5));
    if (line.rfind("env:", 0) == 0) {
      const auto eq = line.find('=');
      r.env[line.substr(4, eq - 4)] = line.substr(eq + 1);
    }
  }
  return r;
}

bool process_alive(int pid) {
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return false;
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

std::vector<int> wait_gone(const std::vector<int>& pids, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::vector<int> alive;
    for (int p : pids) {
      if (process_alive(p)) alive.push_back(p);
    }
    if (alive.empty() || std::chrono::steady_clock::now() >= deadline) return alive;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace ddp::launcher::testing
