#!/usr/bin/env bash
# ddp_launch --recovery live on 3 network-namespace hosts x 2 workers (world sizes 6, 4, 2), with the checks of issue 22
# that need the whole job (See Note [Live recovery with ddp_launch] in launcher/live_launch.cpp):
#   live_matrix_test.sh NETNS_CLUSTER DDP_LAUNCH LIVE_RECOVERY_DEMO twice|during_recovery
# twice: host 2 SIGKILLed mid-epoch (the survivors re-shard the rest of the epoch at world size 2 and
#   train at least one step), then host 1 SIGKILLed: host 0's two workers go on and finish; the
#   epoch that host 2's loss cut ends at world size 2 with its padding (the data set's size is odd).
# during_recovery: host 2 SIGKILLed; once the survivors have built their new group (the demo's
#   --hold-group-ms holds them there, the test waits for host 1's line), host 1 is SIGKILLed: host 0's
#   recovery fails in that round, is retried in the next, and host 0 finishes alone.
# Each checks: the survivors' workers are the processes that started (PIDs unchanged), their
# launchers exit 0; every applied step was trained by exactly ranks 0..W-1 of its world size W, on the
# batches a reference replay of the same schedule gives; within each epoch no sample is lost or
# trained twice, except PyTorch's end-of-epoch padding, which is checked exactly (checks below,
# independent of the sampler's code); the final parameters equal the reference's (live_recovery_demo
# --reference: one process, the membership schedule the live run logged) within 1e-5 relative (1e-6
# absolute near zero): the all-reduce sums the ranks' gradients in another order than the reference.
# Exits 77 (CTest skip) without namespaces. Every wait is bounded; the hosts and every process in
# them go away on exit (bed.sh).
set -euo pipefail

cluster=$1 launch=$2 demo=$3 scenario=$4
[[ $scenario == twice || $scenario == during_recovery ]] || {
  echo "usage: live_matrix_test.sh NETNS_CLUSTER DDP_LAUNCH LIVE_RECOVERY_DEMO twice|during_recovery" >&2
  exit 2
}
source "$(dirname "${BASH_SOURCE[0]}")/bed.sh"
bed_up "$cluster" lm 3 --no-data  # sets name and work; removes both on exit
pids=()
steps=30 samples=47 batch=2 hold_ms=0
nproc=2 w3=6 w2=4 w1=2  # world sizes with 3, 2 and 1 host(s)
[[ $scenario != during_recovery ]] || hold_ms=3000

fail() { bed_fail "live matrix $scenario" "$@"; }
wait_for() { bed_wait_for "$@"; }  # wait_for SECONDS FILE TEXT

start() {  # start K: host K's launcher in the background (killed after 50 s), output in hostK.log
  local k=$1
  "$cluster" exec "$name" "$k" env OMP_NUM_THREADS=1 timeout -s KILL 50 "$launch" --nproc_per_node $nproc \
    --monitor_interval 0.05 --shutdown_grace 3 --nnodes 3:4 --rdzv_endpoint host0:29400 --rdzv_id live \
    --rdzv_timeout 20 --rdzv_conf last_call_timeout=1 --recovery live --max_restarts 0 \
    "$demo" --steps "$steps" --step-ms 40 --settle-ms 2000 --timeout-ms 3000 --samples "$samples" \
    --batch "$batch" --hold-group-ms "$hold_ms" --log-samples "$work/samples" --params-out "$work/params" >"$work/host$k.log" 2>&1 &
  pids[$k]=$!
}

kill_host() {  # kill_host K: SIGKILL every process of host K (its launcher and its workers)
  local victims
  victims=$(ip netns pids "$name-h$1")
  [[ -n $victims ]] || fail "no process in host $1"
  # shellcheck disable=SC2086  # one pid a word
  kill -KILL $victims
  { wait "${pids[$1]}" || true; } 2>/dev/null  # no "Killed" notice from bash
}

