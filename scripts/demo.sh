#!/usr/bin/env bash
# The README's main-job command: set-up (what building and running need, no test beds), a build of
# only the two programs it runs, then one epoch of the main job started through ddp_launch.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$DDP_ROOT/scripts/setup.sh"
DDP_BUILD_TARGETS="ddp_launch train_fashion_mnist" "$DDP_ROOT/scripts/build.sh"
bin="$DDP_BUILD_DIR/bin"
# One epoch of the LeNet-style CNN on the real Fashion-MNIST, 2 DDP workers on loopback (Gloo);
# rank 0 prints the progress line and the test accuracy.
exec "$bin/ddp_launch" --standalone --nproc_per_node 2 "$bin/train_fashion_mnist" --mode ddp --epochs 1 "$@"
