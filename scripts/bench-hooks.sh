#!/usr/bin/env bash
# Communication hooks on shaped links (docs/benchmarks.md "Slow links"), on the network-namespace
# test bed (scripts/netns-cluster.sh, root or CAP_NET_ADMIN), C++ and Python side by side in one run:
#   scripts/bench-hooks.sh OUT_DIR
# Settings from the environment (defaults in brackets):
#   HOSTS ["2 4"]  RATES ["1gbit 100mbit"]  MODELS ["resnet18 lenet"; none: busbw only]
#   DELAY [1ms]: one-way delay on every host's link (a round trip between two hosts: twice it);
#   0 adds none
#   HOOKS ["allreduce fp16 powersgd:1 powersgd:2 powersgd:4"]  WARMUP [3]  ITERS [4]
#   HOOKS also takes ceiling (ddp_bench --comm-hook none: the same hosts training with no
#   communication, the bed's compute ceiling) and diloco:H[:F[:DTYPE[:TAU]]] (ddp_bench --diloco H
#   --diloco-fragments F --outer-dtype DTYPE --diloco-delay TAU); these two have no PyTorch side.
#   A diloco entry warms up for H steps and times DILOCO_CYCLES [2] x H (whole sync cycles); ceiling
#   takes the steps of the first diloco entry in HOOKS (so both time the same work), else WARMUP, ITERS.
#   BATCH_resnet18 [16]  BATCH_lenet [64]  ALLREDUCE_BYTES ["8388608 67108864"]  PYTHON_SIDE [1]
#   TORCH_TRIES [3]: tries of each PyTorch run before it is recorded as failed
#   ROUNDS [1]: each bed's measurements repeated in rounds (busbw, then per model the one-host
#   baseline, every hook C++ then PyTorch, the baseline again); every row names its round, and
#   plot_hooks.py reports medians over the rounds, each round's scaling and C++/PyTorch ratio paired
#   within that round (single runs on a shared 2-core machine vary by +-10%)
#   AR_ITERS [3]: timed all-reduces of allreduce_bench per size (after 1 warm-up)
#   PIN [auto]: 1 runs host K's launcher and worker on core K of this machine (taskset; core K mod
#   the cores when there are fewer) and the one-host baseline on the first core, so N hosts have N
#   times one host's compute as separate machines do; auto pins a host count that fits in the cores
#   (on 2 cores: 2 hosts, not 4) and always the baseline; 0 pins nothing.
# For every rate and host count: one cluster with every host's link shaped to the rate and DELAY
# (netem; where the kernel has no sch_netem, tbf and link_delay: tests/hosts/link_delay.cpp, Note [A
# delay line without netem]), 1 worker per host; busbw of allreduce_bench
# (unsliced and as the library chooses) and of PyTorch's dist.all_reduce (benchmarks/allreduce_reference.py);
# then per model and hook ddp_bench --mode ddp (C++) and benchmarks/hooks_reference.py under
# torchrun (PyTorch's DDP with PyTorch's hook). One host's figure (ddp_bench --mode single, no
# communication) is taken per model and bed before and after its runs (the row: their mean, with
# the bed's rate and 1 host); a failed run's logs are kept in OUT_DIR.
# Rows go to OUT_DIR/hooks.csv (appended: runs into one OUT_DIR add rounds):
#   kind,rate,hosts,model,hook,impl,value,round   (kind: busbw_Mbps | samples_per_s; busbw's model: the size;
#   busbw's impl: cpp (the library's choice), cpp-unsliced, torch)
# Every launcher runs under timeout; the bed is removed on every exit path.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

out=${1:?usage: scripts/bench-hooks.sh OUT_DIR}
hosts_list=${HOSTS:-2 4}
rates=${RATES:-1gbit 100mbit}
models=${MODELS:-resnet18 lenet}
[[ $models == none ]] && models=""  # busbw only
hooks=${HOOKS:-allreduce fp16 powersgd:1 powersgd:2 powersgd:4}
warmup=${WARMUP:-3}
iters=${ITERS:-4}
allreduce_bytes=${ALLREDUCE_BYTES:-8388608 67108864}
python_side=${PYTHON_SIDE:-1}
torch_tries=${TORCH_TRIES:-3}
rounds=${ROUNDS:-1}
ar_iters=${AR_ITERS:-3}
delay=${DELAY:-1ms}
[[ $delay == 0 || $delay =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] ||
  { echo "bench-hooks.sh: DELAY must be 0 or a time with its unit (e.g. 1ms, 500us), got '$delay'" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ && $ar_iters =~ ^[1-9][0-9]*$ ]] ||
  { echo "bench-hooks.sh: ROUNDS and AR_ITERS must be positive integers, got '$rounds' and '$ar_iters'" >&2; exit 2; }
