#!/usr/bin/env bash
# scripts/plot_bench.sh on a real ddp_bench CSV (single, dp and ddp at 1 rank, ddp at 2 ranks): both charts
# per model are written and are PNG files; a file that is not a ddp_bench CSV is refused with one line
# and exit code 2. Usage: test_plot.sh BIN_DIR SCRIPTS_DIR
set -euo pipefail
bin=$1 scripts=$2
command -v gnuplot > /dev/null || { echo "SKIP: no gnuplot (scripts/setup.sh installs gnuplot-nox)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
common=(--model lenet --batch 8 --warmup 0 --iters 2 --pool-batches 1 --no-markdown --csv "$work/results.csv" --append)
timeout 120 "$bin/ddp_bench" --mode single,dp,ddp "${common[@]}" > "$work/bench.log" 2>&1
timeout 120 "$bin/ddp_launch" --nproc_per_node 2 --master_port 0 "$bin/ddp_bench" --mode ddp "${common[@]}" >> "$work/bench.log" 2>&1
[[ $(wc -l < "$work/results.csv") == 5 ]] || { echo "FAILED: expected a header and 4 rows"; cat "$work/results.csv"; exit 1; }

timeout 60 "$scripts/plot_bench.sh" "$work/results.csv" "$work/png"
for chart in throughput_lenet breakdown_lenet; do
  png=$work/png/$chart.png
  [[ -s $png ]] || { echo "FAILED: $chart.png was not written"; exit 1; }
  [[ $(head -c 8 "$png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || { echo "FAILED: $chart.png is not a PNG"; exit 1; }
  (($(stat -c %s "$png") > 2000)) || { echo "FAILED: $chart.png is too small to hold a chart"; exit 1; }
done

printf 'a,b\n1,2\n' > "$work/other.csv"
if "$scripts/plot_bench.sh" "$work/other.csv" "$work/png2" 2> "$work/err.txt"; then
  echo "FAILED: a CSV that is not ddp_bench's was accepted"; exit 1
else
  rc=$?
fi
[[ $rc == 2 && $(wc -l < "$work/err.txt") == 1 ]] && grep -q "is not a ddp_bench CSV" "$work/err.txt" ||
  { echo "FAILED: expected exit 2 and one line, got $rc:"; cat "$work/err.txt"; exit 1; }
echo "OK: throughput_lenet.png and breakdown_lenet.png written; a foreign CSV refused"
