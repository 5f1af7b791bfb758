#!/usr/bin/env bash
# Cross-host figures on the network-namespace test bed (docs/hosts.md, scripts/netns-cluster.sh):
#   scripts/bench-hosts.sh [RUNS [FIGURES]]   (root or CAP_NET_ADMIN; default 3 runs of each figure;
#   FIGURES a comma list of first_step, host_loss, host_down, restart, elastic, live, recovery: default
#   the first four; recovery = elastic's host loss alone (no arrival), live and spares;
#   BENCH_TOOLS="ddp" or "torch" times one side only, "ddp,torch" or "ddp torch" both)
# Issue 22's side by side, one command (elastic's host loss for both tools and live, each with the
# steps it trains again, medians and the ratios; See "Live recovery, side by side" in docs/faults.md):
#   BENCH_TOOLS=ddp,torch scripts/bench-hosts.sh 3 recovery
# 1. start to the end of the first step of a 3-host job (1 worker per host, one step, then a barrier:
#    the moment rank 0 prints "finished 1 steps"), with static rendezvous (--master_addr host0) and
#    c10d rendezvous (--rdzv_endpoint host0:29400);
# 2. from host 1's launcher SIGKILLed mid-training (3 hosts x 2 workers) to every process of the job
#    gone (launchers and workers of all hosts: nothing left in the hosts' namespaces but zombies);
# 3. the same from host 1 losing every process at once (its launcher and its workers SIGKILLed
#    together: the host's power lost), which is what a torchrun job sees of a lost host, since
#    torchrun's workers outlive its agent;
# 4. restart: a coordinated restart (--max_restarts 3, 3 hosts x 1 worker, c10d and static
#    rendezvous): from rank 2 exiting 3 before step 150 (the time it wrote, CLOCK_MONOTONIC) to rank 0
#    having trained its first step of attempt 1 (the time it printed): stop, re-rendezvous, start,
#    connect, a step;
# 5. elastic (--nnodes 2:3, c10d rendezvous, --rdzv_conf last_call_timeout=1 for both tools, 1 worker
#    per host): a third host's launcher started into a running 2-host job, to rank 0's
#    first step at world size 3; then every process of host 1 SIGKILLed at once (the host lost), to
#    rank 0's first step on the 2 survivors (times: CLOCK_MONOTONIC, as the workers print them);
#    the workers checkpoint every BENCH_CHECKPOINT_EVERY steps (default 50) and resume from the
#    latest: "steps lost" is host 0's last step before the restart minus the step it resumed from
#    (the applied steps trained again). BENCH_TORCH_RDZV_CONF (e.g. keep_alive_interval=1) is added
#    to torchrun's --rdzv_conf;
# 6. live (ddp_launch only: --nnodes 2:3 --recovery live, build/bin/live_recovery_demo, 1 worker per
#    host): every process of host 1 SIGKILLed at once, to rank 0's next completed step on the 2
#    survivors (their processes kept; the membership's settle timeout, BENCH_LIVE_SETTLE_MS, default
#    2000, is the bound only when no launcher marks a host gone: the launchers' liveness channel marks a
#    killed host at once, a silent one after --rdzv_conf keep_alive_interval x keep_alive_max_attempt,
#    1 s x 5; See Note [Lost hosts in a live job]; BENCH_LIVE_TIMEOUT_MS, default 10000,
#    each collective's bound, that of a silent host). "steps lost": the last step at world size 3
#    plus one minus the first at world size 2 (0: only the step in flight dropped and run again).
#    See Note [Live recovery with ddp_launch];
# 7. spares (ddp_launch only: live as in 6, with --spares 1: a spare per host, See Note [Hot spares]
#    in ddp/elastic/membership.h): host 1 (its worker and its spare) SIGKILLed, to rank 0's next
#    completed step at world size 3 (a spare took host 1's place); "steps lost": host 0's last step
#    before the recovery's round plus one minus the first after it;
# each for ddp_launch + C++ DDP (build/bin/fault_worker, the fault tests' worker) and, when
# .venv/bin/torchrun exists, for torchrun + Python DDP on the same job
# (benchmarks/hosts_ddp_reference.py, with GLOO_SOCKET_IFNAME=eth0, which PyTorch needs there). Every wait is bounded (a host loss is given 60 s); the bed
# and every process in it are removed on exit. Prints one line per run and a summary per figure.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

