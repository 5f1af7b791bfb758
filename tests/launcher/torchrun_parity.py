"""Every flag of the installed torch's torchrun, side by side with ddp_launch.

  torchrun_parity.py DDP_LAUNCH [RUN_PY]

RUN_PY: another torch's torch/distributed/run.py (scripts/setup.sh --test reads 2.14.1's from its
wheel into .venv/torchrun-2.14.1/run.py), whose parser is loaded on the installed torch; missing: skip.

Reads torchrun's own argument parser (torch.distributed.run.get_args_parser) from the wheel, and for
every spelling of every flag (each choice of a flag with choices) builds one command line; torchrun's
parser must accept it (so the value is one torchrun takes), and ddp_launch --dry_run must either run
it (exit 0) or, for the flags ddp_launch refuses (REFUSED), exit 2 with one line that names the
flag. A flag a newer torch adds that ddp_launch does not know fails here ("unknown flag"), so the
parity is redone against each torch that set-up installs. Exits 77 (CTest skip) without torch.
"""
import contextlib
import io
import os
import subprocess
import sys
import tempfile

try:
    from torch.distributed.run import get_args_parser
    import torch
except ImportError as e:  # pragma: no cover
    print(f"SKIP: no torch in {sys.executable}: {e}")
    sys.exit(77)

# Values for the flags whose default is empty or that need a particular value to run alone.
VALUES = {
    "nnodes": "1",
    "nproc_per_node": "2",
    "rdzv_backend": "static",
    "rdzv_endpoint": "127.0.0.1:29400",
    "rdzv_conf": "join_timeout=5",
    "rdzv_id": "parity",
    "max_restarts": "1",
    "monitor_interval": "0.5",
    "role": "trainer",
    "redirects": "3",
    "tee": "1",
    "local_ranks_filter": "0",
    "duplicate_stdout_filters": "epoch",
    "duplicate_stderr_filters": "error",
    "node_rank": "0",
    "master_addr": "127.0.0.1",
    "master_port": "29511",
    "local_addr": "127.0.0.1",
    "logs_specs": "my_logs_specs",
    "signals_to_handle": "SIGTERM,SIGINT",
    "shutdown_timeout": "5",
    "event_log_handler": "null",
    "log_line_prefix_template": "[${role_name}${rank}]:",
}
# torchrun's flags that ddp_launch refuses, in one line that names them (docs/launcher.md).
REFUSED = {"logs_specs"}
# Flags whose action is to print and exit: torchrun's parser exits there, by design.
EXITING = {"help", "print_completion"}


def load_parser():
    """torchrun's parser, and the torch version it is from."""
    if len(sys.argv) < 3:
        return get_args_parser(), torch.__version__
    run_py = sys.argv[2]
    if not os.path.isfile(run_py):
        print(f"SKIP: no {run_py} (scripts/setup.sh --test reads it from the torch 2.14.1 wheel)")
        sys.exit(77)
    import importlib.util
    spec = importlib.util.spec_from_file_location("torchrun_under_test", run_py)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    version = os.path.basename(os.path.dirname(os.path.abspath(run_py))).replace("torchrun-", "")
    return module.get_args_parser(), f"{version} (its run.py on torch {torch.__version__})"


def main():
    launch = sys.argv[1]
    parser, version = load_parser()
    log_dir = tempfile.mkdtemp(prefix="ddp_parity_")
    failures, checked = [], 0
    for action in parser._actions:
        if not action.option_strings:
            continue  # the training script and its arguments
        longest = max(action.option_strings, key=len)
        name = longest.lstrip("-").replace("-", "_")
        if name == "help":
            values = [None]
        elif action.nargs == 0:
            values = [None]
        elif action.choices:
            values = list(action.choices)
        elif name == "log_dir":
            values = [log_dir]
        elif name in VALUES:
            values = [VALUES[name]]
        else:
            failures.append(f"{longest}: no test value for this flag of torch {version}; add one to VALUES")
            continue
        for spelling in action.option_strings:
            for value in values:
                flag = [spelling] + ([] if value is None else [value])
                target = ["/bin/true"]
                extra = []
                if name in ("module", "run_path"):  # a Python target, run by this interpreter
                    target = ["json.tool"] if name == "module" else [os.path.abspath(__file__)]
                    extra = ["--python", sys.executable]
                try:
                    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                        parser.parse_args(flag + target)
                except SystemExit as e:
                    if name not in EXITING:
                        failures.append(f"{' '.join(flag)}: torchrun's parser refused it (exit {e.code})")
                        continue
                cmd = [launch, "--dry_run"] + extra + flag + target
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                checked += 1
                err_lines = [line for line in out.stderr.splitlines() if line.strip()]
                if name in REFUSED:
                    if out.returncode != 2 or len(err_lines) != 1 or name not in err_lines[0].replace("-", "_"):
                        failures.append(f"{' '.join(cmd)}: refused flag: exit {out.returncode}, stderr {out.stderr!r}")
                elif out.returncode != 0:
                    failures.append(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()[:300]}")
    if failures:
        print(f"FAIL: torch {version}'s torchrun flags vs ddp_launch:")
        for f in failures:
            print("  " + f)
        sys.exit(1)
    print(f"OK: torch {version}: {checked} torchrun command lines (every spelling and choice of "
          f"{sum(1 for a in parser._actions if a.option_strings)} flags) accepted by torchrun's parser and by ddp_launch "
          f"(refused in one line: {', '.join(sorted(REFUSED))})")


if __name__ == "__main__":
    main()
