#!/usr/bin/env bash
# Chaos on the namespace hosts (issue 36): trials of random faults at random times in an elastic
# ddp_launch job, each drawn from its seed, each checked against the job's policy:
#   chaos_test.sh NETNS_CLUSTER DDP_LAUNCH LIVE_RECOVERY_DEMO SEED...
# One trial per seed, each in a bed of its own (bed.sh); with CHAOS_RESULTS=FILE each trial appends
# one line "seed hosts faults outcome bound_s" to FILE (scripts/chaos.sh counts them).
# A trial: 3 or 4 hosts x 2 workers (live_recovery_demo, 95 samples, 2 a rank and step), with
# `--recovery live` (odd seeds) or restart-based elastic rounds (even seeds: the demo checkpoints
# every 5 steps and each round resumes from the latest checkpoint), then at a random time after
# step 2 one of these faults (RANDOM seeded with the seed picks everything):
#   worker    one worker SIGKILLed (any host): live, its launcher marks it gone and restarts it, a
#             joiner; restart, every launcher restarts its workers in the next round
#   launcher  a launcher SIGKILLed (host 1+): its workers die with it (PR_SET_PDEATHSIG): a host lost
#   host      every process of a host SIGKILLed (host 1+)
#   stop      one worker SIGSTOPped for longer than the group's timeout, then SIGCONT
#   link      a host's link down for 1-6 s, then up again (host 1+)
#   recovery  a host SIGKILLed, then another once the survivors have built their recovery's group
#             (restart: once the next round's workers started)
#   two       two of worker, launcher, host, stop, link at once, on two hosts
#   store     the rendezvous host (host 0, which serves the store) SIGKILLed: the job ends
# Policy checked (every wait bounded):
#   - the store lost: every other launcher exits non-zero within 20 s, naming the rendezvous host
#     (Note [The store's host lost] in launcher/channel/live_watch.cpp; restart: its next round's
#     rendezvous fails);
#   - restart with fewer than MIN (2) hosts left: every launcher left exits non-zero within 40 s,
#     naming the nodes missing for its next round (live jobs go on below MIN);
#   - else host 0's launcher exits 0, and so does every launcher that was not killed (a stopped or
#     cut-off host's workers come back as joiners or end; its launcher ends the job with the rest),
#     all within 120 s; host 0 applies a step within 12 s of each fault (the group's timeout 3 s,
#     the liveness timeout 2 s, the settle timeout 2 s, with slack for a loaded machine; restart:
#     20 s, a new round's rendezvous and process start) unless the training had ended;
#   - the training (live_checks.sh): the schedule, every sample of each epoch once but the
#     padding, the batches and the parameters of every worker that finished equal those of a
#     one-process reference replaying the membership changes the run logged (restart: of the final
#     lineage, each step as the last attempt that computed it did: the steps after a checkpoint that
#     a later round redid are not in the model);
#   - nothing left behind: no process in any host once the launchers have ended, no run folder of a
#     launcher that ended on its own but the one it named for its failed workers' logs (each host's
#     TMPDIR is watched), no namespace after the bed's down.
# Exits 77 (CTest skip) without namespaces.
set -euo pipefail