runs=${1:-3}
figures=${2:-first_step,host_loss,host_down,restart}
figures_asked=$figures
# recovery: issue 22's side by side, elastic's host loss (elastic_loss: without the arrival) and live.
[[ ,$figures, != *,recovery,* ]] || figures+=,elastic_loss,live,spares
cluster=$DDP_ROOT/scripts/netns-cluster.sh
bin=$DDP_BUILD_DIR/bin
torchrun=$DDP_ROOT/.venv/bin/torchrun
reference=$DDP_ROOT/benchmarks/hosts_ddp_reference.py
reason=$("$cluster" check) || {
  echo "bench-hosts.sh: $reason" >&2
  exit 2
}
for b in ddp_launch fault_worker; do
  [[ -x $bin/$b ]] || {
    echo "bench-hosts.sh: $bin/$b is missing: DDP_BUILD_TARGETS=\"ddp_launch ddp_launch_rdzv fault_worker\" scripts/build.sh" >&2
    exit 2
  }
done
tools=(ddp)
[[ -x $torchrun ]] && tools+=(torch)
# BENCH_TOOLS="ddp" or "torch": only one side; "ddp,torch" both.
[[ -z ${BENCH_TOOLS:-} ]] || read -r -a tools <<<"${BENCH_TOOLS//,/ }"
checkpoint_every=${BENCH_CHECKPOINT_EVERY:-50}
live_settle_ms=${BENCH_LIVE_SETTLE_MS:-2000}
live_timeout_ms=${BENCH_LIVE_TIMEOUT_MS:-10000}
torch_rdzv_conf=last_call_timeout=1${BENCH_TORCH_RDZV_CONF:+,$BENCH_TORCH_RDZV_CONF}
# What to type to run this again, and what the figures depend on (the detection bounds each side uses).
tools_csv=${tools[*]}
echo "command: BENCH_TOOLS=${tools_csv// /,} BENCH_CHECKPOINT_EVERY=$checkpoint_every" \
  "BENCH_LIVE_SETTLE_MS=$live_settle_ms BENCH_LIVE_TIMEOUT_MS=$live_timeout_ms" \
  "${BENCH_TORCH_RDZV_CONF:+BENCH_TORCH_RDZV_CONF=$BENCH_TORCH_RDZV_CONF }scripts/bench-hosts.sh $runs $figures_asked"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); load: $(uptime); git: $(git -C "$DDP_ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
if [[ ,$figures, == *,elastic* || ,$figures, == *,live,* ]]; then
  echo "detection: ddp elastic (--recovery restart): the job channel (a lost host's connections close), then" \
    "--rdzv_conf last_call_timeout=1; its workers' collective timeout 30 s; checkpoint every $checkpoint_every steps"
  echo "detection: ddp live: the launchers' liveness channel (a killed host's connection closes: marked gone at once;" \
    "a silent one after keep_alive 1 s x 5), settle timeout $live_settle_ms ms (a host nobody marks gone), collective timeout" \
    "$live_timeout_ms ms (a silent host), --rdzv_conf last_call_timeout=1; no checkpoint"
  echo "detection: torchrun elastic: --rdzv_conf $torch_rdzv_conf, otherwise torch's defaults (keep_alive_interval 5 s" \
    "x keep_alive_max_attempt 3: a silent node leaves the rendezvous after 15 s; join 600 s, close 30 s)," \
    "--monitor_interval 0.05; Gloo's default collective timeout (30 min); checkpoint every $checkpoint_every steps"
fi
name="bh$$"
work=$(mktemp -d)
cleanup() {
  "$cluster" down "$name"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM
"$cluster" up "$name" 3
host0=$("$cluster" addr "$name" 0)
export OMP_NUM_THREADS=1

now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# Processes still running (not zombies) in the hosts' namespaces.
alive_in_bed() {
  local k p state count=0
  for k in 0 1 2; do
    for p in $(ip netns pids "$name-h$k"); do
      state=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) || continue
      [[ -n $state && $state != Z ]] && count=$((count + 1))
    done
  done
  echo "$count"
}

# The launcher (ddp_launch or torchrun) in host K's namespace: the child of `timeout`.
launcher_in() {
  local p bound=""
  for p in $(ip netns pids "$name-h$1"); do
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == timeout ]] && bound=$p
  done
  [[ -n $bound ]] || return 0
  for p in $(ip netns pids "$name-h$1"); do
    [[ $(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) == "$bound" ]] && echo "$p" && return 0
  done
}

