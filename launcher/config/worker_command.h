#pragma once
// What each worker runs: a binary (exec'd as given) or a Python script or module, run as torchrun
// runs them. See Note [Python workers] in worker_command.cpp.
#include <string>
#include <vector>

#include "ddp/base/worker_variables.h"

namespace ddp::launcher::config {

// torchrun's switches that choose how the target runs, and ddp_launch's --python.
struct PythonRequest {
  bool module = false;     // -m/--module: the target is a module name
  bool run_path = false;   // --run_path: the target is a script (run as `PYTHON -u script`)
  bool no_python = false;  // --no_python: exec the target, whatever its name
  std::string python;      // --python; empty: $PYTHON_EXEC, $PYTHON, python3 on PATH
};

// The executable's path (as execvp would find it) and the argv (argv[0] as given).
struct WorkerCommand {
  std::string path;
  std::vector<std::string> args;
  bool python = false;  // the target runs in a Python interpreter
};

// `program` is the target and its arguments (non-empty). Throws UsageError saying what is wrong
// (no such binary, script or interpreter; --no_python with --module).
WorkerCommand resolve_worker_command(const std::vector<std::string>& program, const PythonRequest& request,
                                     const EnvironmentSnapshot& env);

// Looks a program up the way execvp does: a name with '/' is taken as is, else searched in PATH.
// `what` names it in errors ("training binary"). Throws UsageError (missing, not executable).
std::string resolve_program(const std::string& what, const std::string& name, const std::string& path_var);

}  // namespace ddp::launcher::config
