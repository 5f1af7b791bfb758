#!/usr/bin/env bash
# Start-to-first-step of a 2-rank Python DDP script (examples/python/ddp_gloo_train.py, Gloo, CPU):
# from the launcher's exec to the moment the last rank finished its first optimizer step, under
# ddp_launch and under torchrun with the same arguments, alternating, RUNS times each (default 5).
#   scripts/bench-python-start.sh [RUNS]
# Prints each run and the median of each launcher (docs/launcher.md, "Python scripts").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

runs=${1:-5}
python=$DDP_VENV/bin/python
launch=$DDP_BUILD_DIR/bin/ddp_launch
script=$DDP_ROOT/examples/python/ddp_gloo_train.py
[[ -x $python && -x $DDP_VENV/bin/torchrun ]] || ddp_die "no venv with torch ($DDP_VENV): run scripts/setup.sh"
[[ -x $launch ]] || ddp_die "no $launch: run scripts/build.sh"

# One run: prints the seconds from start to the last rank's first step ("failed" when it failed:
# reported and left out of the median, never hidden).
one_run() {
  local start out
  start=$(date +%s.%N)
  out=$("$@" 2>/dev/null) || { echo failed; return 0; }
  grep -o 'first step done at [0-9.]*' <<<"$out" | awk -v s="$start" '{ if ($5 > m) m = $5 } END { printf "%.3f\n", m - s }'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

ours=() theirs=()
for ((i = 1; i <= runs; i++)); do
  ours+=("$(PYTHON=$python one_run "$launch" --standalone --nproc_per_node 2 "$script" --steps 2)")
  theirs+=("$(one_run "$DDP_VENV/bin/torchrun" --standalone --nproc_per_node 2 "$script" --steps 2)")
  echo "run $i: ddp_launch ${ours[-1]} s, torchrun ${theirs[-1]} s"
done
echo "median start-to-first-step over $runs runs (failed runs left out): ddp_launch" \
  "$(printf '%s\n' "${ours[@]}" | grep -v failed | median) s, torchrun $(printf '%s\n' "${theirs[@]}" | grep -v failed | median) s;" \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"