# Waits until nothing runs in the bed (bounded); ends every process left after LIMIT seconds.
# Prints "gone" or "left N".
drain_bed() {
  local limit=$1 deadline=$((SECONDS + $1)) n
  while (($(alive_in_bed) > 0)); do
    if ((SECONDS >= deadline)); then
      n=$(alive_in_bed)
      for k in 0 1 2; do ip netns pids "$name-h$k" | xargs -r kill -KILL 2>/dev/null || true; done
      echo "left $n"
      return 0
    fi
    sleep 0.02
  done
  echo gone
}

# launch TOOL MODE K PORT NPROC WORKER_ARGS...: host K's launcher, output in $work/hostK.log;
# extra_env and extra_flags (the launcher's) when set.
extra_env=()
extra_flags=()
launch() {
  local tool=$1 mode=$2 k=$3 port=$4 nproc=$5 cmd
  shift 5
  if [[ $tool == ddp ]]; then
    cmd=(env "${extra_env[@]}" "$bin/ddp_launch" --nproc_per_node "$nproc" --monitor_interval 0.05 --shutdown_grace 3
      "${extra_flags[@]}")
    if [[ $mode == static ]]; then
      cmd+=(--nnodes 3 --node_rank "$k" --master_addr "$host0" --master_port "$port")
    else
      cmd+=(--nnodes 3 --rdzv_endpoint "host0:$port" --rdzv_id bench --rdzv_timeout 60)
    fi
    cmd+=("$bin/fault_worker" train "$@")
  else
    # PyTorch advertises the hostname's address, 127.0.1.1 on the bed as on Debian (docs/hosts.md):
    # without the interface named, its ranks cannot connect (connectFullMesh ... Connection refused).
    cmd=(env GLOO_SOCKET_IFNAME=eth0 "${extra_env[@]}" "$torchrun" --nproc_per_node "$nproc" "${extra_flags[@]}")
    if [[ $mode == static ]]; then
      cmd+=(--nnodes 3 --node_rank "$k" --master_addr "$host0" --master_port "$port")
    else
      cmd+=(--nnodes 3 --rdzv_backend c10d --rdzv_endpoint "host0:$port" --rdzv_id bench)
    fi
    cmd+=("$reference" "$@")
  fi
  "$cluster" exec "$name" "$k" timeout -s KILL 90 "${cmd[@]}" >"$work/host$k.log" 2>&1 &
}

# Start to the end of step 1: all three launchers started at once; the time at which host 0's log
# first says "finished 1 steps".
first_step() {
  local tool=$1 mode=$2 port=$3 start end deadline
  rm -f "$work"/host*.log
  start=$(now)
  for k in 0 1 2; do launch "$tool" "$mode" "$k" "$port" 1 --steps 1; done
  deadline=$((SECONDS + 60))
  until grep -q "finished 1 steps" "$work/host0.log" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      echo "no first step within 60 s" >&2
      tail -n 5 "$work"/host*.log >&2
      drain_bed 0 >/dev/null
      return 1
    fi
    sleep 0.01
  done
  end=$(now)
  wait
  elapsed "$start" "$end"
}

# From host 1's launcher (ddp_launch or torchrun) SIGKILLed mid-training to every process gone;
# with WHOLE=1, every process of host 1 SIGKILLed at once.
host_loss() {
  local tool=$1 port=$2 whole=${3:-0} victim killed result
  rm -f "$work"/host*.log
  for k in 0 1 2; do launch "$tool" static "$k" "$port" 2 --steps 100000 --step-ms 20; done
  sleep 8  # started and training (a step is about 20 ms)
  victim=$(launcher_in 1)
  [[ -n $victim ]] || {
    echo "no launcher in host 1" >&2
    tail -n 5 "$work"/host*.log >&2
    return 1
  }
  if ((whole)); then
    victim=$(ip netns pids "$name-h1")
  fi
  killed=$(now)
  # shellcheck disable=SC2086  # one pid per word
  kill -KILL $victim
  result=$(drain_bed 60)
  if [[ $result == gone ]]; then
    elapsed "$killed" "$(now)"
  else
    echo "not gone after 60 s ($result processes)"
  fi
  wait || true
}