for k in 0 1 2; do
  start $k
  if ((k == 0)); then
    deadline=$((SECONDS + 20))
    until [[ -n $("$cluster" exec "$name" 0 ss -Hltn "sport = :29400") ]]; do
      ((SECONDS < deadline)) || fail "nothing listened on port 29400 on host 0 within 20 s"
      sleep 0.1
    done
  fi
done
for k in 0 1 2; do wait_for 30 "$work/host$k.log" "live demo: step 2 world $w3"; done
kill_host 2
if [[ $scenario == twice ]]; then
  wait_for 30 "$work/host1.log" "world $w2 at_ms"
else
  for rank in 2 3; do wait_for 30 "$work/host1.log" "live demo: recovery group built rank $rank world $w2"; done
fi
kill_host 1
status=0
wait "${pids[0]}" || status=$?
((status == 0)) || fail "host 0's launcher exited with $status"

# Host 0: the workers that started trained to the end, alone at the end, and wrote their parameters.
log=$work/host0.log
(($(grep -c "live demo: started pid" "$log") == nproc)) || fail "host 0's workers were not started exactly once each"
pids0=$(sed -n -E 's/.*live demo: started pid ([0-9]+).*/\1/p' "$log")
for pid in $pids0; do
  grep -q -F "live demo: finished $steps steps pid $pid params " "$log" ||
    fail "host 0: no 'finished $steps steps' by the worker that started as pid $pid"
done
grep -q -F "world $w1 at_ms" "$log" || fail "host 0 never trained alone (world size $w1)"
# Host 1 (twice): the same workers trained on at world size 4 after host 2's loss, before their own.
if [[ $scenario == twice ]]; then
  (($(grep -c "live demo: started pid" "$work/host1.log") == nproc)) || fail "host 1's workers were started more than once"
  for rank in 2 3; do
    grep -q -E "live demo: round [0-9]+ rank $rank world $w2 epoch [0-9]+ offset [0-9]+" "$work/host1.log" ||
      fail "host 1's workers did not regroup as ranks 2 and 3 of world size $w2"
  done
  grep -q -F "world $w2 at_ms" "$work/host1.log" || fail "host 1 never trained at world size $w2"
  grep -q -F "world $w2 at_ms" "$log" || fail "host 0 never trained at world size $w2"
else
  # The recovery's first round (host 0 and host 1) failed and was retried; no step at world size 2.
  grep -q -E "live recovery: round [0-9]+ failed \(attempt 1 of" "$log" ||
    fail "host 0's recovery did not fail in its first round (host 1 killed in it) and retry"
  grep -q -E "live demo: round [0-9]+ rank 0 world $w1 epoch" "$log" || fail "host 0 did not regroup alone"
  ! grep -q -F "world $w2 at_ms" "$log" || fail "host 0 trained at world size $w2: host 1 was killed too late"
fi
# Mid-epoch: the survivors' first new group re-sharded inside epoch 0 or later, not at its start.
read -r epoch offset < <(sed -n -E "s/.*live demo: round [0-9]+ rank 0 world ($w2|$w1) epoch ([0-9]+) offset ([0-9]+).*/\\2 \\3/p" \
  "$log" | head -1)
[[ -n $offset ]] || fail "no regroup line of host 0"
((offset > 0 && offset < samples)) || fail "host 2 was lost at offset $offset of epoch $epoch, not mid-epoch"

# The schedule the live run applied, from rank 0's groups (host 0's first worker, rank 0 of every
# round): a group of world size W "at step S" applied steps S+1, S+2, ... up to the next group's S.
# A step is applied by the ranks whose step agreement completed, possibly not by all (See Note [Live
# recovery]), so the survivors' "step S world W" lines are only checked against it.
sed -n -E 's/.*live demo: round [0-9]+ rank 0 world ([0-9]+) epoch [0-9]+ offset [0-9]+ at step ([0-9]+)$/\1 \2/p' \
  "$log" | awk -v total="$steps" '
  function emit(to) { for (; s < to; s++) print s + 1, w }
  NR > 1 && $2 < s { print "rank 0 regrouped at step " $2 " after step " s; exit 1 }
  NR > 1 { emit($2) }
  { w = $1; s = $2 }
  END { if (NR) emit(total) }' >"$work/worlds" || fail "host 0's rounds: $(cat "$work/worlds")"
