#!/usr/bin/env bash
# The README's test command: set-up, build, then every test through CTest.
# Extra arguments go to ctest, e.g. scripts/test.sh -R launcher
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$DDP_ROOT/scripts/setup.sh"
"$DDP_ROOT/scripts/build.sh"
cd "$DDP_BUILD_DIR"
ctest --output-on-failure --parallel "${DDP_TEST_JOBS:-1}" "$@"