# A coordinated restart: from the fault (rank 2, before step 150 of attempt 0) to rank 0's first
# step of attempt 1, in seconds.
restart() {
  local tool=$1 mode=$2 port=$3 deadline fault trained
  rm -rf "$work"/host*.log "$work/pids"
  mkdir -p "$work/pids"
  extra_flags=(--max_restarts 3)  # torchrun needs more than one round here (docs/hosts.md)
  if [[ $tool == ddp ]]; then
    extra_env=(DDP_FAULT=rank=2,step=150,kind=exit,attempt=0)
    for k in 0 1 2; do
      launch ddp "$mode" "$k" "$port" 1 --steps 400 --step-ms 20 --pid-dir "$work/pids" --say-first-step
    done
  else
    extra_flags+=(--monitor_interval 0.05)  # as ddp_launch's here
    for k in 0 1 2; do
      launch torch "$mode" "$k" "$port" 1 --steps 400 --step-ms 20 --fail-rank 2 --fail-step 150 \
        --fault-file "$work/pids/fault.at" --say-first-step
    done
  fi
  extra_env=()
  extra_flags=()
  deadline=$((SECONDS + 90))
  # Rank 0's first step after the fault (torchrun's restart count grows only where a worker failed,
  # so the attempt number it prints is not the round).
  until [[ -s $work/pids/fault.at ]] && fault=$(cat "$work/pids/fault.at") &&
    trained=$(sed -n -E 's/.*trained a step in attempt [0-9]+ at ([0-9]+).*/\1/p' "$work"/host*.log 2>/dev/null |
      awk -v f="$fault" '$1 > f { print; exit }') && [[ -n $trained ]]; do
    if ((SECONDS >= deadline)); then
      echo "no step after the fault within 90 s" >&2
      tail -n 5 "$work"/host*.log >&2
      drain_bed 0 >/dev/null
      wait || true
      return 1
    fi
    sleep 0.05
  done
  drain_bed 0 >/dev/null
  wait || true
  awk -v a="$fault" -v b="$trained" 'BEGIN { printf "%.2f", (b - a) / 1e9 }'
}

# CLOCK_MONOTONIC now, in ns (the workers print that clock): $EPOCHREALTIME shifted by the offset
# measured once (the clocks do not drift apart measurably within a run).
mono_offset=$("$DDP_ROOT/.venv/bin/python" -c 'import time; print(time.monotonic_ns() - time.time_ns())' 2>/dev/null ||
  echo "")
mono_now() { awk -v r="$EPOCHREALTIME" -v o="$mono_offset" 'BEGIN { printf "%.0f", r * 1e9 + o }'; }

# The first "trained a step ... at T" of any host with T > AFTER (ns), waited for up to 90 s.
first_step_after() {
  local after=$1 deadline=$((SECONDS + 90)) t
  until t=$(sed -n -E 's/.*trained a step in attempt [0-9]+ at ([0-9]+).*/\1/p' "$work"/host*.log 2>/dev/null |
    awk -v f="$after" '$1 > f' | sort -n | head -n 1) && [[ -n $t ]]; do
    ((SECONDS < deadline)) || return 1
    sleep 0.05
  done
  echo "$t"
}

# Host K of an elastic 2:3 job (See Note [Elastic rounds]), output in $work/hostK.log.
launch_elastic() {
  local tool=$1 k=$2 port=$3 cmd
  local common=(--nproc_per_node 1 --monitor_interval 0.05 --nnodes 2:3 --rdzv_endpoint "host0:$port"
    --rdzv_id "elastic$port" --max_restarts 5)
  if [[ $tool == ddp ]]; then
    cmd=("$bin/ddp_launch" "${common[@]}" --rdzv_conf last_call_timeout=1 --shutdown_grace 3 --rdzv_timeout 60
      "$bin/fault_worker" train)
  else
    cmd=(env GLOO_SOCKET_IFNAME=eth0 "$torchrun" "${common[@]}" --rdzv_conf "$torch_rdzv_conf" --rdzv_backend c10d
      "$reference")
  fi
  "$cluster" exec "$name" "$k" timeout -s KILL 90 "${cmd[@]}" --steps 100000 --step-ms 20 --say-first-step \
    --checkpoint-dir "$work/checkpoints$port" --checkpoint-every "$checkpoint_every" --resume --say-steps \
    >"$work/host$k.log" 2>&1 &
}

