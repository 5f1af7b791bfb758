#!/usr/bin/env bash
# ddp_launch --recovery live on network-namespace hosts (See Note [Live recovery with ddp_launch] in
# launcher/agent/live_recovery.cpp):
#   live_test.sh NETNS_CLUSTER DDP_LAUNCH LIVE_RECOVERY_DEMO [down|partition]
# partition: 3 hosts, host2's link goes down at step 10: nothing closes, the survivors' collectives
# time out (--timeout-ms 2000), they regroup without host2 after the settle timeout, finish at world
# size 2 in the processes that started, with equal parameters, and exit 0. down (the default):
# 3 hosts x 1 worker (--nnodes 2:4 --recovery live), host2's launcher and worker SIGKILLed mid-training:
# the survivors' workers are the processes that started (their PIDs are recorded), go on at world
# size 2, both launchers exit 0, and the final parameters are equal. Then a 4th host started later
# joins the running job (its worker a joiner: it receives the state from a survivor), the job goes
# on at world size 3, and its final parameters equal the others'. Then host 1's worker alone is
# SIGKILLed: its launcher restarts it (a joiner, healed from a survivor), host 0's and host 3's
# workers keep their processes, and all three end with equal parameters. Both scenarios then check the
# training itself (live_checks.sh): no sample of an epoch lost or trained twice, and the parameters of
# the survivors (and of the joiners) equal those of a reference replay of the logged schedule.
# Prints the recovery figure: the
# time from the kill to the next completed step on the survivors, and the steps lost.
# Exits 77 (CTest skip) without namespaces. Every wait is bounded; the hosts and every process in
# them go away on exit.
set -euo pipefail

cluster=$1 launch=$2 demo=$3 scenario=${4:-down}
source "$(dirname "${BASH_SOURCE[0]}")/bed.sh"
source "$(dirname "${BASH_SOURCE[0]}")/live_checks.sh"
bed_up "$cluster" lv 4 --no-data  # sets name and work; removes both on exit
pids=()
steps=${LIVE_TEST_STEPS:-260}
timeout_ms=10000
[[ $scenario != partition ]] || { steps=80; timeout_ms=2000; }

fail() { bed_fail "live recovery" "$@"; }

start() {  # start K: host K's launcher in the background (killed after 40 s), output in hostK.log
  local k=$1
  "$cluster" exec "$name" "$k" env OMP_NUM_THREADS=1 timeout -s KILL 40 "$launch" --nproc_per_node 1 \
    --monitor_interval 0.05 --shutdown_grace 3 --nnodes 2:4 --rdzv_endpoint host0:29400 --rdzv_id live \
    --rdzv_timeout 20 --rdzv_conf last_call_timeout=1 --recovery live --max_restarts 1 \
    "$demo" --steps "$steps" --step-ms 40 --settle-ms 2000 --timeout-ms "$timeout_ms" --samples 47 --batch 2 \
    --log-samples "$work/samples" --params-out "$work/params" >"$work/host$k.log" 2>&1 &
  pids[$k]=$!
}

wait_for() { bed_wait_for "$@"; }  # wait_for SECONDS FILE TEXT

# A usage error first: live needs the elastic c10d rendezvous (exit 2, one line).
status=0
"$launch" --recovery live --nproc_per_node 1 /bin/true >"$work/usage.log" 2>&1 || status=$?
((status == 2)) || fail "--recovery live without --nnodes MIN:MAX exited with $status, not 2: $(cat "$work/usage.log")"
grep -q -F -- "--recovery live needs elastic membership" "$work/usage.log" || fail "usage: $(cat "$work/usage.log")"

