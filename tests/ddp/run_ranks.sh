#!/usr/bin/env bash
# Stand-in launcher for the multi-process tests until ddp_launch is available:
#   run_ranks.sh NPROC WORKER [ARGS...]
# starts NPROC copies of WORKER with torchrun's variables on 127.0.0.1 and a free port, fails when
# any fails, and kills the rest when interrupted (CTest's timeout), so no process is left behind.
set -u
nproc=$1
shift
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
  echo $((20000 + RANDOM % 30000)))
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done; }
trap cleanup EXIT INT TERM
for ((rank = 0; rank < nproc; rank++)); do
  RANK=$rank WORLD_SIZE=$nproc LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$nproc MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port OMP_NUM_THREADS=1 "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
pids=()
exit $status
