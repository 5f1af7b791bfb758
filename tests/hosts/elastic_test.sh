#!/usr/bin/env bash
# Elastic membership on network-namespace hosts (--nnodes MIN:MAX, See Note [Elastic rounds] in
# launcher/rendezvous/rounds.cpp):
#   elastic_test.sh SCENARIO NETNS_CLUSTER DDP_LAUNCH FAULT_WORKER
#   down: 3 hosts (--nnodes 2:3), host2's launcher SIGKILLed mid-training: hosts 0 and 1 go on in
#         round 1 at world size 2, resume from the last checkpoint and exit 0.
#   partition: the same with host2's link down: the workers' collective timeout ends round 0, and
#         hosts 0 and 1 finish at world size 2.
#   up:   one launcher alone below MIN ends with one line naming 1 node and MIN 2; then a 2-host job
#         (--nnodes 2:3) is joined by host2 mid-training: every worker of round 1 sees WORLD_SIZE 3.
# Each worker is fault_worker (tests/faults) behind a wrapper that prints its WORLD_SIZE and
# TORCHELASTIC_RESTART_COUNT. Exits 77 (CTest skip) without namespaces. Every wait is bounded;
# the hosts and every process in them go away on exit.
set -euo pipefail

scenario=$1 cluster=$2 launch=$3 fault_worker=$4
source "$(dirname "${BASH_SOURCE[0]}")/bed.sh"
bed_up "$cluster" el 3 --no-data  # sets name and work; removes both on exit
pids=()

fail() { bed_fail "elastic $scenario" "$@"; }

# The worker: says its world size and round, then trains (checkpoints in $work/ck, resumed).
cat >"$work/worker.sh" <<WORKER
#!/usr/bin/env bash
echo "elastic worker: rank \$RANK world \$WORLD_SIZE round \$TORCHELASTIC_RESTART_COUNT"
exec "$fault_worker" train "\$@"
WORKER
chmod +x "$work/worker.sh"

# start K -- LAUNCHER_ARGS...: host K's launcher in the background (killed after 40 s), output in hostK.log.
start() {
  local k=$1
  shift 2
  "$cluster" exec "$name" "$k" env OMP_NUM_THREADS=1 timeout -s KILL 40 "$launch" --nproc_per_node 1 \
    --monitor_interval 0.05 --shutdown_grace 3 "$@" >"$work/host$k.log" 2>&1 &
  pids[$k]=$!
}

elastic_job() {  # elastic_job K RDZV_ID STEPS: host K in the 2:3 job, fault_worker for STEPS steps
  start "$1" -- --nnodes 2:3 --rdzv_endpoint host0:29400 --rdzv_id "$2" --rdzv_timeout 20 \
    --rdzv_conf last_call_timeout=1 --max_restarts 2 "$work/worker.sh" --steps "$3" --step-ms 40 \
    --timeout-ms 20000 --checkpoint-dir "$work/ck" --checkpoint-every 5 --resume
}

wait_listening() {  # wait_listening K PORT
  local deadline=$((SECONDS + 20))
  until [[ -n $("$cluster" exec "$name" "$1" ss -Hltn "sport = :$2") ]]; do
    ((SECONDS < deadline)) || fail "nothing listened on port $2 on host $1 within 20 s"
    sleep 0.1
  done
}

wait_for() { bed_wait_for "$@"; }  # wait_for SECONDS FILE TEXT

succeeded() {  # succeeded K...: host K's launcher exited 0
  local k status
  for k in "$@"; do
    status=0
    wait "${pids[$k]}" || status=$?
    ((status == 0)) || fail "host $k's launcher exited with $status"
  done
}

expect() {  # expect K TEXT: TEXT in host K's output
  grep -q -F -- "$2" "$work/host$1.log" || fail "host $1 did not print '$2'"
}

