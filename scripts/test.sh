#!/usr/bin/env bash
# The README's test command: set-up, build, then every test through CTest.
#   scripts/test.sh [--sanitize | --sanitize-ci] [ctest arguments], e.g. scripts/test.sh -R launcher
#   --sanitize:    build with -DDDP_SANITIZE="address;undefined" into build-asan/ (or $DDP_BUILD_DIR)
#                  and run the whole suite under ASan and UBSan (options: scripts/sanitizers.sh).
#   --sanitize-ci: the same for the subset that CI runs (docs/faults.md, "Bad input"): only the
#                  targets of those tests are built, examples and benchmarks are not configured.
set -euo pipefail
mode=${1:-}
case $mode in
  --sanitize|--sanitize-ci)
    shift
    # Exported: scripts/build.sh reads it too.
    export DDP_BUILD_DIR=${DDP_BUILD_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build-asan} ;;
  *) mode= ;;
esac
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# The sanitized subset: the torch-free base, the launcher, the samplers, the readers and the checkpoint loader with their
# fuzz regressions, the launcher's command-line fuzz test.
sanitize_ci_tests='^(base\.|launcher\.|samplers\.|fuzz\.|faults\.launch_fuzz$|ddp\.(basics|units|checkpoint)$)'
sanitize_ci_targets="test_base ddp_launch ddp_launch_rdzv ddp_launch_metrics launch_test_worker test_launcher_logic test_launch_process
  test_hostfile test_remote_launch
  test_samplers test_fuzz_regressions test_checkpoint test_ddp_units test_ddp_basics test_faults fault_worker"

# Set-up starts no service (a package's daemon listening on this machine): checked around it.
listening_before=$(ddp_listening_ports)
"$DDP_ROOT/scripts/setup.sh" --test
new_ports=$(comm -13 <(echo "$listening_before") <(ddp_listening_ports) | paste -s -d ' ' -)
[[ -z $new_ports ]] || ddp_die "set-up left new listening sockets ($new_ports): a package started a service; stop it and see scripts/setup.sh"
ctest_args=()
if [[ -n $mode ]]; then
  source "$DDP_ROOT/scripts/sanitizers.sh"
  # gcc warns spuriously on instrumented code (-Wmaybe-uninitialized and friends); the normal build
  # keeps -Werror.
  sanitize_args=(-DDDP_SANITIZE="address;undefined" -DDDP_WARNINGS_AS_ERRORS=OFF)
  if [[ $mode == --sanitize-ci ]]; then
    DDP_BUILD_TARGETS=$sanitize_ci_targets "$DDP_ROOT/scripts/build.sh" "${sanitize_args[@]}" \
      -DDDP_BUILD_EXAMPLES=OFF -DDDP_BUILD_BENCHMARKS=OFF -DDDP_INSTALL=OFF
    ctest_args=(-R "$sanitize_ci_tests")
  else
    "$DDP_ROOT/scripts/build.sh" "${sanitize_args[@]}" -DDDP_BUILD_EXAMPLES=ON -DDDP_BUILD_BENCHMARKS=ON \
      -DDDP_INSTALL=ON
  fi
  ddp_export_sanitizer_options
else
  # Explicitly unsanitized: the cache of a build folder that was once configured otherwise keeps it.
  "$DDP_ROOT/scripts/build.sh" -DDDP_SANITIZE=
fi
cd "$DDP_BUILD_DIR"
ctest --output-on-failure --parallel "${DDP_TEST_JOBS:-1}" "${ctest_args[@]}" "$@"
