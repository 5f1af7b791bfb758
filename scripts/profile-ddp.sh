#!/usr/bin/env bash
# Where the time of a DDP step goes (docs/benchmarks.md, "Where the time goes"), in two parts:
#   1. instructions per training step (valgrind --tool=callgrind, per thread; load-independent): this
#      library's DDP (build/bin/ddp_bench --mode ddp) and PyTorch's Python DDP
#      (benchmarks/torch_ddp_reference.py), 1 rank alone and each of 2 ranks (Python: 1 rank unless
#      PY_CALLGRIND_RANKS="1 2": importing torch under callgrind takes ~10 minutes per run here). A
#      step's count is the difference of a LONG and a SHORT run divided by LONG - SHORT, so start-up
#      cancels out.
#   2. CPU accounting of real runs (perf stat's software counters): CPU time per step and per rank
#      against wall time, context switches per step, threads per process (from /proc during the run).
#   scripts/profile-ddp.sh [OUT]   (default OUT: build/profile)
#   environment: MODEL=lenet BATCH=64 SHORT=4 LONG=14 NPROC=2 WALL_SHORT=20 WALL_ITERS=300 THREADS=1
#   SKIP_PYTHON= SKIP_CALLGRIND= PY_CALLGRIND_RANKS=1
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${DDP_BUILD_DIR:-$root/build}/bin
out=${1:-${DDP_BUILD_DIR:-$root/build}/profile}
model=${MODEL:-lenet} batch=${BATCH:-64} short=${SHORT:-4} long=${LONG:-14} nproc=${NPROC:-2}
wall_iters=${WALL_ITERS:-300}
export OMP_NUM_THREADS=${THREADS:-1}
for tool in ddp_bench ddp_launch; do
  [[ -x $bin/$tool ]] || { echo "profile-ddp: no $bin/$tool: cmake --build build --target $tool" >&2; exit 2; }
done
command -v valgrind > /dev/null || [[ -n ${SKIP_CALLGRIND:-} ]] || { echo "profile-ddp: valgrind is missing (apt-get install valgrind) or set SKIP_CALLGRIND=1" >&2; exit 2; }
command -v perf > /dev/null || { echo "profile-ddp: perf is missing (apt-get install linux-perf)" >&2; exit 2; }
python=$root/.venv/bin/python torchrun=$root/.venv/bin/torchrun
mkdir -p "$out"
rm -rf "${out:?}"/cg "${out:?}"/perf
mkdir -p "$out/cg" "$out/perf"

# --- the programs: side ranks iters -> command line (under a launcher when ranks > 1) ---------------
cpp_args() { echo "--mode ddp --model $model --batch $batch --warmup 2 --iters $1 --no-markdown${cpp_csv:+ --csv $cpp_csv}"; }
py_args() { echo "$root/benchmarks/torch_ddp_reference.py --model $model --batch $batch --warmup 2 --iters $1"; }
launch() {  # side ranks wrapper... -> runs the side's program under wrapper
  local side=$1 ranks=$2 iters=$3
  shift 3
  if [[ $side == cpp ]]; then
    if ((ranks == 1)); then "$@" "$bin/ddp_bench" $(cpp_args "$iters")
    else "$bin/ddp_launch" --nproc_per_node "$ranks" --master_port 0 "$@" "$bin/ddp_bench" $(cpp_args "$iters"); fi
  else
    "$torchrun" --standalone --nproc_per_node "$ranks" --no-python "$@" "$python" $(py_args "$iters")
  fi
}
sides=(cpp)
[[ -n ${SKIP_PYTHON:-} ]] || sides+=(py)

# --- 1. callgrind ---------------------------------------------------------------------------------
# Sum of the Ir of one run's thread files; $1 = file prefix.
instructions() { cat "$1"-* 2> /dev/null | awk '/^(summary|totals):/ { s += $2 } END { printf "%.0f", s }'; }
# The main thread is the first (-01) file of each process.
main_instructions() { cat "$1"-01 2> /dev/null | awk '/^(summary|totals):/ { s += $2 } END { printf "%.0f", s }'; }
if [[ -z ${SKIP_CALLGRIND:-} ]]; then
  cat > "$out/cg/wrap.sh" << WRAP
#!/bin/sh
exec valgrind --tool=callgrind --separate-threads=yes --dump-instr=no --callgrind-out-file="$out/cg/\$CG_TAG-r\${RANK:-0}" "\$@" 2>> "$out/cg/\$CG_TAG.valgrind.log"
WRAP
  chmod +x "$out/cg/wrap.sh"
  echo "== 1. instructions per step (callgrind; $model batch $batch, $OMP_NUM_THREADS thread(s); runs of $short and $long steps)"
  printf '%-6s %-5s %-5s %16s %16s %16s\n' side ranks rank "instr/step" "main thread" "other threads"
  for side in "${sides[@]}"; do
    cg_ranks="1 $nproc"
    [[ $side == py ]] && cg_ranks=${PY_CALLGRIND_RANKS:-1}
    for ranks in $cg_ranks; do
      for iters in "$short" "$long"; do
        CG_TAG=$side-w$ranks-i$iters launch "$side" "$ranks" "$iters" "$out/cg/wrap.sh" > "$out/cg/$side-w$ranks-i$iters.log" 2>&1 ||
          { echo "profile-ddp: the $side run with $ranks rank(s) failed; see $out/cg/$side-w$ranks-i$iters.log" >&2; exit 1; }
      done
      for ((r = 0; r < ranks; r++)); do
        a=$out/cg/$side-w$ranks-i$short-r$r b=$out/cg/$side-w$ranks-i$long-r$r
        total=$(awk -v x="$(instructions "$b")" -v y="$(instructions "$a")" -v n=$((long - short)) 'BEGIN { printf "%.0f", (x - y) / n }')
        main=$(awk -v x="$(main_instructions "$b")" -v y="$(main_instructions "$a")" -v n=$((long - short)) 'BEGIN { printf "%.0f", (x - y) / n }')
        printf '%-6s %-5s %-5s %16s %16s %16s\n' "$side" "$ranks" "$r" "$total" "$main" "$((total - main))"
      done
    done
  done | tee "$out/instructions.txt"