cluster=$1 launch=$2 demo=$3
shift 3
(($# >= 1)) || { echo "usage: chaos_test.sh NETNS_CLUSTER DDP_LAUNCH LIVE_RECOVERY_DEMO SEED..." >&2; exit 2; }
if (($# > 1)); then
  for seed in "$@"; do
    status=0
    bash "$0" "$cluster" "$launch" "$demo" "$seed" || status=$?
    ((status == 0)) || exit $status
  done
  exit 0
fi
seed=$1
[[ $seed =~ ^[0-9]+$ ]] || { echo "chaos_test.sh: SEED must be a whole number, not '$seed'" >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/bed.sh"
source "$(dirname "${BASH_SOURCE[0]}")/live_checks.sh"
RANDOM=$seed
n=$((3 + RANDOM % 2))
fail() { bed_fail "chaos seed $seed, $kind, $mode" "$@"; }
wait_for() { bed_wait_for "$@"; }

kinds=(worker launcher host stop link recovery two store)
kind=${kinds[RANDOM % ${#kinds[@]}]}
kind=${CHAOS_KIND:-$kind}  # a trial of one kind, to try it alone
mode=$( ((seed % 2)) && echo live || echo restart)
mode=${CHAOS_MODE:-$mode}
[[ $mode == live || $mode == restart ]] || { echo "chaos_test.sh: CHAOS_MODE is live or restart, not '$mode'" >&2; exit 2; }
bed_up "$cluster" ch "$n" --no-data  # sets name and work; removes both on exit
steps=200 samples=95 batch=2 nproc=2 timeout_s=3 hold_ms=0
[[ $kind != recovery ]] || hold_ms=1000
pids=() killed=() faults=() fault_ms=()
progress_bound_ms=12000 mode_args=(--recovery live --max_restarts 3) demo_args=()
if [[ $mode == restart ]]; then
  progress_bound_ms=20000 mode_args=(--max_restarts 5)
  demo_args=(--checkpoint-dir "$work/ck" --checkpoint-every 5)
fi

start() {  # start K: host K's launcher in the background (killed after 120 s), output in hostK.log
  local k=$1
  mkdir -p "$work/tmp$k"
  "$cluster" exec "$name" "$k" env OMP_NUM_THREADS=1 TMPDIR="$work/tmp$k" timeout -s KILL 120 "$launch" \
    --nproc_per_node $nproc --monitor_interval 0.05 --shutdown_grace 3 --nnodes "2:$n" \
    --rdzv_endpoint host0:29400 --rdzv_id chaos --rdzv_timeout 20 \
    --rdzv_conf last_call_timeout=1,keep_alive_interval=0.5,keep_alive_max_attempt=4 "${mode_args[@]}" \
    "$demo" --steps "$steps" --step-ms 40 --settle-ms 2000 --timeout-ms $((timeout_s * 1000)) \
    --samples "$samples" --batch "$batch" --hold-group-ms "$hold_ms" --log-samples "$work/raw/samples" \
    --params-out "$work/params" "${demo_args[@]}" >"$work/host$k.log" 2>&1 &
  pids[$k]=$!
}

alive_in() {  # alive_in K [COMM]: the live (not zombie) processes of host K, of command COMM if given
  local p
  for p in $(ip netns pids "$name-h$1"); do
    [[ $(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) != Z && -r /proc/$p/comm ]] || continue
    [[ -z ${2:-} || $(cat "/proc/$p/comm" 2>/dev/null) == "$2"* ]] && echo "$p"
  done
  return 0
}

note_fault() { faults+=("$1"); fault_ms+=("$(date +%s%3N)"); }

# The faults. Each runs in the foreground but stop and link, whose second half is backgrounded.
victim_of() {  # victim_of KIND K: the process a worker, stop or launcher fault on host K hits
  case $1 in
    worker | stop) alive_in "$2" live_recovery_d | shuf -n 1 --random-source=<(yes "$seed") ;;
    launcher) alive_in "$2" ddp_launch ;;
  esac
}

inject() {  # inject KIND K [VICTIM]: VICTIM chosen beforehand (two faults at once), else now
  local kind=$1 k=$2 victims=${3:-}
  [[ -n $victims ]] || victims=$(victim_of "$kind" "$k")
  case $kind in
    worker)
      [[ -n $victims ]] || { faults+=("worker@$k:none"); return; }
      note_fault "worker@$k"
      kill -KILL "$victims" 2>/dev/null || true ;;
    launcher)
      [[ -n $victims ]] || { faults+=("launcher@$k:none"); return; }
      note_fault "launcher@$k"; killed[$k]=1
      # shellcheck disable=SC2086
      kill -KILL $victims 2>/dev/null || true ;;
    host)
      note_fault "host@$k"; killed[$k]=1
      # shellcheck disable=SC2086
      kill -KILL $(ip netns pids "$name-h$k") 2>/dev/null || true ;;
    stop)
      [[ -n $victims ]] || { faults+=("stop@$k:none"); return; }
      local hold=$((timeout_s + 1 + RANDOM % 3))
      note_fault "stop${hold}s@$k"
      kill -STOP "$victims" 2>/dev/null || true
      (sleep "$hold"; kill -CONT "$victims" 2>/dev/null || true) & ;;
    link)
      local down=$((1 + RANDOM % 6))
      note_fault "link${down}s@$k"
      "$cluster" exec "$name" "$k" ip link set eth0 down
      (sleep "$down"; "$cluster" exec "$name" "$k" ip link set eth0 up) & ;;
  esac
}

mkdir -p "$work/raw"
live_start_hosts start $(seq 0 $((n - 1)))
for ((k = 0; k < n; ++k)); do wait_for 40 "$work/host$k.log" "live demo: step 2 world $((n * nproc))"; done
sleep "$((RANDOM % 3)).$((RANDOM % 10))"
others=$(seq 1 $((n - 1)) | shuf --random-source=<(yes "$seed") | paste -s -d " " -)
read -r a b _ <<<"$others"
case $kind in
  worker) inject worker $((RANDOM % n)) ;;
  stop) inject stop $((RANDOM % n)) ;;
  launcher | host | link) inject "$kind" "$a" ;;
  recovery)
    mark="live demo: recovery group built"
    [[ $mode == live ]] || mark="live demo: started pid"  # a new round's workers
    before=$(cat "$work"/host*.log | grep -c "$mark" || true)
    inject host "$a"
    deadline=$((SECONDS + 20))
    until (($(cat "$work"/host*.log | grep -c "$mark" || true) > before)); do
      ((SECONDS < deadline)) || fail "no recovery group was built within 20 s of host $a's loss"
      sleep 0.02
    done
    sleep "0.$((RANDOM % 8))"
    inject host "$b" ;;
  two)
    pair=(worker launcher host stop link)
    first=${pair[RANDOM % 5]} second=${pair[RANDOM % 5]}
    # Both victims first (the first fault may end the second's victim: restart rounds stop every
    # worker), then both faults: a kill is instant, stop and link go on in the background.
    v1=$(victim_of "$first" "$a") v2=$(victim_of "$second" "$b")
    inject "$first" "$a" "$v1"
    inject "$second" "$b" "$v2" ;;
  store) inject host 0 ;;