(($(wc -l <"$work/worlds") == steps)) || fail "no round line of rank 0 in host0.log"
sed -n -E 's/.*live demo: step ([0-9]+) world ([0-9]+) at_ms.*/\1 \2/p' "$log" | awk -v worlds="$work/worlds" '
  BEGIN { while ((getline line < worlds) > 0) { split(line, a, " "); world[a[1]] = a[2] } }
  world[$1] != $2 { print "step " $1 " was applied at world size " $2 ", not " world[$1]; bad = 1; exit 1 }' \
  >"$work/applied.out" || fail "$(cat "$work/applied.out")"
schedule=$(awk '$2 != w { if (n) out = out (out ? "," : "") w ":" n; w = $2; n = 0 }
  { n++ }
  END { print out (out ? "," : "") w ":" n }' "$work/worlds")

# Every applied step s at world size W: the batch of each rank 0..W-1 (each rank records the batch of
# each step it computes; the records of a step computed at another world size and dropped do not
# count; a step computed again at the same world size has the same batches), the sample check per
# epoch. Writes the records as "s r W: list" for the comparison with the reference.
cat "$work"/samples.* | awk -v n="$samples" -v worlds="$work/worlds" -v out="$work/live.records" '
  function bad(msg) { print msg; failed = 1; exit 1 }
  BEGIN { while ((getline line < worlds) > 0) { split(line, a, " "); world[a[1]] = a[2]; last = a[1] } }
  {
    split($0, t, " ")  # samples step S epoch E rank R world W: LIST
    s = t[3]; e = t[5]; r = t[7]; w = t[9]; sub(":", "", w)
    if (world[s] != w) next
    if (((s, r) in rec) && rec[s, r] != t[10]) bad("step " s " rank " r ": batches " rec[s, r] " and " t[10])
    if ((s in epoch_of) && epoch_of[s] != e) bad("step " s " is in epochs " epoch_of[s] " and " e)
    rec[s, r] = t[10]; epoch_of[s] = e
  }
  END {
    if (failed) exit 1
    for (s = 1; s <= last; s++) {
      w = world[s]
      for (r = 0; r < w; r++) {
        if (!((s, r) in rec)) bad("no samples of rank " r " at step " s " (world size " w ")")
        print s, r, w ": " rec[s, r] > out
      }
    }
    for (s = 1; s <= last; s++) {
      e = epoch_of[s]; w = world[s]
      if (!(e in first)) { first[e] = s; epochs[++ne] = e }
      if (s > 1 && epoch_of[s - 1] == e && world[s - 1] != w) { share_start[e] = done[e]; share_world[e] = w }
      if (!(e in share_world)) { share_start[e] = 0; share_world[e] = w }
      for (r = 0; r < w; r++) {
        k = split(rec[s, r], idx, ",")
        for (j = 1; j <= k; j++) {
          i = idx[j]
          if (i !~ /^[0-9]+$/ || i + 0 >= n) bad("sample " i " at step " s " is not in 0.." n - 1)
          if (count[e, i]++ == 0) distinct[e]++
          done[e]++
        }
      }
    }
    for (q = 1; q <= ne; q++) {
      e = epochs[q]
      if (distinct[e] < n) {  # only the last epoch may be cut off by the end of training: no sample twice
        if (q < ne) bad("epoch " e ": " n - distinct[e] " sample(s) never trained")
        for (i = 0; i < n; i++) if (count[e, i] > 1) bad("epoch " e ": sample " i " trained " count[e, i] " times")
        continue
      }
      # A complete epoch: every sample; the padding of its last share (start S, world size R, m = n - S
      # left: ceil(m / R) * R - m repeats) is the epoch order P[0], P[1], ...: rank k % W0s sample
      # k / W0 of the epoch first step (world size W0), the share that starts at offset 0.
      m = n - share_start[e]; R = share_world[e]
      pad = int((m + R - 1) / R) * R - m
      if (done[e] - n != pad) bad("epoch " e ": " done[e] " samples trained, " n " + padding " pad " expected")
      s = first[e]; w0 = world[s]
      for (k = 0; k < pad; k++) {
        split(rec[s, k % w0], idx, ",")
        padded[e, idx[int(k / w0) + 1]] = 1
      }
      for (i = 0; i < n; i++) {
        want = ((e, i) in padded) ? 2 : 1
        if (count[e, i] != want) bad("epoch " e ": sample " i " trained " count[e, i] + 0 " times, not " want)
      }
      complete++; padding += pad
    }
    if (!complete) bad("no complete epoch: the test trains too few steps")
    if (!padding) bad("no complete epoch ended with padding: the padding check did not run")
    printf "%d complete epoch(s) checked, %d padded sample(s)\n", complete, padding
  }' >"$work/samples.out" || fail "samples: $(cat "$work/samples.out")"

# The reference: one process replays the schedule; its batches and parameters must be the live run's.
"$demo" --reference "$schedule" --samples "$samples" --batch "$batch" --log-samples "$work/reference.samples" \
  --params-out "$work/reference" >"$work/reference.log" 2>&1 || fail "the reference run failed: $(cat "$work/reference.log")"
sed -n -E 's/^samples step ([0-9]+) epoch [0-9]+ rank ([0-9]+) world ([0-9]+): (.*)/\1 \2 \3: \4/p' \
  "$work/reference.samples" >"$work/reference.records"
diff -q "$work/live.records" "$work/reference.records" >/dev/null ||
  fail "the live run's batches differ from the reference's: $(diff "$work/live.records" "$work/reference.records" | head -5)"
same_params() {  # same_params A B: equal within 1e-5 relative (1e-6 absolute)
  paste "$1" "$2" | awk '
    { d = $1 - $2; d = d < 0 ? -d : d; a = $1 < 0 ? -$1 : $1; b = $2 < 0 ? -$2 : $2; m = a > b ? a : b }
    d > 1e-5 * m && d > 1e-6 { bad++ }
    END { exit !(NR > 0 && bad == 0) }'
}
for pid in $pids0; do
  [[ -s $work/params.$pid ]] || fail "host 0's worker $pid wrote no parameters to $work/params.$pid"
  (($(wc -l <"$work/params.$pid") == $(wc -l <"$work/reference"))) ||
    fail "host 0's worker $pid and the reference have different parameter counts"
  same_params "$work/params.$pid" "$work/reference" ||
    fail "host 0's worker $pid's parameters differ from the reference's (schedule $schedule): $(paste "$work/params.$pid" "$work/reference" | head -3)"
done
pid0=${pids0%%[[:space:]]*}
# The comparison can fail: the reference of a schedule one step off differs.
off_by_one=$(awk 'BEGIN { FS = OFS = "," } { split($1, a, ":"); $1 = a[1] ":" a[2] + 1; print }' <<<"$schedule")
"$demo" --reference "$off_by_one" --samples "$samples" --batch "$batch" --params-out "$work/wrong" >/dev/null 2>&1 ||
  fail "the reference run of $off_by_one failed"
! same_params "$work/params.$pid0" "$work/wrong" || fail "the parameters equal a reference of another schedule ($off_by_one)"
echo "live matrix ($scenario): ok (host 0's pids $(echo $pids0) unchanged, schedule $schedule, host 2 lost at epoch $epoch" \
  "offset $offset, $(cat "$work/samples.out"), parameters equal the reference's)"
