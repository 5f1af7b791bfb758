#include "launcher/config/worker_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include "ddp/base/error.h"
#include "launcher/config/config.h"

// Note [Python workers]
// ~~~~~~~~~~~~~~~~~~~~~
// torchrun runs `PYTHON -u TARGET ARGS` (or `PYTHON -u -m MODULE ARGS`) unless --no_python; a job
// moving from torchrun to ddp_launch keeps its command line. ddp_launch's default stays a binary
// (it is a launcher for compiled workers), so Python is chosen by what the target is: a name ending
// in `.py`, -m/--module, or --run_path (torchrun's in-process runpy; here the script runs in its own
// interpreter, the same as without the flag). --no_python execs the target whatever its name. The
// interpreter is --python, else $PYTHON_EXEC (torchrun's override), else $PYTHON, else python3 on
// PATH; it is looked up once, here, so a missing interpreter or script is one line before any worker
// starts. `-u` (unbuffered) keeps every rank's lines in order in the prefixed console, as torchrun's.

namespace ddp::launcher::config {
namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Whether `path` can be exec'd; otherwise `why` says why not.
bool executable(const std::string& path, std::string& why) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    why = "does not exist";
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    why = "is a directory";
    return false;
  }
  // access() alone lets root "execute" anything; exec needs an x bit too.
  if (::access(path.c_str(), X_OK) != 0 || (st.st_mode & (S_IXUSR | S_IXGRP | S_IXOTH)) == 0) {
    why = "is not executable (chmod +x it?)";
    return false;
  }
  return true;
}

}  // namespace

std::string resolve_program(const std::string& what, const std::string& name, const std::string& path_var) {
  std::string why;
  if (name.empty()) throw UsageError(ddp::str("the ", what, " is an empty string"));
  if (name.find('/') != std::string::npos) {
    if (!executable(name, why)) throw UsageError(ddp::str(what, " '", name, "' ", why));
    return name;
  }
  std::string first_problem;
  for (auto dir : split_list(path_var, ':')) {
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + name;
    if (executable(candidate, why)) return candidate;
    if (why != "does not exist" && first_problem.empty()) first_problem = candidate + " " + why;
  }
  if (!first_problem.empty()) throw UsageError(ddp::str(what, " '", name, "': ", first_problem));
  throw UsageError(ddp::str(what, " '", name, "' not found in PATH (give a path like ./", name, ")"));
}

WorkerCommand resolve_worker_command(const std::vector<std::string>& program, const PythonRequest& request,
                                     const EnvironmentSnapshot& env) {
  const std::string path_var = env.get("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  const std::string& target = program.front();
  if (request.no_python && request.module) {
    throw UsageError("--no_python and -m/--module exclude each other: a module runs in Python");
  }
  if (request.no_python && request.run_path) {
    throw UsageError("--no_python and --run_path exclude each other: --run_path runs a Python script");
  }
  WorkerCommand command;
  command.python = !request.no_python && (request.module || request.run_path || ends_with(target, ".py"));
  if (!command.python) {
    command.path = resolve_program("training binary", target, path_var);
    command.args = program;
    return command;
  }
  if (target.empty()) throw UsageError("the training script is an empty string");
  if (!request.module) {
    struct stat st {};
    if (::stat(target.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) {
      throw UsageError(ddp::str("training script '", target, "' ",
                                S_ISDIR(st.st_mode) ? "is a directory" : "does not exist"));
    }
  }
  // See Note [Python workers].
  std::string python = request.python;
  const char* python_from = "--python";
  for (const char* variable : {"PYTHON_EXEC", "PYTHON"}) {
    if (!python.empty()) break;
    python = env.get(variable).value_or("");
    python_from = variable;
  }
  if (python.empty()) {
    python = "python3";
    python_from = "the default (python3 on PATH)";
  }
  command.path = resolve_program(ddp::str("Python interpreter (", python_from, ")"), python, path_var);
  command.args = {python, "-u"};
  if (request.module) command.args.push_back("-m");
  command.args.insert(command.args.end(), program.begin(), program.end());
  return command;
}

}  // namespace ddp::launcher::config