# Elastic membership, two jobs: a host joining a running 2-host job, to rank 0's first step at 3
# hosts; then, in a 3-host job, every process of host 1 SIGKILLed at once, to rank 0's first step on
# the 2 survivors. Prints seconds ("failed" for a figure that did not happen); for a loss, then the
# steps lost, host 0's last step before the restart and the step it resumed from ("?" when unknown).
elastic_phase() {  # elastic_phase TOOL PORT arrival|loss
  local tool=$1 port=$2 phase=$3 t0 t k kill_line lost
  rm -f "$work"/host*.log
  launch_elastic "$tool" 0 "$port"
  sleep 0.5
  launch_elastic "$tool" 1 "$port"
  [[ $phase == arrival ]] || launch_elastic "$tool" 2 "$port"
  t=$(first_step_after 0) || { echo "the job did not train" >&2; tail -n 5 "$work"/host*.log >&2; return 1; }
  sleep 2
  # A loss lands anywhere between two checkpoints, not at one phase of them.
  [[ $phase == arrival ]] || sleep "0.$((RANDOM % 10))"
  kill_line=$(wc -l <"$work/host0.log")
  t0=$(mono_now)
  if [[ $phase == arrival ]]; then
    launch_elastic "$tool" 2 "$port"
  else
    # shellcheck disable=SC2046  # one pid per word
    kill -KILL $(ip netns pids "$name-h1")
  fi
  t=$(first_step_after "$t0") || { echo "no step after the $phase" >&2; tail -n 5 "$work"/host*.log >&2; return 1; }
  awk -v a="$t0" -v b="$t" 'BEGIN { printf "%.2f", (b - a) / 1e9 }'
  [[ $phase == loss ]] || return 0
  # Host 0's worker after the loss is a new process (first_step_after saw rank 0 train, so it has
  # resumed): the steps lost are those its predecessor had applied since the checkpoint it read.
  lost=$(awk -v after="$kill_line" '
    match($0, /step [0-9]+ done/) { split(substr($0, RSTART, RLENGTH), w, " "); last = w[2] }
    NR > after && /resumed from step [0-9]+/ { print (last == "" ? "?" : last - $NF), last, $NF; found = 1; exit }
    END { if (!found) print "? ? ?" }' "$work/host0.log")
  echo " $lost"
}

elastic() {  # prints "ARRIVAL LOSS LOST LAST RESUMED"; ARRIVAL "skipped" without the figure elastic
  local tool=$1 port=$2 arrival=skipped loss
  [[ -n $mono_offset ]] || { echo "no .venv/bin/python to read CLOCK_MONOTONIC" >&2; return 1; }
  if [[ ,$figures, == *,elastic,* ]]; then
    arrival=$(elastic_phase "$tool" "$port" arrival || echo failed)
    drain_bed 0 >/dev/null
    wait || true
  fi
  loss=$(elastic_phase "$tool" $((port + 1)) loss || echo "failed ? ? ?")
  drain_bed 0 >/dev/null
  wait || true
  echo "$arrival $loss"
}

# Live recovery (--recovery live): every process of host 1 SIGKILLed, to rank 0's next step at world
# size 2 (wall clock: the demo prints it). Prints seconds, the steps lost (applied steps trained
# again), host 0's last step at world size 3 and its first at world size 2.
# start_live_job PORT [FLAGS...]: a --recovery live job on the 3 hosts, 1 worker each (and FLAGS),
# trained to step 20; sets deadline (60 s from the start).
start_live_job() {
  local port=$1 k
  shift
  rm -f "$work"/host*.log
  for k in 0 1 2; do
    "$cluster" exec "$name" "$k" timeout -s KILL 90 "$bin/ddp_launch" --nproc_per_node 1 --monitor_interval 0.05 \
      --nnodes 2:3 --rdzv_endpoint "host0:$port" --rdzv_id "live$port" --rdzv_conf last_call_timeout=1 --recovery live \
      "$@" "$bin/live_recovery_demo" --steps 100000 --step-ms 20 --settle-ms "$live_settle_ms" \
      --timeout-ms "$live_timeout_ms" >"$work/host$k.log" 2>&1 &
    ((k > 0)) || sleep 0.5
  done
  deadline=$((SECONDS + 60))
  until grep -q -F "live demo: step 20 world 3" "$work/host0.log" 2>/dev/null; do
    ((SECONDS < deadline)) || { echo "the job did not train" >&2; tail -n 5 "$work"/host*.log >&2; return 1; }
    sleep 0.05
  done
}

live() {
  local port=$1 t0 t
  start_live_job "$port" || return 1
  t0=$(date +%s%3N)
  # shellcheck disable=SC2046  # one pid per word
  kill -KILL $(ip netns pids "$name-h1")
  until t=$(sed -n -E 's/.*live demo: step [0-9]+ world 2 at_ms ([0-9]+).*/\1/p' "$work/host0.log" | head -n 1) &&
    [[ -n $t ]]; do
    ((SECONDS < deadline)) || { echo "no step at world 2" >&2; tail -n 5 "$work"/host*.log >&2; return 1; }
    sleep 0.05
  done
  awk -v a="$t0" -v b="$t" 'BEGIN { printf "%.2f", (b - a) / 1e3 }'
  # The demo prints a step once every rank applied it: the first at world size 2 right after the
  # last at world size 3 means only the step in flight was dropped (and run again).
  awk 'match($0, /live demo: step [0-9]+ world [0-9]+ at_ms/) {
      split(substr($0, RSTART, RLENGTH), w, " ")
      if (w[6] == 3) last = w[4]
      if (w[6] == 2) { print "", (last == "" ? "?" : last + 1 - w[4]), (last == "" ? "?" : last), w[4]; exit }
    }' "$work/host0.log"
}

