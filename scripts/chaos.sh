#!/usr/bin/env bash
# Chaos trials on the namespace hosts (tests/hosts/chaos_test.sh; root): TRIALS seeds from FIRST
# (default 1; odd seeds --recovery live, even ones restart-based rounds), each trial's line and the
# failed trials' logs under $DDP_BUILD_DIR/chaos/, then the table of docs/faults.md: trials by
# recovery and fault, passed (every check of the policy held, the bound included), failed.
#   scripts/chaos.sh TRIALS [FIRST]        e.g. scripts/chaos.sh 200
# Runs in the build folder that scripts/build.sh made; builds nothing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
trials=${1:-} first=${2:-1}
[[ $trials =~ ^[1-9][0-9]*$ && $first =~ ^[0-9]+$ ]] ||
  ddp_die "usage: scripts/chaos.sh TRIALS [FIRST] (whole numbers: the count of trials, the first seed)"
bin=$DDP_BUILD_DIR/bin
[[ -x $bin/ddp_launch && -x $bin/live_recovery_demo ]] || ddp_die "no ddp_launch or live_recovery_demo in $bin: run scripts/build.sh first"
out=$DDP_BUILD_DIR/chaos
rm -rf "$out" && mkdir -p "$out"
export CHAOS_RESULTS=$out/results
: >"$CHAOS_RESULTS"
failed=()
for ((seed = first; seed < first + trials; ++seed)); do
  status=0
  BED_KEEP_FAILED=$out/seed-$seed timeout -s KILL 300 "$DDP_ROOT/tests/hosts/chaos_test.sh" "$DDP_ROOT/scripts/netns-cluster.sh" \
    "$bin/ddp_launch" "$bin/live_recovery_demo" "$seed" >"$out/seed-$seed.log" 2>&1 || status=$?
  ((status != 77)) || ddp_die "$(tail -1 "$out/seed-$seed.log")"
  if ((status == 0)); then
    tail -1 "$out/seed-$seed.log"
    rm -f "$out/seed-$seed.log"
  else
    failed+=("$seed")
    why=$(grep -m 1 '^FAIL' "$out/seed-$seed.log" || tail -1 "$out/seed-$seed.log")
    echo "chaos seed $seed: FAILED (exit $status): $why"
    read -r kind mode < <(sed -n -E 's/^FAIL \(chaos seed [0-9]+, ([a-z]+), ([a-z]+)\).*/\1 \2/p' <<<"$why")
    echo "$seed - ${kind:-unknown} - failed - ${mode:-unknown}" >>"$CHAOS_RESULTS"
  fi
done
echo
# A trial passes when every check of its policy held (chaos_test.sh): the bound, the training, nothing left.
echo "| recovery | fault | trials | passed | the job went on | the job ended as its policy says, naming why | failed |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
awk '{ k = $7 " | " $3; n[k]++; p[k] += $5 != "failed"; s[k] += $5 == "survived"; e[k] += $5 == "failed-as-expected"; f[k] += $5 == "failed" }
  END { for (k in n) printf "| %s | %d | %d | %d | %d | %d |\n", k, n[k], p[k], s[k], e[k], f[k] }' "$CHAOS_RESULTS" | sort
echo "chaos: $trials trials from seed $first, $((trials - ${#failed[@]})) passed${failed:+, failed: ${failed[*]} (logs: $out/seed-N.log)}"
((${#failed[@]} == 0))
