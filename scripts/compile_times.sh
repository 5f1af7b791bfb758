#!/usr/bin/env bash
# Times translation units with and without the precompiled LibTorch header, side by side in one run
# (Note [Precompiled LibTorch headers] in cmake/DdpPrecompiled.cmake); prints a Markdown table.
#   scripts/compile_times.sh [SOURCE...]    sources relative to the checkout; default: the ten slowest
#                                           units of a build without the header (docs/benchmarks.md)
# Needs a configured build with DDP_PRECOMPILED_HEADERS=ON and compile_commands.json (scripts/build.sh
# -DCMAKE_EXPORT_COMPILE_COMMANDS=ON). Compiles into a scratch folder, never through ccache; two
# units at a time on 2 cores (DDP_JOBS).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

commands=$DDP_BUILD_DIR/compile_commands.json
[[ -f $commands ]] || ddp_die "no $commands: configure with scripts/build.sh -DCMAKE_EXPORT_COMPILE_COMMANDS=ON"
sources=("$@")
if ((${#sources[@]} == 0)); then
  sources=(examples/models/lenet.cpp examples/data/image_dataset.cpp ddp/checkpoint/detail/torch_zip.cpp
           ddp/checkpoint/state_dict.cpp ddp/checkpoint/detail/trainer_state.cpp examples/train_options.cpp
           examples/train_common.cpp ddp/algorithms/powersgd.cpp ddp/elastic/fault_tolerant.cpp
           ddp/optim/zero_redundancy_optimizer.cpp)
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# One unit: "<seconds without> <seconds with>"; the compile command comes from compile_commands.json.
time_unit() {
  local source=$1 out=$2 command
  command=$("$DDP_PYTHON_FOR_SCRIPTS" - "$commands" "$DDP_ROOT/$source" <<'PY'
import json, sys
for entry in json.load(open(sys.argv[1])):
    if entry["file"] == sys.argv[2]:
        print(entry["command"]); break
PY
)
  [[ -n $command ]] || { echo "- -" >"$out"; return; }
  [[ $command == *cmake_pch.hxx* ]] || { echo "- -" >"$out"; return; }
  local with=${command/ -o */ -o $out.o -c $DDP_ROOT/$source}
  local without
  without=$(sed 's# -include [^ ]*cmake_pch.hxx##' <<<"$with")
  local start end a b
  start=$(date +%s.%N); (cd "$DDP_BUILD_DIR" && eval "$without") >/dev/null 2>&1; end=$(date +%s.%N)
  a=$(awk -v s="$start" -v e="$end" 'BEGIN { print e - s }')
  start=$(date +%s.%N); (cd "$DDP_BUILD_DIR" && eval "$with") >/dev/null 2>&1; end=$(date +%s.%N)
  b=$(awk -v s="$start" -v e="$end" 'BEGIN { print e - s }')
  echo "$a $b" >"$out"
}
DDP_PYTHON_FOR_SCRIPTS=$(command -v python3)
jobs=${DDP_JOBS:-2}
i=0
for source in "${sources[@]}"; do
  time_unit "$source" "$scratch/$i" &
  i=$((i + 1))
  (( i % jobs == 0 )) && wait
done
wait
echo "| translation unit | without (s) | with (s) | with / without |"
echo "| --- | --- | --- | --- |"
i=0
total_a=0 total_b=0
for source in "${sources[@]}"; do
  read -r a b <"$scratch/$i"
  i=$((i + 1))
  if [[ $a == - ]]; then echo "| $source | (no precompiled header) | | |"; continue; fi
  awk -v s="$source" -v a="$a" -v b="$b" 'BEGIN { printf "| %s | %.1f | %.1f | %.2f |\n", s, a, b, b / a }'
  total_a=$(awk -v t="$total_a" -v a="$a" 'BEGIN { print t + a }'); total_b=$(awk -v t="$total_b" -v b="$b" 'BEGIN { print t + b }')
done
awk -v a="$total_a" -v b="$total_b" 'BEGIN { printf "| all | %.1f | %.1f | %.2f |\n", a, b, b / a }'