# Live recovery with a spare per host (--spares 1): host 1's worker and spare SIGKILLed, to the next
# step at world size 3 after the recovery's round (wall clock). Prints seconds, the steps lost, host
# 0's last step before the round and the first after it.
live_spares() {
  local port=$1 t0 value t lost last first
  start_live_job "$port" --spares 1 || return 1
  t0=$(date +%s%3N)
  # shellcheck disable=SC2046  # one pid per word
  kill -KILL $(ip netns pids "$name-h1")
  until value=$(awk 'match($0, /live demo: round [0-9]+ rank [0-9]+ world [0-9]+ epoch [0-9]+ offset [0-9]+ at step [0-9]+/) {
        split(substr($0, RSTART, RLENGTH), f, " ")
        if (f[4] >= 2 && round == "") round = f[15]
        next
      }
      match($0, /live demo: step [0-9]+ world [0-9]+ at_ms [0-9]+/) {
        split(substr($0, RSTART, RLENGTH), w, " ")
        if (round == "") last = w[4]
        else if (w[4] == round + 1 && w[6] == 3) { print w[8], last + 1 - w[4], last, w[4]; exit }
      }' "$work/host0.log") && [[ -n $value ]]; do
    ((SECONDS < deadline)) || { echo "no step at world 3 after the recovery" >&2; tail -n 5 "$work"/host*.log >&2; return 1; }
    sleep 0.05
  done
  read -r t lost last first <<<"$value"
  awk -v a="$t0" -v b="$t" 'BEGIN { printf "%.2f", (b - a) / 1e3 }'
  echo " $lost $last $first"
}

median() {  # median VALUES...: of the numeric ones; "?" when none
  printf '%s\n' "$@" | sort -g | awk '/^[0-9.]+$/ { v[n++] = $1 } END { print n ? v[int(n / 2)] : "?" }'
}

