#!/usr/bin/env bash
# Soak: the suite ROUNDS times at -j2 (DDP_TEST_JOBS) beside a CPU hog that keeps one core busy,
# and each test's pass count. A flake shows as a count below the runs; its round's log is kept.
#   scripts/soak.sh ROUNDS [ctest arguments]      e.g. scripts/soak.sh 10
#                                                      scripts/soak.sh 50 -L 'multiprocess|hosts|faults'
# Runs in the build folder that scripts/build.sh made (DDP_BUILD_DIR); builds nothing. Writes
# $DDP_BUILD_DIR/soak/counts.tsv (test, runs, passed, failed, skipped) and round-N.log for each
# round that had a failure.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || ddp_die "usage: scripts/soak.sh ROUNDS [ctest arguments] (ROUNDS: a whole number >= 1)"
shift
[[ -f $DDP_BUILD_DIR/CTestTestfile.cmake ]] || ddp_die "no build at $DDP_BUILD_DIR: run scripts/build.sh first"
out=$DDP_BUILD_DIR/soak
rm -rf "$out" && mkdir -p "$out"

# The hog: a busy loop in a process of its own, stopped however this script ends.
( trap 'exit 0' TERM; while :; do :; done ) &
hog=$!
trap 'kill "$hog" 2>/dev/null || true' EXIT

# One line per test and round: "name<TAB>Passed|Failed|Skipped" (ctest's "Not Run" counts as failed:
# a test whose binary is missing did not pass).
results=$out/results
: >"$results"
for ((round = 1; round <= rounds; ++round)); do
  log=$out/round-$round.log
  started=$SECONDS
  status=0
  (cd "$DDP_BUILD_DIR" && ctest --output-on-failure --parallel "${DDP_TEST_JOBS:-2}" "$@") >"$log" 2>&1 || status=$?
  sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.*[ *]*(Passed|Failed|Skipped|Not Run|Timeout|Exception).*/\1\t\2/p' "$log" |
    sed -E 's/\t(Not Run|Timeout|Exception)$/\tFailed/' >>"$results"
  failed=$(sed -nE 's/^[[:space:]]*[0-9]+ - ([^ ]+) \((Failed|Not Run|Timeout|Exception).*/\1/p' "$log" | paste -sd ' ' -)
  echo "round $round of $rounds: $((SECONDS - started)) s, ctest exit $status${failed:+, failed: $failed}"
  if [[ $status -eq 0 ]]; then rm -f "$log"; fi
done

{
  printf 'test\truns\tpassed\tfailed\tskipped\n'
  awk -F'\t' '{ runs[$1]++; n[$1, $2]++ }
    END { for (t in runs) printf "%s\t%d\t%d\t%d\t%d\n", t, runs[t], n[t, "Passed"], n[t, "Failed"], n[t, "Skipped"] }' \
    "$results" | sort
} >"$out/counts.tsv"
flaky=$(awk -F'\t' 'NR > 1 && $4 > 0 { printf "%s (%d of %d failed) ", $1, $4, $2 }' "$out/counts.tsv")
echo "soak: $rounds rounds, $(($(wc -l <"$out/counts.tsv") - 1)) tests; counts in $out/counts.tsv"
if [[ -n $flaky ]]; then
  echo "soak: FAILED: $flaky(logs: $out/round-N.log)"
  exit 1
fi
echo "soak: every test passed every run it had"
