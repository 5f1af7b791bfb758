#!/usr/bin/env bash
# The README's test command: set-up, build, then every test through CTest.
#   scripts/test.sh [--sanitize] [ctest arguments], e.g. scripts/test.sh -R launcher
#   --sanitize: build with -DDDP_SANITIZE="address;undefined" into build-asan/ (or $DDP_BUILD_DIR)
#               and run the tests under ASan and UBSan (options: scripts/sanitizers.sh).
set -euo pipefail
sanitize=0
if [[ ${1:-} == --sanitize ]]; then
  sanitize=1
  shift
  DDP_BUILD_DIR=${DDP_BUILD_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build-asan}
fi
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$DDP_ROOT/scripts/setup.sh"
if ((sanitize)); then
  source "$DDP_ROOT/scripts/sanitizers.sh"
  # gcc warns spuriously on instrumented code (-Wmaybe-uninitialized and friends); the normal build
  # keeps -Werror.
  "$DDP_ROOT/scripts/build.sh" -DDDP_SANITIZE="address;undefined" -DDDP_WARNINGS_AS_ERRORS=OFF
  ddp_export_sanitizer_options
else
  "$DDP_ROOT/scripts/build.sh"
fi
cd "$DDP_BUILD_DIR"
ctest --output-on-failure --parallel "${DDP_TEST_JOBS:-1}" "$@"