summary_steps() {  # summary_steps LABEL VALUES...: min, median, max of step counts
  local label=$1
  shift
  printf '%s\n' "$@" | sort -g | awk -v l="$label" '
    /^-?[0-9]+$/ { v[n++] = $1; next } { other = other " [" $0 "]" }
    END { if (n) printf "%-52s min %d, median %d, max %d (%d runs)%s\n", l, v[0], v[int(n / 2)], v[n - 1], n, other;
          else printf "%-52s%s\n", l, other }'
}

summary() {  # summary LABEL VALUES...: min, median, max of numeric values
  local label=$1
  shift
  printf '%s\n' "$@" | sort -g | awk -v l="$label" '
    /^[0-9.]+$/ { v[n++] = $1; next } { other = other " [" $0 "]" }
    END { if (n) printf "%-52s min %.2f s, median %.2f s, max %.2f s (%d runs)%s\n", l, v[0], v[int(n / 2)], v[n - 1], n, other;
          else printf "%-52s%s\n", l, other }'
}

port=29500
declare -A results
for ((run = 1; run <= runs; run++)); do
  for tool in "${tools[@]}"; do
    if [[ ,$figures, == *,first_step,* ]]; then
      for mode in static c10d; do
        port=$((port + 1))
        value=$(first_step "$tool" "$mode" "$port" || echo failed)
        echo "run $run: $tool $mode: start to the end of step 1: $value s"
        results["$tool first_step $mode"]+="$value "
      done
    fi
    if [[ ,$figures, == *,host_loss,* ]]; then
      port=$((port + 1))
      value=$(host_loss "$tool" "$port" || echo failed)
      echo "run $run: $tool: host 1's launcher SIGKILLed to every process gone: $value"
      results["$tool host_loss"]+="$value;"
    fi
    if [[ ,$figures, == *,host_down,* ]]; then
      port=$((port + 1))
      value=$(host_loss "$tool" "$port" 1 || echo failed)
      echo "run $run: $tool: every process of host 1 SIGKILLed to every process gone: $value"
      results["$tool host_down"]+="$value;"
    fi
    if [[ ,$figures, == *,restart,* ]]; then
      # torchrun's static rendezvous does not coordinate restarts across hosts: each agent restarts
      # when its own workers fail, seconds apart, and the early ones' ranks fail to connect to the
      # stale rank 0 (connectFullMesh ... Connection refused), every time here (docs/hosts.md).
      modes=(c10d static)
      [[ $tool == ddp ]] || modes=(c10d)
      for mode in "${modes[@]}"; do
        port=$((port + 1))
        value=$(restart "$tool" "$mode" "$port" || echo failed)
        echo "run $run: $tool $mode: a worker's failure to training again after a coordinated restart: $value s"
        results["$tool restart $mode"]+="$value "
      done
    fi
    if [[ ,$figures, == *,elastic,* || ,$figures, == *,elastic_loss,* ]]; then
      port=$((port + 3))
      value=$(elastic "$tool" "$port" || echo "failed failed ? ? ?")
      read -r arrival loss lost last resumed <<<"$value"
      [[ $arrival == skipped ]] || arrival_text="a host arriving to training at 3 hosts: $arrival s; "
      echo "run $run: $tool elastic: ${arrival_text:-}a host lost to training at 2: $loss s," \
        "steps lost $lost (host 0's last step $last, resumed from $resumed; a checkpoint every $checkpoint_every steps)"
      results["$tool elastic_arrival"]+="$arrival "
      results["$tool elastic_loss"]+="$loss "
      results["$tool elastic_lost"]+="$lost "
    fi
    if [[ ,$figures, == *,live,* && $tool == ddp ]]; then
      port=$((port + 3))
      value=$(live "$port" || echo "failed ? ? ?")
      drain_bed 0 >/dev/null
      wait || true
      read -r seconds lost last first <<<"$value"
      echo "run $run: ddp live: a host lost to the survivors' next step at 2 (same processes): $seconds s," \
        "steps lost $lost (host 0's last step at world 3: $last, first at world 2: $first; the step in flight dropped)"
      results["ddp live"]+="$seconds "
      results["ddp live_lost"]+="$lost "
    fi
    if [[ ,$figures, == *,spares,* && $tool == ddp ]]; then
      port=$((port + 3))
      value=$(live_spares "$port" || echo "failed ? ? ?")
      drain_bed 0 >/dev/null
      wait || true
      read -r seconds lost last first <<<"$value"
      echo "run $run: ddp live --spares 1: a host lost to the next step at full size 3 (a spare in its place): $seconds s," \
        "steps lost $lost (host 0's last step before the recovery: $last, first after it: $first)"
      results["ddp spares"]+="$seconds "
      results["ddp spares_lost"]+="$lost "
    fi
  done
