#!/usr/bin/env bash
# The README's main-job command: set-up, build, then a short job started through ddp_launch.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$DDP_ROOT/scripts/setup.sh"
"$DDP_ROOT/scripts/build.sh"
bin="$DDP_BUILD_DIR/bin"
if [[ -x $bin/ddp_launch && -x $bin/train_fashion_mnist ]]; then
  # One epoch of the LeNet-style CNN on the real Fashion-MNIST, 2 DDP workers on loopback (Gloo);
  # rank 0 prints the progress line and the test accuracy.
  exec "$bin/ddp_launch" --standalone --nproc_per_node 2 "$bin/train_fashion_mnist" --mode ddp --epochs 1 "$@"
elif [[ -x $bin/ddp_launch ]]; then
  exec "$bin/ddp_launch" --standalone --nproc_per_node 2 "$bin/hello_ddp" "$@"
else
  echo "demo: built; ddp_launch is not part of this build yet"
fi
