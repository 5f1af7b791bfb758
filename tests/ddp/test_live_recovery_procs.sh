#!/usr/bin/env bash
# Live recovery with real processes: test_live_recovery_procs.sh WORKER SCRATCH_DIR
# Three live_recovery_worker processes (no launcher: its restart policy is not this test's subject);
# rank 2 SIGKILLs itself before step 2. The survivors (same processes: no restart) must go on at world
# size 2, finish all steps with the same parameters, and exit 0. Every process is bounded by timeout(1)
# and killed by the trap on any exit path.
set -euo pipefail
worker=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$scratch"
}
trap cleanup EXIT

steps=5
for rank in 0 1 2; do
  timeout --kill-after 5 60 "$worker" "$rank" 3 "$scratch/port" "$steps" 2 2 > "$scratch/out.$rank" 2> "$scratch/err.$rank" &
  pids+=($!)
  if [ "$rank" = 0 ]; then  # rank 0 serves the store: its port first
    for _ in $(seq 300); do [ -s "$scratch/port" ] && break; sleep 0.1; done
  fi
done
status=()
for pid in "${pids[@]}"; do
  set +e
  wait "$pid"
  status+=($?)
  set -e
done
fail() {
  echo "FAILED: $*"
  for rank in 0 1 2; do echo "--- rank $rank (exit ${status[$rank]})"; cat "$scratch/out.$rank"; tail -20 "$scratch/err.$rank"; done
  exit 1
}
# timeout(1) reports a child killed by a signal as 128 + signal: 137 for SIGKILL.
[ "${status[2]}" = 137 ] || fail "rank 2 should have died of SIGKILL"
[ "${status[0]}" = 0 ] && [ "${status[1]}" = 0 ] || fail "a survivor failed"
line0=$(tail -1 "$scratch/out.0")
line1=$(tail -1 "$scratch/out.1")
# The survivors are the processes that started (no restart), ran 3 ranks then 2, and agree.
pid0=$(head -1 "$scratch/out.0"); pid0=${pid0#started pid }
pid1=$(head -1 "$scratch/out.1"); pid1=${pid1#started pid }
[[ "$line0" == "rank 0 pid $pid0 steps $steps world 3,3,2,2,2 params "* ]] || fail "rank 0: $line0"
[[ "$line1" == "rank 1 pid $pid1 steps $steps world 3,3,2,2,2 params "* ]] || fail "rank 1: $line1"
[ "${line0##* params }" = "${line1##* params }" ] || fail "the survivors' parameters differ"
echo "live recovery with processes passed: $line0"