cluster=$DDP_ROOT/scripts/netns-cluster.sh
bin=$DDP_BUILD_DIR/bin
torchrun=$DDP_ROOT/.venv/bin/torchrun
reference=$DDP_ROOT/benchmarks/hooks_reference.py
allreduce_reference=$DDP_ROOT/benchmarks/allreduce_reference.py
limit=900  # seconds for one configuration, every host's launcher

reason=$("$cluster" check) || {
  echo "bench-hooks.sh: $reason" >&2
  exit 2
}
diloco_cycles=${DILOCO_CYCLES:-2}
for b in ddp_launch ddp_bench allreduce_bench link_delay; do
  [[ -x $bin/$b ]] || {
    echo "bench-hooks.sh: $bin/$b is missing: DDP_BUILD_TARGETS=\"ddp_launch ddp_bench allreduce_bench link_delay\" scripts/build.sh" >&2
    exit 2
  }
done
export DDP_LINK_DELAY=$bin/link_delay  # netns-cluster.sh's delay line where the kernel has no sch_netem
delay_args=()
[[ $delay == 0 ]] || delay_args=(--delay "$delay")
[[ -x $torchrun ]] || python_side=0
mkdir -p "$out"
csv=$out/hooks.csv
header="kind,rate,hosts,model,hook,impl,value,round"
[[ -f $csv ]] || echo "$header" >"$csv"
[[ $(head -n 1 "$csv") == "$header" ]] ||
  { echo "bench-hooks.sh: $csv has another header (an older run's): use a new OUT_DIR" >&2; exit 2; }