done
echo
for tool in "${tools[@]}"; do
  label=$([[ $tool == ddp ]] && echo "ddp_launch + C++ DDP" || echo "torchrun + Python DDP")
  if [[ ,$figures, == *,first_step,* ]]; then
    for mode in static c10d; do
      # shellcheck disable=SC2086  # one value per word
      summary "$label, start to step 1 ($mode)" ${results["$tool first_step $mode"]}
    done
  fi
  if [[ ,$figures, == *,restart,* ]]; then
    modes=(c10d static)
    [[ $tool == ddp ]] || modes=(c10d)
    for mode in "${modes[@]}"; do
      # shellcheck disable=SC2086  # one value per word
      summary "$label, a failure to training again ($mode)" ${results["$tool restart $mode"]}
    done
  fi
  if [[ ,$figures, == *,elastic,* ]]; then
    # shellcheck disable=SC2086  # one value per word
    summary "$label, elastic: host arrives to training at 3" ${results["$tool elastic_arrival"]}
  fi
  if [[ ,$figures, == *,elastic,* || ,$figures, == *,elastic_loss,* ]]; then
    # shellcheck disable=SC2086  # one value per word
    summary "$label, elastic: host lost to training at 2" ${results["$tool elastic_loss"]}
    # shellcheck disable=SC2086  # one value per word
    summary_steps "$label, elastic: steps lost (trained again)" ${results["$tool elastic_lost"]}
  fi
  if [[ ,$figures, == *,live,* && $tool == ddp ]]; then
    # shellcheck disable=SC2086  # one value per word
    summary "$label, live: host lost to the next step at 2" ${results["ddp live"]}
    # shellcheck disable=SC2086  # one value per word
    summary_steps "$label, live: steps lost (trained again)" ${results["ddp live_lost"]}
  fi
  if [[ ,$figures, == *,spares,* && $tool == ddp ]]; then
    # shellcheck disable=SC2086  # one value per word
    summary "$label, live --spares 1: host lost to the next step at 3" ${results["ddp spares"]}
    # shellcheck disable=SC2086  # one value per word
    summary_steps "$label, live --spares 1: steps lost (trained again)" ${results["ddp spares_lost"]}
  fi
  for figure in host_loss host_down; do
    [[ ,$figures, == *,$figure,* ]] || continue
    IFS=';' read -r -a losses <<<"${results["$tool $figure"]}"
    summary "$label, $([[ $figure == host_loss ]] && echo "launcher lost" || echo "host lost") to every process gone" \
      "${losses[@]}"
  done
done
# Issue 22's comparison: the medians of a host loss to the next step, side by side, and their ratios.
if [[ ,$figures, == *,elastic* && ,$figures, == *,live,* ]]; then
  # shellcheck disable=SC2086  # one value per word
  live_median=$(median ${results["ddp live"]})
  line="host loss to the next step (medians): ddp live $live_median s"
  if [[ ,$figures, == *,spares,* ]]; then
    # shellcheck disable=SC2086  # one value per word
    line+=" (world 3 to 2); ddp live --spares 1 $(median ${results["ddp spares"]}) s (world 3 kept)"
  fi
  for tool in "${tools[@]}"; do
    # shellcheck disable=SC2086  # one value per word
    loss_median=$(median ${results["$tool elastic_loss"]})
    # shellcheck disable=SC2086  # one value per word
    lost_median=$(median ${results["$tool elastic_lost"]})
    label=$([[ $tool == ddp ]] && echo "ddp elastic restart" || echo "torchrun elastic")
    ratio=$(awk -v a="$loss_median" -v b="$live_median" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.1f", a / b; else print "?" }')
    line+="; $label $loss_median s ($lost_median steps lost), $ratio x live's time"
  done
  echo "$line"
fi
echo "load at the end: $(uptime)"