case $scenario in
  down)
    for k in 0 1 2; do
      elastic_job $k down 40
      ((k > 0)) || wait_listening 0 29400
    done
    for k in 0 1 2; do wait_for 20 "$work/host$k.log" "world 3 round 0"; done
    wait_for 20 "$work/host0.log" "checkpoint step 10"
    victim=""
    for p in $(ip netns pids "$name-h2"); do
      [[ $(cat "/proc/$p/comm" 2>/dev/null) != ddp_launch ]] || victim=$p
    done
    [[ -n $victim ]] || fail "no ddp_launch in host 2"
    kill -KILL "$victim"
    wait "${pids[2]}" || true
    succeeded 0 1
    for k in 0 1; do
      expect $k "world 2 round 1"
      expect $k "joining round 1"
      expect $k "finished 40 steps"
    done
    grep -q "resumed from step" "$work/host0.log" || fail "round 1 did not resume from a checkpoint"
    ! grep -q "round 2" "$work/host0.log" || fail "a third round ran"
    ;;
  partition)
    # Host 2's link goes down mid-training: nothing closes, so the workers' collective timeout (3 s)
    # ends round 0 on hosts 0 and 1, which form round 1 without host2 (after the last call) and
    # finish at world size 2. Host 2, cut off from the store, is left to its --rdzv_timeout.
    for k in 0 1 2; do
      start $k -- --nnodes 2:3 --rdzv_endpoint host0:29400 --rdzv_id cut --rdzv_timeout 20 \
        --rdzv_conf last_call_timeout=1 --max_restarts 2 "$work/worker.sh" --steps 40 --step-ms 40 \
        --timeout-ms 3000 --checkpoint-dir "$work/ck" --checkpoint-every 5 --resume
      ((k > 0)) || wait_listening 0 29400
    done
    for k in 0 1 2; do wait_for 20 "$work/host$k.log" "world 3 round 0"; done
    wait_for 20 "$work/host0.log" "checkpoint step 10"
    "$cluster" exec "$name" 2 ip link set eth0 down
    succeeded 0 1
    for k in 0 1; do
      expect $k "world 2 round 1"
      expect $k "finished 40 steps"
    done
    ! grep -q "world 3 round 1" "$work/host0.log" || fail "host2 took part in round 1 while cut off"
    ;;
  up)
    # Below MIN: one line naming the nodes that came and MIN, within the timeout (+ a bound).
    started=$SECONDS
    status=0
    "$cluster" exec "$name" 0 timeout -s KILL 20 "$launch" --nnodes 2:3 --rdzv_endpoint host0:29401 \
      --rdzv_id alone --rdzv_timeout 2 /bin/true >"$work/alone.log" 2>&1 || status=$?
    ((status == 1)) || fail "a launcher alone below MIN exited with $status, not 1: $(cat "$work/alone.log")"
    ((SECONDS - started < 12)) || fail "below MIN took $((SECONDS - started)) s with --rdzv_timeout 2"
    grep -q -E "^ddp_launch: error: .*1 node joined within 2 s \(--rdzv_timeout\), fewer than the minimum of 2 \(--nnodes 2:3\)$" \
      "$work/alone.log" || fail "below MIN: $(cat "$work/alone.log")"
    # --max_restarts used up: a 1-node job (--nnodes 1:2 --max_restarts 0) does not admit host1,
    # which ends with one line after its --rdzv_timeout; the job itself finishes (exit 0). The job's
    # worker runs until host1's launcher has ended (bounded: 30 s), so the store it serves is there
    # for host1's whole wait. (It slept 3 s: a CI run under load saw host1 still waiting when host0's
    # launcher ended and closed its store, "Failed to recv", not the refusal.)
    printf '%s\n' '#!/bin/sh' "i=0; while [ ! -e '$work/refused.done' ] && [ \$i -lt 300 ]; do sleep 0.1; i=\$((i+1)); done" \
      >"$work/sleeper.sh"
    chmod +x "$work/sleeper.sh"
    used_up=(--nnodes 1:2 --rdzv_endpoint host0:29402 --rdzv_id used_up --rdzv_conf last_call_timeout=0.5
      --max_restarts 0)
    start 0 -- "${used_up[@]}" --rdzv_timeout 20 "$work/sleeper.sh"
    wait_for 20 "$work/host0.log" "round 0: starting 1 workers (ranks 0..0 of 1)"
    status=0
    "$cluster" exec "$name" 1 timeout -s KILL 20 "$launch" "${used_up[@]}" --rdzv_timeout 2 /bin/true \
      >"$work/refused.log" 2>&1 || status=$?
    touch "$work/refused.done"
    ((status == 1)) || fail "a node the job could not admit exited with $status, not 1: $(cat "$work/refused.log")"
    grep -q -E "^ddp_launch: error: .*the running job did not admit this node into round 1 within 2 s" \
      "$work/refused.log" || fail "not admitted: $(cat "$work/refused.log")"
    succeeded 0
    expect 0 "a node is waiting to join, but --max_restarts is used up: the job goes on with 1 nodes"
    # A 2-host job, joined by host2 mid-training.
    for k in 0 1; do
      elastic_job $k up 80
      ((k > 0)) || wait_listening 0 29400
    done
    for k in 0 1; do wait_for 20 "$work/host$k.log" "world 2 round 0"; done
    wait_for 20 "$work/host0.log" "checkpoint step 10"
    elastic_job 2 up 80
    succeeded 0 1 2
    for k in 0 1 2; do
      expect $k "world 3 round 1"
      expect $k "finished 80 steps"
    done
    # The members that noticed the newcomer themselves said so (the others may hear it first as a stop
    # over the job channel).
    grep -q -F "1 node waits to join the job" "$work/host0.log" "$work/host1.log" ||
      fail "neither host 0 nor host 1 said that a node waits to join"
    grep -q "resumed from step" "$work/host2.log" || fail "host2 did not resume from the job's checkpoint"
    ;;
  *)
    echo "unknown scenario $scenario"
    exit 2
    ;;
esac
echo "elastic $scenario: ok"
