#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) into build-fuzz/ and runs each for a bounded time.
#   scripts/fuzz.sh [-t SECONDS] [TARGET...]     targets: idx cifar10 checkpoint (the readers, with
#                                                LibTorch), hostfile ddp_env rdzv_conf environment
#                                                agent_datagram store_values (torch-free); default: all
#   -t SECONDS / DDP_FUZZ_SECONDS: time per target (default 60).
# Seeds come from real data (fuzz_seeds: Fashion-MNIST cut small, CIFAR-10 records, a real checkpoint);
# the corpus grows in build-fuzz/corpus/<target>/ from run to run. A crash input is copied to
# tests/fuzz/regressions/<target>/ (commit it: test_fuzz_regressions feeds it to the gcc build in
# CI), and the script exits 1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$DDP_ROOT/scripts/sanitizers.sh"

seconds=${DDP_FUZZ_SECONDS:-60}
targets=()
while (($#)); do
  case $1 in
    -t) seconds=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    idx|cifar10|checkpoint|hostfile|ddp_env|rdzv_conf|environment|agent_datagram|store_values) targets+=("$1"); shift ;;
    *) ddp_die "unknown argument '$1' (targets: idx cifar10 checkpoint hostfile ddp_env rdzv_conf environment agent_datagram store_values; -t SECONDS)" ;;
  esac
done
((${#targets[@]})) || targets=(idx cifar10 checkpoint hostfile ddp_env rdzv_conf environment agent_datagram store_values)
# The checkpoint's seeds need fuzz_seeds (LibTorch: a long clang build); the other targets' do not.
seed_tool=fuzz_launcher_seeds
for target in "${targets[@]}"; do
  [[ $target != checkpoint ]] || seed_tool=fuzz_seeds
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || ddp_die "-t wants a whole number of seconds, not '$seconds'"

"$DDP_ROOT/scripts/setup.sh" --fuzz
build=${DDP_FUZZ_BUILD_DIR:-$DDP_ROOT/build-fuzz}
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$DDP_ROOT} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
fi
generator=()
[[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null && generator=(-G Ninja)
# clang's warnings differ from gcc's: they are not errors here (the gcc build keeps -Werror).
cmake -S "$DDP_ROOT" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_PREFIX_PATH="$(ddp_torch_prefix)" "${launcher[@]}" \
  -DDDP_BUILD_FUZZERS=ON -DDDP_SANITIZE="address;undefined" -DDDP_WARNINGS_AS_ERRORS=OFF \
  -DDDP_BUILD_BENCHMARKS=OFF -DDDP_INSTALL=OFF >/dev/null
cmake --build "$build" --parallel "${DDP_JOBS:-$(nproc)}" --target "$seed_tool" "${targets[@]/#/fuzz_}"

ddp_export_sanitizer_options
# Scratch files of the inputs on tmpfs when there is one (the checkpoint entry fsyncs).
scratch_root=/dev/shm
[[ -d $scratch_root && -w $scratch_root ]] || scratch_root=$build
export TMPDIR=$(mktemp -d "$scratch_root/ddp-fuzz-XXXXXX")
trap 'rm -rf "$TMPDIR"' EXIT
export OMP_NUM_THREADS=1

seeds=$build/seeds
rm -rf "$seeds"
if [[ $seed_tool == fuzz_seeds ]]; then
  "$build/bin/fuzz_seeds" "$seeds" /usr/share/datasets/fashion-mnist
else
  "$build/bin/fuzz_launcher_seeds" "$seeds" /usr/share/datasets/fashion-mnist
fi

found=0
summary=()
for target in "${targets[@]}"; do
  corpus=$build/corpus/$target
  artifacts=$build/artifacts/$target
  log=$build/fuzz-$target.log
  mkdir -p "$corpus" "$artifacts"
  rm -f "$artifacts"/*
  regressions=$DDP_ROOT/tests/fuzz/regressions/$target
  inputs=("$corpus" "$seeds/$target")
  [[ -d $regressions ]] && inputs+=("$regressions")
  echo "fuzz: $target for ${seconds} s (log: $log)"
  # New inputs go to the first folder only; a crash ends the run with a non-zero status.
  rc=0
  "$build/bin/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/" "${inputs[@]}" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  crashes=0
  for artifact in "$artifacts"/*; do
    [[ -f $artifact ]] || continue
    mkdir -p "$regressions"
    cp "$artifact" "$regressions/"
    echo "fuzz: $target: $(basename "$artifact") copied to tests/fuzz/regressions/$target/ (commit it; reproduce: $build/bin/fuzz_$target $regressions/$(basename "$artifact"))"
    crashes=$((crashes + 1))
  done
  if ((rc != 0 && crashes == 0)); then
    echo "fuzz: $target exited with $rc and left no crash input: see $log"
    crashes=1
  fi
  ((crashes)) && grep -m5 -E "ERROR|runtime error|terminate|SUMMARY" "$log" | sed "s/^/fuzz: $target: /" || true
  found=$((found + crashes))
  summary+=("$(printf '%-11s %6s s %12s runs %9s runs/s %6s corpus %3s crashes' "$target" "$seconds" \
    "${runs:-?}" "${rate:-?}" "$(find "$corpus" -type f | wc -l)" "$crashes")")
done
printf 'fuzz: %s\n' "${summary[@]}"
((found == 0)) || { echo "fuzz: $found crash input(s) found"; exit 1; }
