#!/usr/bin/env bash
# Cold builds of every target, side by side in one run: each configuration is configured and built
# from nothing into a scratch folder without ccache, one after the other (DDP_JOBS, default 2), then
# one library source is touched and rebuilt. Prints, per configuration, the wall time, the summed
# unit times and the ten slowest units (from .ninja_log), as Markdown.
#   scripts/cold_build_times.sh                 this round's two: "before" (one unit per source, tests
#                                               at the build type's -O3) and "after" (the defaults)
#   scripts/cold_build_times.sh 'NAME=-DX=Y -DZ=W' ...   configurations of your own
# Figures: docs/benchmarks.md, "Building". Needs the venv (scripts/setup.sh) and about 2 GB of disk
# per configuration; nothing else may run meanwhile, or the figures say little.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

configs=("$@")
((${#configs[@]})) || configs=("before=-DDDP_UNITY_BUILD=OFF -DDDP_TESTS_AT_O1=OFF" "after=")
touched=ddp/parallel/detail/reducer.cpp
scratch=$(mktemp -d /tmp/ddp_cold_build.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

report=$scratch/report.md
for config in "${configs[@]}"; do
  [[ $config == *=* ]] || ddp_die "configuration '$config' is not NAME=CMAKE_ARGS (e.g. 'before=-DDDP_UNITY_BUILD=OFF')"
  name=${config%%=*} args=${config#*=}
  dir=$scratch/$name
  start=$(date +%s.%N)
  # shellcheck disable=SC2086  # the arguments are CMake options separated by spaces
  DDP_BUILD_DIR=$dir DDP_NO_CCACHE=1 DDP_JOBS=${DDP_JOBS:-2} "$DDP_ROOT/scripts/build.sh" $args >"$scratch/$name.log" 2>&1 \
    || { tail -20 "$scratch/$name.log" >&2; ddp_die "the '$name' build failed (its log above)"; }
  end=$(date +%s.%N)
  cp "$dir/.ninja_log" "$scratch/$name.ninja_log"   # the cold build's unit times, before the rebuild's
  touch "$DDP_ROOT/$touched"
  rebuild_start=$(date +%s.%N)
  steps=$(cmake --build "$dir" --parallel "${DDP_JOBS:-2}" | grep -c '^\[' || true)
  rebuild_end=$(date +%s.%N)
  {
    echo "### $name (${args:-the defaults})"
    echo
    python3 - "$scratch/$name.ninja_log" "$start" "$end" "$rebuild_start" "$rebuild_end" "$steps" "$touched" <<'PY'
import sys
log, start, end, rstart, rend, steps, touched = sys.argv[1:]
units = {}
for line in open(log):
    if line.startswith("#"):
        continue
    begin, finish, _, output, _ = line.rstrip("\n").split("\t")
    units[output] = (int(finish) - int(begin)) / 1000
compiled = {o: t for o, t in units.items() if o.endswith((".o", ".gch"))}
print(f"- cold build: {float(end) - float(start):.0f} s wall; {len(compiled)} units and headers, "
      f"{sum(compiled.values()):.0f} s summed; {len(units)} steps")
print(f"- touching {touched}, then building: {float(rend) - float(rstart):.1f} s, {steps} steps")
print()
print("| unit | s |")
print("| --- | --- |")
for output, seconds in sorted(compiled.items(), key=lambda kv: -kv[1])[:10]:
    print(f"| {output} | {seconds:.1f} |")
print()
PY
  } >>"$report"
  rm -rf "$dir"
done
cat "$report"