live_start_hosts start 0 1 2
for k in 0 1 2; do wait_for 30 "$work/host$k.log" "live demo: step 10 world 3"; done
if [[ $scenario == partition ]]; then
  "$cluster" exec "$name" 2 ip link set eth0 down
  for k in 0 1; do
    status=0
    wait "${pids[$k]}" || status=$?
    ((status == 0)) || fail "host $k's launcher exited with $status"
  done
  sums=() survivors=()
  for k in 0 1; do
    log=$work/host$k.log
    (($(grep -c "live demo: started pid" "$log") == 1)) || fail "host $k's worker was started more than once"
    started=$(sed -n -E 's/.*live demo: started pid ([0-9]+).*/\1/p' "$log")
    finished=$(grep -F "live demo: finished $steps steps pid $started params " "$log") ||
      fail "host $k: no 'finished $steps steps' by the worker that started (pid $started)"
    sums[$k]=${finished##* params }
    survivors+=("$started")
    grep -q -F "world 2 at_ms" "$log" || fail "host $k never trained at world size 2"
  done
  [[ ${sums[0]} == "${sums[1]}" ]] || fail "the survivors' parameters differ: ${sums[0]} vs ${sums[1]}"
  live_check_training "$work/host0.log" "$steps" 47 2 "$demo" "${survivors[@]}"
  echo "live recovery (partition): ok (survivors' pids unchanged, params ${sums[0]}, schedule $live_schedule," \
    "$live_samples_checked, parameters equal the reference's)"
  exit 0
fi
victims=$(ip netns pids "$name-h2")
[[ -n $victims ]] || fail "no process in host 2"
killed_ms=$(date +%s%3N)
# shellcheck disable=SC2086  # one pid a word
kill -KILL $victims
wait "${pids[2]}" || true
wait_for 30 "$work/host0.log" "world 2 at_ms"
start 3
# Once the 4th host trains, host 1's worker alone dies: its launcher restarts it, as a joiner.
wait_for 30 "$work/host3.log" "world 3 at_ms"
first_pid1=$(sed -n -E 's/.*live demo: started pid ([0-9]+).*/\1/p' "$work/host1.log")
worker_killed_ms=$(date +%s%3N)
kill -KILL "$first_pid1"
for k in 0 1 3; do
  status=0
  wait "${pids[$k]}" || status=$?
  ((status == 0)) || fail "host $k's launcher exited with $status"
done

sums=()
log=$work/host0.log
(($(grep -c "live demo: started pid" "$log") == 1)) || fail "host 0's worker was started more than once"
started=$(sed -n -E 's/.*live demo: started pid ([0-9]+).*/\1/p' "$log")
finished=$(grep -F "live demo: finished $steps steps pid $started params " "$log") ||
  fail "host 0: no 'finished $steps steps' by the worker that started (pid $started)"
sums[0]=${finished##* params }
grep -q -F "world 2 at_ms" "$log" || fail "host 0 never trained at world size 2"
# Host 1: the same worker through the host loss, then a second one (a joiner) after its death.
log=$work/host1.log
(($(grep -c "live demo: started pid" "$log") == 2)) || fail "host 1's worker was not restarted exactly once"
grep -q -E "live demo: started pid $first_pid1 member node[0-9]/local0/attempt0\$" "$log" ||
  fail "host 1's first worker (pid $first_pid1) was not the one that started"
grep -q -F "world 2 at_ms" <(sed -n "/started pid $first_pid1/,/started pid/p" "$log") ||
  fail "host 1's first worker did not go on at world size 2 after the host loss"
second=$(grep -E "live demo: started pid [0-9]+ .*attempt1 \(joining\)" "$log") ||
  fail "host 1's restarted worker did not start as a joiner"
second=${second##*started pid }
second=${second%% *}
grep -q -E "marked node[0-9]/local0 gone in the training's membership" "$log" ||
  fail "host 1's launcher did not mark its dead worker gone before restarting it"
finished=$(grep -F "live demo: finished $steps steps pid $second params " "$log") ||
  fail "host 1: no 'finished $steps steps' by the restarted worker (pid $second)"
sums[1]=${finished##* params }
for k in 0 1; do
  ! grep -q -F "round 1: starting" "$work/host$k.log" || fail "host $k's launcher started a second round"
done
[[ ${sums[0]} == "${sums[1]}" ]] || fail "host 0's and host 1's parameters differ: ${sums[0]} vs ${sums[1]}"
# The 4th host: one worker, a joiner, trained at world size 3 with the survivors, the same parameters.
log=$work/host3.log
grep -q -E "live demo: started pid [0-9]+ .*\(joining\)" "$log" || fail "host 3's worker did not start as a joiner"
grep -q -F "joining the running job" "$log" || fail "host 3's launcher did not join the running job"
grep -q -E "live demo: finished $steps steps pid [0-9]+ params ${sums[0]}\$" "$log" ||
  fail "host 3 did not finish $steps steps with the survivors' parameters ${sums[0]}"
grep -q -F "world 3 at_ms" "$log" || fail "host 3 never trained at world size 3"
(($(grep -c "live demo: started pid" "$log") == 1)) || fail "host 3's worker was started more than once"
pid3=$(sed -n -E 's/.*live demo: started pid ([0-9]+).*/\1/p' "$log")
# The training: every sample of each epoch once, the parameters of the three final workers (host 0's,
# host 1's restarted one, host 3's joiner) equal the reference's.
live_check_training "$work/host0.log" "$steps" 47 2 "$demo" "$started" "$second" "$pid3"

# The figure: the kill, the survivors' last step at world size 3 and first at world size 2.
log=$work/host0.log
step3=$(sed -n -E '/ world 2 at_ms/q; s/.*live demo: step ([0-9]+) world 3 at_ms.*/\1/p' "$log" | tail -1)
read -r step2 at2 < <(sed -n -E 's/.*live demo: step ([0-9]+) world 2 at_ms ([0-9]+).*/\1 \2/p' "$log" | head -1)
[[ -n $step3 && -n $step2 && -n $at2 ]] || fail "no step at world 3 or at world 2 in host0.log"
# Steps are counted when applied on every rank: the first at world 2 follows the last at world 3, the
# step in flight at the loss was dropped and run again (no applied step lost).
((step2 == step3 + 1)) || fail "the first step at world 2 is $step2, not $((step3 + 1)) after $step3 at world 3"
echo "live recovery figure: $((at2 - killed_ms)) ms from the host loss to the next completed step on the" \
  "survivors; last step at world 3: $step3, first at world 2: $step2 (the step in flight dropped, no applied step lost)"
after=$(awk -v t="$worker_killed_ms" '/live demo: step [0-9]+ world 2 at_ms/ && $NF > t { print $NF; exit }' "$work/host0.log")
[[ -z $after ]] ||
  echo "live recovery figure: $((after - worker_killed_ms)) ms from host 1's worker SIGKILLed (its launcher marks it gone) to host 0's next completed step"
echo "live recovery: ok (survivors' pids unchanged, a 4th host joined, a dead worker restarted as a joiner, params ${sums[0]}" \
  "everywhere, schedule $live_schedule, $live_samples_checked, parameters equal the reference's)"