# The round of every row; rounds already in the CSV (an earlier run into this OUT_DIR) are kept.
first_round=$(awk -F, 'NR > 1 && $8 + 0 > m { m = $8 + 0 } END { print m + 1 }' "$csv")
round=$first_round
name=""
work=$(mktemp -d "$out/.work.XXXXXX")  # in OUT_DIR: a shared /tmp may be swept by others
cleanup() {
  [[ -n $name ]] && "$cluster" down "$name"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM
export OMP_NUM_THREADS=1

# The cores this script may use (Cpus_allowed_list, e.g. "0-1" or "0,2-3"), one per line.
cores=($(awk '/^Cpus_allowed_list/ { n = split($2, parts, ","); for (i = 1; i <= n; i++) {
  if (split(parts[i], r, "-") == 2) { for (c = r[1]; c <= r[2]; c++) print c } else print parts[i] } }' /proc/self/status))
pin=${PIN:-auto}
[[ $pin == auto || $pin == 0 || $pin == 1 ]] || { echo "bench-hooks.sh: PIN must be auto, 0 or 1, got '$pin'" >&2; exit 2; }
# pinned N K: the command prefix that runs host K of N hosts on its core (nothing when not pinning).
pinned() {
  if [[ $pin == 1 || ($pin == auto && $1 -le ${#cores[@]}) ]]; then echo "taskset -c ${cores[$(($2 % ${#cores[@]}))]}"; fi
}

batch_of() { local v="BATCH_$1"; echo "${!v:-$([[ $1 == resnet18 ]] && echo 16 || echo 64)}"; }

# column FILE NAME [ROW]: the value of column NAME in row ROW (1: the first after the header) of a CSV
# written by the harness; without ROW, in the last row.
column() {
  awk -F, -v want="$2" -v row="${3:-0}" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == want) c = i; next }
    row == 0 || NR - 1 == row { v = $c } END { print v }' "$1"
}

# on_hosts N PORT LOG_PREFIX KIND ARGS...: KIND cpp runs ddp_launch ARGS on every host, torch runs
# torchrun with the hooks' reference, torch-allreduce torchrun with allreduce_reference.py; waits for
# all (bounded by `limit`). Returns non-zero if any failed.
on_hosts() {
  local n=$1 port=$2 log=$3 kind=$4 k pids=() status=0 host0 core
  shift 4
  host0=$("$cluster" addr "$name" 0)
  for ((k = 0; k < n; k++)); do
    read -r -a core <<<"$(pinned "$n" "$k")"
    if [[ $kind == cpp ]]; then
      "$cluster" exec "$name" "$k" "${core[@]}" timeout -s KILL "$limit" "$bin/ddp_launch" --nnodes "$n" --node_rank "$k" \
        --nproc_per_node 1 --master_addr "$host0" --master_port "$port" "$@" >"$log.host$k" 2>&1 &
    else
      # PyTorch advertises the hostname's address (127.0.1.1 on the bed): name the interface.
      "$cluster" exec "$name" "$k" "${core[@]}" timeout -s KILL "$limit" env GLOO_SOCKET_IFNAME=eth0 "$torchrun" \
        --nnodes "$n" --node_rank "$k" --nproc_per_node 1 --master_addr "$host0" --master_port "$port" \
        "$([[ $kind == torch-allreduce ]] && echo "$allreduce_reference" || echo "$reference")" "$@" >"$log.host$k" 2>&1 &
    fi
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  return $status
}

# keep LOG_PREFIX LABEL: a failed run's logs into OUT_DIR (failed-LABEL.hostK), and their tails on stderr.
keep() {
  local f
  for f in "$1".host*; do
    [[ -e $f ]] || { echo "  (no logs: $1.host*)" >&2; return 0; }
    cp "$f" "$out/failed-$2.${f##*.}"
  done
  tail -n 3 "$1".host* >&2
}

row() { echo "$1,$2,$3,$4,$5,$6,$7,$round" >>"$csv"; echo "  $1 rate=$2 hosts=$3 model=$4 hook=$5 $6: $7 (round $round)"; }

load() { awk '{ printf "load %s %s %s", $1, $2, $3 }' /proc/loadavg; }

echo "bench-hooks.sh: ${#cores[@]} cores (${cores[*]}), PIN=$pin, $(load) at start; output $csv"
read -r -a baseline_core <<<"$([[ $pin == 0 ]] || pinned 1 0)"
# one_host MODEL BATCH: samples/s of ddp_bench --mode single (no communication) on the baseline's core.
one_host() {
  "${baseline_core[@]}" "$bin/ddp_bench" --mode single --model "$1" --batch "$2" --warmup "$warmup" --iters "$iters" \
    --csv "$work/single.csv" --no-markdown >/dev/null
  column "$work/single.csv" samples_per_s
}

# ceiling's steps: those of the first diloco entry, so the share of the ceiling compares equal work.
ceiling_steps=(--warmup "$warmup" --iters "$iters")
for hook in $hooks; do
  [[ $hook == diloco:* ]] || continue
  IFS=: read -r _ H _ <<<"$hook"
  ceiling_steps=(--warmup "$H" --iters "$((diloco_cycles * H))")
  break
done

port=29700
for rate in $rates; do
  for n in $hosts_list; do
    name="bk$$${rate//[^a-z0-9]/}h$n"
    "$cluster" up "$name" "$n" --rate "$rate" "${delay_args[@]}"
    echo "cluster $name: $n hosts, links at $rate, delay $delay, $([[ -n $(pinned "$n" 0) ]] && echo "host K pinned to core K" || echo "not pinned") ($(load))"
    port=$((port + 1))
    for ((round = first_round; round < first_round + rounds; round++)); do
      for bytes in $allreduce_bytes; do
        port=$((port + 1))
        size="$((bytes >> 20))MiB"
        # allreduce_bench: unsliced, then as the library chooses (auto: in slices across hosts, Note
        # [Sliced all-reduce] in ddp/distributed/detail/sliced_allreduce.cpp), side by side in one run.
        if on_hosts "$n" "$port" "$work/ar" cpp "$bin/allreduce_bench" --min-bytes "$bytes" \
          --max-bytes "$bytes" --warmup 1 --iters "$ar_iters" --slice-bytes 0,auto --csv "$work/ar.csv" --no-markdown; then
          for r in 1 2; do  # the rows of --slice-bytes 0,auto, in that order
            row busbw_Mbps "$rate" "$n" "$size" allreduce "$([[ $r == 1 ]] && echo cpp-unsliced || echo cpp)" \
              "$(awk -v g="$(column "$work/ar.csv" busbw_GBps "$r")" 'BEGIN { printf "%.1f", g * 8000 }')"
          done
        else
          row busbw_Mbps "$rate" "$n" "$size" allreduce cpp failed
          keep "$work/ar" "allreduce-$size-$rate-$n-r$round"
        fi
        ((python_side)) || continue
        port=$((port + 1))
        if on_hosts "$n" "$port" "$work/par" torch-allreduce --bytes "$bytes" --warmup 1 --iters "$ar_iters"; then
          row busbw_Mbps "$rate" "$n" "$size" allreduce torch \
            "$(grep -ho 'busbw_GBps=[0-9.]*' "$work"/par.host* | head -n 1 | awk -F= '{ printf "%.1f", $2 * 8000 }')"
        else
          row busbw_Mbps "$rate" "$n" "$size" allreduce torch failed
          keep "$work/par" "allreduce-$size-$rate-$n-torch-r$round"
        fi
      done
      for model in $models; do
        b=$(batch_of "$model")
        # One host, measured before and after this model's runs (the load of a shared machine drifts):
        # the row (rate R, 1 host) is their mean, the scaling of R's rows divides by it.
        before=$(one_host "$model" "$b")
        for hook in $hooks; do
          h=${hook%%:*} r=1 steps=(--warmup "$warmup" --iters "$iters")
          case $hook in
            ceiling) how=(--comm-hook none) steps=("${ceiling_steps[@]}") ;;
            diloco:*)
              IFS=: read -r _ H F dtype tau <<<"$hook"
              how=(--diloco "$H" --diloco-fragments "${F:-1}" --outer-dtype "${dtype:-fp32}" --diloco-delay "${tau:-0}")
              steps=(--warmup "$H" --iters "$((diloco_cycles * H))") ;;
            *)
              [[ $hook == *:* ]] && r=${hook#*:}
              how=(--comm-hook "$h" --powersgd-rank "$r") ;;
          esac
          port=$((port + 1))
          rm -f "$work/train.csv"
          if on_hosts "$n" "$port" "$work/cpp" cpp "$bin/ddp_bench" --mode ddp --model "$model" --batch "$b" \
            "${steps[@]}" "${how[@]}" --csv "$work/train.csv" --no-markdown; then
            row samples_per_s "$rate" "$n" "$model" "$hook" cpp "$(column "$work/train.csv" samples_per_s)"
          else
            row samples_per_s "$rate" "$n" "$model" "$hook" cpp failed
            keep "$work/cpp" "$model-${hook/:/}-$rate-$n-cpp-r$round"
          fi
          [[ $python_side == 1 && $hook != ceiling && $hook != diloco:* ]] || continue
          # PyTorch's powerSGD_hook can abort with Gloo ("Received data size doesn't match expected
          # size"): it all-reduces Q on the group of the next bucket's P, from Gloo's callback
          # thread, in an order that differs between ranks. Each failed try is kept and counted.
          local_ok=0
          for ((try = 1; try <= torch_tries; try++)); do
            port=$((port + 1))
            if on_hosts "$n" "$port" "$work/py" torch --model "$model" --batch "$b" --warmup "$warmup" \
              --iters "$iters" --comm-hook "$h" --powersgd-rank "$r"; then
              row samples_per_s "$rate" "$n" "$model" "$hook" torch \
                "$(grep -ho 'samples_per_s=[0-9.]*' "$work"/py.host* | head -n 1 | cut -d= -f2)"
              local_ok=1
              break
            fi
            echo "  PyTorch's run failed (try $try of $torch_tries)"
            keep "$work/py" "$model-${hook/:/}-$rate-$n-torch-r$round-try$try"
          done
          ((local_ok)) || row samples_per_s "$rate" "$n" "$model" "$hook" torch failed
        done
        after=$(one_host "$model" "$b")
        echo "  one host: $before samples/s before, $after after"
        row samples_per_s "$rate" 1 "$model" none cpp "$(awk -v a="$before" -v b="$after" 'BEGIN { printf "%.1f", (a + b) / 2 }')"
      done
    done  # rounds
    "$cluster" down "$name"
    name=""
  done
done
echo "bench-hooks.sh: done ($(load)); plot: .venv/bin/python scripts/plot_hooks.py $csv docs/slow-links.svg"
