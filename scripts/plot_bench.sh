#!/usr/bin/env bash
# Turns ddp_bench CSV (one file, rows of any number of runs, e.g. from scripts/bench_sweep.sh) into PNG
# charts with gnuplot (Debian's gnuplot-nox, installed here when missing):
#   <out>/throughput_<model>.png  samples/s against world size (or device count), one line per mode/batch
#   <out>/breakdown_<model>.png  step time split into data, forward, backward compute, comm wait and
#                         optimizer (stacked bars, one per configuration)
# Usage: scripts/plot_bench.sh RESULTS.csv [OUT_DIR (default: the CSV's folder)]
set -euo pipefail
csv=${1:?usage: scripts/plot_bench.sh RESULTS.csv [OUT_DIR]}
out=${2:-$(dirname "$csv")}
[[ -s $csv ]] || { echo "plot_bench: $csv is missing or empty" >&2; exit 2; }
head -1 "$csv" | grep -q '^model,data,mode,world_size,devices,batch_per_rank' ||
  { echo "plot_bench: $csv is not a ddp_bench CSV (its header must start with model,data,mode,world_size,...)" >&2; exit 2; }
if ! command -v gnuplot > /dev/null; then
  echo "plot_bench: installing gnuplot-nox" >&2
  apt-get install -y -q gnuplot-nox > /dev/null || { echo "plot_bench: cannot install gnuplot-nox (run as root, or install it)" >&2; exit 1; }
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Column numbers by name, so the script survives new columns.
col() { head -1 "$csv" | tr ',' '\n' | grep -nx "$1" | cut -d: -f1; }
c_model=$(col model) c_mode=$(col mode) c_ws=$(col world_size) c_dev=$(col devices) c_batch=$(col batch_per_rank)
c_sps=$(col samples_per_s) c_data=$(col data_ms) c_fwd=$(col forward_ms) c_bwd=$(col backward_compute_ms)
c_comm=$(col comm_wait_ms) c_opt=$(col optimizer_ms)

# Throughput: one data file per model/mode/batch series, x = ranks (ddp) or devices (single, dp); the
# median when a configuration appears several times (alternated rounds).
tail -n +2 "$csv" | awk -F, -v m="$c_model" -v o="$c_mode" -v w="$c_ws" -v d="$c_dev" -v b="$c_batch" -v s="$c_sps" '
  { x = ($o == "ddp") ? $w : $d; key = $m " " $o " b" $b; k = key SUBSEP x; n[k]++; v[k, n[k]] = $s; keys[key]; xs[k] = x }
  END {
    for (k in n) {
      split(k, parts, SUBSEP); cnt = n[k];
      for (i = 1; i <= cnt; i++) a[i] = v[k, i];
      for (i = 1; i <= cnt; i++) for (j = i + 1; j <= cnt; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      med = (cnt % 2) ? a[(cnt + 1) / 2] : (a[cnt / 2] + a[cnt / 2 + 1]) / 2;
      print parts[1] "\t" xs[k] "\t" med
    }
  }' | sort -t$'\t' -k1,1 -k2,2n > "$work/series.tsv"
charts=""
for model in $(cut -d' ' -f1 "$work/series.tsv" | sort -u); do
  plots=""
  while IFS= read -r name; do
    file="$work/series_$(echo "$name" | tr ' /' '__').dat"
    awk -F'\t' -v n="$name" '$1 == n { print $2, $3 }' "$work/series.tsv" > "$file"
    plots+="${plots:+, }'$file' using 1:2 with linespoints lw 2 pt 7 title '$name'"
  done < <(cut -f1 "$work/series.tsv" | sort -u | grep "^$model ")
  gnuplot <<GP
set terminal pngcairo size 1000,600 font 'sans,11'
set output '$out/throughput_$model.png'
set title 'ddp\_bench $model: samples/s against world size (ddp) or device count (single, dp)' noenhanced
set xlabel 'ranks / devices'
set ylabel 'samples/s (all ranks)'
set xtics 1
set offsets 0.2, 0.2, 0, 0
set key outside right top noenhanced
set grid
set yrange [0:*]
plot $plots
GP
  charts+=" $out/throughput_$model.png"
done

# Breakdown: one chart per model (their step times differ by orders of magnitude), one stacked bar per
# configuration (the last row of a repeated configuration wins).
for model in $(tail -n +2 "$csv" | cut -d, -f"$c_model" | sort -u); do
  tail -n +2 "$csv" | awk -F, -v want="$model" -v m="$c_model" -v o="$c_mode" -v w="$c_ws" -v b="$c_batch" \
    -v d1="$c_data" -v d2="$c_fwd" -v d3="$c_bwd" -v d4="$c_comm" -v d5="$c_opt" '
    $m == want { key = $o "/ws" $w "/b" $b; if (!(key in row)) order[++n] = key; row[key] = $d1 " " $d2 " " $d3 " " $d4 " " $d5 }
    END { for (i = 1; i <= n; i++) print "\"" order[i] "\"", row[order[i]] }' > "$work/breakdown.dat"
  gnuplot <<GP
set terminal pngcairo size 1000,600 font 'sans,11'
set output '$out/breakdown_$model.png'
set title 'ddp\_bench $model: step time breakdown (ms per step, mean of the timed iterations)' noenhanced
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.7
set ylabel 'ms per step'
set xlabel 'mode / world size / batch per rank'
set xtics rotate by -30 noenhanced
set key outside right top
set grid ytics
set yrange [0:*]
plot '$work/breakdown.dat' using 2:xtic(1) title 'data', '' using 3 title 'forward', \
     '' using 4 title 'backward compute', '' using 5 title 'comm wait', '' using 6 title 'optimizer'
GP
  charts+=" $out/breakdown_$model.png"
done
echo "plot_bench: wrote$charts"
