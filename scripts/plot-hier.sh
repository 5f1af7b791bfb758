#!/usr/bin/env bash
# Plots the all-reduce bus bandwidth against the link rate, one line per algorithm and layout, from
# the CSV files of scripts/bench-hier.sh (allreduce-RATE-HxL.csv), at one message size:
#   scripts/plot-hier.sh [IN_DIR (default build/bench-hier) [OUT.svg (default IN_DIR/busbw.svg) [BYTES (16777216)]]]
# busbw = bytes / time * 2 (n - 1) / n (nccl-tests' definition, the per-link rate a flat ring needs
# to be this fast), in Mb/s. Needs gnuplot (Debian's gnuplot-nox). Prints the table it plots.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
in=${1:-$DDP_BUILD_DIR/bench-hier}
out=${2:-$in/busbw.svg}
bytes=${3:-16777216}
command -v gnuplot >/dev/null || ddp_die "plot-hier: gnuplot is missing (apt-get install gnuplot-nox)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
shopt -s nullglob
files=("$in"/allreduce-*x*.csv)
((${#files[@]})) || ddp_die "plot-hier: no allreduce-RATE-HxL.csv in $in (run scripts/bench-hier.sh)"
for csv in "${files[@]}"; do
  base=$(basename "$csv" .csv)
  rate=${base#allreduce-}
  layout=${rate##*-}
  rate=${rate%-*}
  case $rate in
    *gbit) mbps=$((${rate%gbit} * 1000)) ;;
    *mbit) mbps=${rate%mbit} ;;
    *) continue ;;
  esac
  # size,count,...,busbw_GBps (9),correct,algorithm (11): one line per algorithm.
  awk -F, -v size="$bytes" -v mbps="$mbps" -v layout="$layout" -v dir="$work" '
    NR > 1 && $1 == size {
      algorithm = $11
      # One host carries nothing over its link; auto on 2x1 is the flat algorithm again.
      if (layout !~ /^1x/ && algorithm !~ /^auto:/) printf "%d %.1f\n", mbps, $9 * 8000 >> (dir "/" layout "-" algorithm ".dat")
      printf "%-5s %-12s %6d Mb/s  busbw %8.1f Mb/s  time %8.0f ms\n", layout, algorithm, mbps, $9 * 8000, $7 / 1000
    }' "$csv"
done
plots=()
for dat in "$work"/*.dat; do
  sort -n -o "$dat" "$dat"
  title=$(basename "$dat" .dat)
  plots+=("'$dat' using 1:2 with linespoints title '${title/-/ }'")
done
gnuplot <<GNUPLOT
set terminal svg size 720,440 dynamic font "sans,12"
set output '$out'
set title "16 MiB all-reduce on namespace hosts: bus bandwidth against link rate"
set xlabel "link rate per host (Mb/s, tc tbf)"
set ylabel "busbw (Mb/s) = bytes/time * 2(n-1)/n"
set logscale xy
set key top left
set grid
plot $(IFS=,; echo "${plots[*]}"), x title 'link rate' dashtype 2
GNUPLOT
echo "plot-hier: wrote $out"
