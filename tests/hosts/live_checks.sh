# Sourced by the live recovery tests (live_matrix_test.sh, live_test.sh, live_hosts_test.sh) after bed.sh: the checks of
# a live_recovery_demo run started with --samples N --batch B --log-samples "$work/samples"
# --params-out "$work/params" (See Note [Live demo data] in examples/live_recovery_demo.cpp).
#   live_check_training LOG STEPS N B DEMO PID...
# LOG: a survivor's log from start to end (its applied steps); PID...: the workers whose parameters
# must equal the reference's. Checks, failing through the caller's `fail`:
#   - the schedule (rank 0's "round R ... world W ... at step S" lines, from every $work/hostK.log)
#     agrees with LOG's applied steps;
#   - every applied step has one batch record of each of its ranks (records of a step computed at
#     another world size and dropped do not count);
#   - per epoch every sample is trained exactly once, except the padding of the epoch's last share,
#     computed here from the records (not by the sampler's code): ceil(m / R) * R - m repeats of the
#     epoch order's first samples; only the last epoch may be cut off; at least one padded sample;
#   - the batches and the parameters equal those of DEMO --reference SCHEDULE (one process), the
#     parameters within 1e-5 of their scale (same_params); and a reference one step off does not
#     match (the comparison can fail).
# Sets live_schedule (WORLD:STEPS runs) and live_samples_checked (a summary).
#   live_start_hosts START K...   runs `START K` for each host K, the first one's launcher (it serves the
#                                 rendezvous store on port 29400) listening before the others start
live_check_training() {
  local log=$1 steps=$2 samples=$3 batch=$4 demo=$5 schedule pid off_by_one
  shift 5
  # The schedule the live run applied, from rank 0's groups: a group of world size W "at step S"
  # applied steps S+1, S+2, ... up to the next group's S. Rank 0 of a round may be any host's worker:
  # node ranks follow the order in which the launchers claimed their rendezvous slots, not the host
  # numbers (under load host 1 may claim first), and when rank 0's host is lost a survivor becomes
  # rank 0. So the round lines come from every host's log, in the order of their (job-wide) round
  # numbers. A step is applied by the ranks whose step agreement completed, possibly not by all (See
  # Note [Live recovery]), so the survivors' "step S world W" lines are only checked against it.
  cat "$work"/host[0-9]*.log |
    sed -n -E 's/.*live demo: round ([0-9]+) rank 0 world ([0-9]+) epoch [0-9]+ offset [0-9]+ at step ([0-9]+)$/\1 \2 \3/p' |
    sort -n -k 1,1 | awk -v total="$steps" '
    function emit(to) { for (; s < to; s++) print s + 1, w }
    NR > 1 && $1 == r { print "two rank 0 lines of round " r; exit 1 }
    NR > 1 && $3 < s { print "rank 0 regrouped at step " $3 " after step " s; exit 1 }
    NR > 1 { emit($3) }
    { r = $1; w = $2; s = $3 }
    END { if (NR) emit(total) }' >"$work/worlds" || fail "rank 0's rounds: $(cat "$work/worlds")"
  (($(wc -l <"$work/worlds") == steps)) || fail "no round line of rank 0 in $work/host*.log"
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
  for pid in "$@"; do
    [[ -s $work/params.$pid ]] || fail "worker $pid wrote no parameters to $work/params.$pid"
    (($(wc -l <"$work/params.$pid") == $(wc -l <"$work/reference"))) ||
      fail "worker $pid and the reference have different parameter counts"
    same_params "$work/params.$pid" "$work/reference" ||
      fail "worker $pid's parameters differ from the reference's (schedule $schedule): $(worst_params "$work/params.$pid" "$work/reference")"
  done
  # The comparison can fail: the reference of a schedule one step off differs.
  off_by_one=$(awk 'BEGIN { FS = OFS = "," } { split($1, a, ":"); $1 = a[1] ":" a[2] + 1; print }' <<<"$schedule")
  "$demo" --reference "$off_by_one" --samples "$samples" --batch "$batch" --params-out "$work/wrong" >/dev/null 2>&1 ||
    fail "the reference run of $off_by_one failed"
  ! same_params "$work/params.$1" "$work/wrong" || fail "the parameters equal a reference of another schedule ($off_by_one)"
  live_schedule=$schedule
  live_samples_checked=$(cat "$work/samples.out")
}

# same_params A B: every value of A within 1e-5 x (the largest |value| of B) of B's. Why not per value:
# the live run's all-reduce sums the ranks' gradients in another order than the reference does, and
# after 260 steps of momentum SGD the rounding has grown to ~6e-7 absolute on values of every size (a
# reference that only sums its ranks in reverse order: 5.96e-7 and 6.00e-7 at most, on parameters up to
# 1.4, schedules 3:10,2:16,3:1,2:3,3:230 and 3:10,2:21,3:1,2:4,3:224), which is 1e-4 relative on the
# small ones; the bound is ~1.4e-5 there. A reference one step off is 7e-3 to 0.28 away.
same_params() {
  paste "$1" "$2" | awk '
    { d = $1 - $2; diff[NR] = d < 0 ? -d : d; b = $2 < 0 ? -$2 : $2; if (b > scale) scale = b }
    END { if (NR == 0 || scale == 0) exit 1; for (i = 1; i <= NR; i++) if (diff[i] > 1e-5 * scale) exit 1 }'
}

worst_params() {  # worst_params A B: the 3 lines ("line N: a b") that differ most
  paste "$1" "$2" | awk '{ d = $1 - $2; printf "%.9g line %d: %s %s\n", d < 0 ? -d : d, NR, $1, $2 }' |
    sort -g -r | head -3 | cut -d " " -f 2- | paste -s -d ";" -
}

live_start_hosts() {
  local start=$1 k deadline
  shift
  for k in "$@"; do
    "$start" "$k"
    [[ $k == "$1" ]] || continue
    deadline=$((SECONDS + 20))
    until [[ -n $("$cluster" exec "$name" "$k" ss -Hltn "sport = :29400") ]]; do
      ((SECONDS < deadline)) || fail "nothing listened on port 29400 on host $k within 20 s"
      sleep 0.1
    done
  done
}