esac

# Every launcher ends within its bound; host 0 and every launcher not killed exit 0 unless the store was lost.
codes=()
for ((k = 0; k < n; ++k)); do
  status=0
  wait "${pids[$k]}" 2>/dev/null || status=$?
  codes[$k]=$status
done
wait  # the CONT and link-up subshells
ended_ms=$(date +%s%3N)
bound_s=$(((ended_ms - ${fault_ms[0]:-$ended_ms}) / 1000))
for ((k = 0; k < n; ++k)); do
  ((codes[k] != 137)) || [[ -n ${killed[$k]:-} || $kind == store ]] ||
    fail "host $k's launcher was SIGKILLed by its 120 s timeout (it did not end)"
done
survivors=$((n - ${#killed[@]}))
if [[ $kind == store ]]; then
  why="the rendezvous host host0:29400 is lost"
  [[ $mode == live ]] || why="rendezvous 'chaos' at host0:29400 failed: "  # the next round's rendezvous
  for ((k = 1; k < n; ++k)); do
    ((codes[k] != 0)) || fail "host $k's launcher exited 0 although the rendezvous host was lost"
    grep -q -F "$why" "$work/host$k.log" || fail "host $k's launcher exited ${codes[k]} without naming the lost rendezvous host"
  done
  ((bound_s <= 20)) || fail "the job took $bound_s s to end after the rendezvous host was lost (bound 20 s)"
  outcome="failed-as-expected"
elif [[ $mode == restart ]] && ((survivors < 2)); then
  # Restart-based rounds need --nnodes MIN (2) hosts: the last one's next round fails after --rdzv_timeout.
  for ((k = 0; k < n; ++k)); do
    [[ -z ${killed[$k]:-} ]] || continue
    ((codes[k] != 0)) || fail "host $k's launcher exited 0 although only $survivors host(s) of MIN 2 remained"
    grep -q -F "fewer than the minimum of 2 (--nnodes 2:$n)" "$work/host$k.log" ||
      fail "host $k's launcher exited ${codes[k]} without naming the missing nodes"
  done
  ((bound_s <= 40)) || fail "the job took $bound_s s to end below MIN (bound: --rdzv_timeout 20 s + 20 s)"
  outcome="failed-as-expected"
else
  for ((k = 0; k < n; ++k)); do
    [[ -n ${killed[$k]:-} ]] || ((codes[k] == 0)) || fail "host $k's launcher exited ${codes[k]} (faults: ${faults[*]})"
  done
  # Progress after each fault: a step on host 0 within the bound, unless the training had ended.
  sed -n -E 's/.*live demo: step [0-9]+ world [0-9]+ at_ms ([0-9]+).*/\1/p' "$work/host0.log" | sort -n >"$work/step_ms"
  last_ms=$(tail -1 "$work/step_ms")
  for t in "${fault_ms[@]}"; do
    ((t < last_ms)) || continue
    next=$(awk -v t="$t" '$1 > t { print $1 - t; exit }' "$work/step_ms")
    ((next <= progress_bound_ms)) || fail "host 0 applied no step within $((progress_bound_ms / 1000)) s of a fault at $t (next after $next ms)"
  done
  finished=$(cat "$work"/host*.log | sed -n -E "s/.*live demo: finished $steps steps pid ([0-9]+) params .*/\\1/p" | paste -s -d " " -)
  [[ -n $finished ]] || fail "no worker finished $steps steps"
  log=$work/host0.log
  if [[ $mode == live ]]; then
    cp "$work"/raw/samples.* "$work/"
  else
    # The final lineage: step S is the last round's that started before it (round R resumed at step
    # C_R: the rounds' C never decrease, each resuming from the latest checkpoint); the records and
    # step lines of the other attempts that computed S are of a branch a restart threw away.
    cat "$work"/host[0-9]*.log | sed -n -E 's/.*live demo: round ([0-9]+) rank 0 world [0-9]+ epoch [0-9]+ offset [0-9]+ at step ([0-9]+)$/\1 \2/p' |
      sort -n >"$work/rounds"
    lineage() {  # lineage STEP_FIELD_FROM_END: the lines (ending in their attempt) whose attempt is the step's round - 1
      awk -v back="$1" -v rounds="$work/rounds" '
        BEGIN { while ((getline line < rounds) > 0) { split(line, a, " "); n++; r[n] = a[1]; c[n] = a[2] } }
        { s = $(NF - back); best = -1; for (i = 1; i <= n; i++) if (c[i] < s) best = r[i]; if ($NF + 1 == best) print }'
    }
    for f in "$work"/raw/samples.*; do  # samples.<attempt>.<pid>: "samples step S epoch E rank R world W: LIST"
      attempt=${f#"$work"/raw/samples.}
      attempt=${attempt%%.*}
      # "samples step S epoch E rank R world W: LIST A": S is 8 fields before the attempt.
      sed "s/\$/ $attempt/" "$f" | lineage 8 | sed -E 's/ [0-9]+$//' >"$work/samples.$(basename "$f")"
    done
    # "... step S world W at_ms T attempt A": S is 6 fields before A.
    grep -E "live demo: step [0-9]+ world [0-9]+ at_ms [0-9]+ attempt [0-9]+$" "$work/host0.log" | lineage 6 >"$work/lineage.log" || true
    log=$work/lineage.log
  fi
  # shellcheck disable=SC2086
  live_check_training "$log" "$steps" "$samples" "$batch" "$demo" $finished
  # The store never went away here: no launcher may say it did (one link down may, for its own host).
  if [[ " ${faults[*]}" != *" link"* ]] && grep -h "the rendezvous store did not answer" "$work"/host*.log; then
    fail "a launcher said the rendezvous store did not answer (above), but the store's host was never lost or cut off"
  fi
  outcome="survived"
fi

# Nothing left behind.
for ((k = 0; k < n; ++k)); do
  deadline=$((SECONDS + 10))
  until [[ -z $(alive_in "$k") ]]; do
    ((SECONDS < deadline)) || fail "host $k still has processes 10 s after its launcher ended: $(alive_in "$k" | paste -s -d ' ' -)"
    sleep 0.1
  done
  [[ -n ${killed[$k]:-} || ($kind == store && $k == 0) ]] && continue
  # A launcher whose workers failed keeps their logs and names the folder; nothing else stays.
  kept=$(sed -n -E 's/.*\[ddp_launch\] \[info\] worker logs are in (.*)$/\1/p' "$work/host$k.log" | tail -1)
  left=$(find "$work/tmp$k" -mindepth 1 -maxdepth 1 ! -path "${kept:-/none}" | head -3)
  [[ -z $left ]] || fail "host $k's launcher left files in its TMPDIR: $left"
done
[[ -z ${CHAOS_KEEP:-} ]] || { mkdir -p "$CHAOS_KEEP" && cp -r "$work" "$CHAOS_KEEP/"; }  # to read a passed trial's logs
"$cluster" down "$name"
[[ -z $(ip netns list | grep -E "^$name-" || true) ]] || fail "namespaces of $name left after down"
echo "chaos seed $seed: $mode, $n hosts, $kind: ${faults[*]:-none}, $outcome, ended ${bound_s} s after the fault, exit codes ${codes[*]}${live_schedule:+, schedule $live_schedule}"
[[ -z ${CHAOS_RESULTS:-} ]] || echo "$seed $n $kind $(IFS=,; echo "${faults[*]:-none}") $outcome $bound_s $mode" >>"$CHAOS_RESULTS"