fi

# --- 2. CPU accounting ----------------------------------------------------------------------------
# Two runs per configuration (WALL_SHORT and WALL_ITERS steps); per-step figures are differences, so
# start-up (loading LibTorch, rendezvous) cancels out.
cat > "$out/perf/wrap.sh" << WRAP
#!/bin/sh
exec perf stat -x, -e task-clock,context-switches -o "$out/perf/\$PERF_TAG-r\${RANK:-0}.csv" "\$@"
WRAP
chmod +x "$out/perf/wrap.sh"
wall_short=${WALL_SHORT:-20}
counter() { awk -F, -v name="$2" '$3 ~ "^" name { print $1 }' "$1"; }
run_timed() {  # side ranks iters -> wall seconds; records threads per process in $out/perf/threads
  local side=$1 ranks=$2 iters=$3 job n pid pids comm threads=""
  cpp_csv=$out/perf/$side-w$ranks-i$iters.csv
  PERF_TAG=$side-w$ranks-i$iters launch "$side" "$ranks" "$iters" "$out/perf/wrap.sh" > "$out/perf/$side-w$ranks-i$iters.log" 2>&1 &
  job=$!
  if ((iters == wall_iters)); then
    # Threads of each worker: the most seen while the run lasts (sampled every 0.2 s).
    declare -A most=()
    while kill -0 "$job" 2> /dev/null; do
      if [[ $side == cpp ]]; then pids=$(pgrep -f "bin/ddp_bench $(cpp_args "$iters")" -d' ' || true)
      else pids=$(pgrep -f "torch_ddp_reference.py --model $model --batch $batch --warmup 2 --iters $iters" -d' ' || true); fi
      for pid in $pids; do
        comm=$(cat "/proc/$pid/comm" 2> /dev/null || true)
        [[ $comm == ddp_bench || $comm == python* ]] || continue  # not the launcher or perf
        n=$(awk '/^Threads/ { print $2 }' "/proc/$pid/status" 2> /dev/null || true)
        [[ -n $n ]] && ((n > ${most[$pid]:-0})) && most[$pid]=$n
      done
      sleep 0.2
    done
    for pid in $(printf '%s\n' "${!most[@]}" | sort -n); do threads+="${most[$pid]} "; done
    echo "${threads% }" > "$out/perf/threads"
  fi
  wait "$job" || { echo "profile-ddp: the $side run with $ranks rank(s) failed; see $out/perf/$side-w$ranks-i$iters.log" >&2; return 1; }
  cpp_csv=""
  # Wall time per step of the timed iterations, as the program reports it (samples/s of the slowest rank).
  local rate
  if [[ $side == cpp ]]; then
    rate=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } { print $c["samples_per_s"] }' "$out/perf/$side-w$ranks-i$iters.csv")
  else
    rate=$(grep -o 'samples_per_s=[0-9.]*' "$out/perf/$side-w$ranks-i$iters.log" | cut -d= -f2)
  fi
  awk -v r="$rate" -v n=$((ranks * batch)) 'BEGIN { printf "%.3f", 1000 * n / r }'
}
echo "== 2. CPU accounting (runs of $wall_short and $wall_iters steps; perf stat per rank; load average $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%-6s %-5s %-5s %12s %12s %10s %9s %s\n' side ranks rank "wall ms/step" "CPU ms/step" "CPUs used" "cs/step" "threads/process"
for side in "${sides[@]}"; do
  for ranks in 1 "$nproc"; do
    w1=$(run_timed "$side" "$ranks" "$wall_short")
    w2=$(run_timed "$side" "$ranks" "$wall_iters")
    for ((r = 0; r < ranks; r++)); do
      a=$out/perf/$side-w$ranks-i$wall_short-r$r.csv b=$out/perf/$side-w$ranks-i$wall_iters-r$r.csv
      awk -v side="$side" -v ranks="$ranks" -v r="$r" -v n=$((wall_iters - wall_short)) -v w1="$w1" -v w2="$w2" \
        -v c1="$(counter "$a" task-clock)" -v c2="$(counter "$b" task-clock)" \
        -v s1="$(counter "$a" context-switches)" -v s2="$(counter "$b" context-switches)" -v threads="$(cat "$out/perf/threads")" '
        BEGIN { wall = w2; cpu = (c2 - c1) / n
                printf "%-6s %-5s %-5s %12.2f %12.2f %10.2f %9.1f %s\n", side, ranks, r, wall, cpu, cpu / wall, (s2 - s1) / n, threads }'
    done
  done
done | tee "$out/cpu.txt"
echo "(wall ms/step: the timed steps of the long run, as the program reports them; CPU ms/step and cs/step (context"
echo " switches): differences of the two runs per rank, so start-up cancels; CPUs used = CPU ms / wall ms per step)"
