#!/usr/bin/env bash
# A joiner's healing throughput on shaped namespace hosts, side by side: FaultTolerant's chunks from
# every holder (FaultTolerantOptions::Healing::kFromPeers) against one broadcast from the source (as
# before); docs/faults.md, "Healing at link speed", Note [Healing at link speed]:
#   scripts/bench-heal.sh [SIZES_MIB] [RATES] [MEMBERS]     (default: 64,512,2048 1gbit,100mbit 2)
# MEMBERS processes (build/bin/heal_bench, one per host) start on an unshaped bed and train a model
# holding SIZE MiB of state; then every link is shaped to RATE both ways (tc tbf on each host's eth0
# and on the switch's port towards it: a full-duplex link) and a process on one more host joins and
# receives the state. Prints one line per run: the joiner's time from its group built to the state
# loaded, its throughput and the share of the link's rate. Every wait is bounded; the hosts and every
# process in them go away on exit.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

sizes=${1:-64,512,2048}
rates=${2:-1gbit,100mbit}
members=${3:-2}
cluster=$DDP_ROOT/scripts/netns-cluster.sh
bin=$DDP_BUILD_DIR/bin
reason=$("$cluster" check) || { echo "bench-heal.sh: $reason" >&2; exit 2; }
[[ -x $bin/heal_bench ]] || { echo "bench-heal.sh: $bin/heal_bench is missing: DDP_BUILD_TARGETS=heal_bench scripts/build.sh" >&2; exit 2; }
[[ $members =~ ^[1-9]$ ]] || { echo "bench-heal.sh: MEMBERS must be 1 to 9, got '$members'" >&2; exit 2; }
name="bheal$$"
work=$(mktemp -d)
cleanup() {
  "$cluster" down "$name"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM
echo "command: scripts/bench-heal.sh $sizes $rates $members"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); load: $(uptime); git: $(git -C "$DDP_ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
export OMP_NUM_THREADS=1
hosts=$((members + 1))
"$cluster" up "$name" "$hosts"

bits_of() {  # bits_of RATE: bits per second of tc's 1gbit, 100mbit, ...
  awk -v r="$1" 'BEGIN { n = r + 0; u = tolower(substr(r, length(n "") + 1));
    m = (u == "gbit") ? 1e9 : (u == "mbit") ? 1e6 : (u == "kbit") ? 1e3 : 1; printf "%.0f", n * m }'
}

shape_all() {  # shape_all RATE|none: every host's link, both ways
  local k burst
  for ((k = 0; k < hosts; k++)); do
    if [[ $1 == none ]]; then
      ip netns exec "$name-h$k" tc qdisc del dev eth0 root 2>/dev/null || true
      ip netns exec "$name-sw" tc qdisc del dev "p$k" root 2>/dev/null || true
    else
      # 2 ms of the rate, at least 256 KB (See Note [tbf burst] in scripts/netns-cluster.sh).
      burst=$(awk -v b="$(bits_of "$1")" 'BEGIN { x = b / 8 * 0.002; if (x < 262144) x = 262144; printf "%d", x }')
      ip netns exec "$name-h$k" tc qdisc replace dev eth0 root tbf rate "$1" burst "$burst" latency 400ms
      ip netns exec "$name-sw" tc qdisc replace dev "p$k" root tbf rate "$1" burst "$burst" latency 400ms
    fi
  done
}

wait_for() {  # wait_for SECONDS FILE TEXT
  local deadline=$((SECONDS + $1))
  until grep -q -F "$3" "$2" 2>/dev/null; do
    ((SECONDS < deadline)) || { echo "no '$3' in $2 within $1 s:" >&2; tail -n 5 "$work"/*.log >&2; return 1; }
    sleep 0.1
  done
}

port=29600
run_once() {  # run_once RATE SIZE MODE: prints "transfer_seconds bytes senders loaded_seconds"
  local rate=$1 size=$2 mode=$3 k bound pids=() timeout_s
  port=$((port + 1))
  # The group's timeout: 60 s per chunk for peers; the old broadcast is bounded as a whole by it, so
  # it gets the transfer of the whole state to every rank, twice over (with 60 s it fails from 512
  # MiB on 100 Mb/s: docs/faults.md).
  timeout_s=60
  [[ $mode != broadcast ]] ||
    timeout_s=$(awk -v s="$size" -v b="$(bits_of "$rate")" -v m="$members" 'BEGIN { t = s * 8388608 / b * m * 2; printf "%d", t < 60 ? 60 : t }')
  rm -f "$work"/*.log
  shape_all none
  for ((k = 0; k < members; k++)); do
    "$cluster" exec "$name" "$k" timeout -s KILL 1500 "$bin/heal_bench" --store "host0:$port" --members "$members" \
      --addr "$("$cluster" addr "$name" "$k")" \
      --rank "$k" --state-mib "$size" --healing "$mode" --timeout-s "$timeout_s" >"$work/member$k.log" 2>&1 &
    pids+=($!)
    ((k > 0)) || sleep 0.5
  done
  for ((k = 0; k < members; k++)); do wait_for 300 "$work/member$k.log" "heal_bench: member $k trains" || return 1; done
  shape_all "$rate"
  # The transfer at the rate, three times over (broadcast to every rank), plus a minute.
  bound=$(awk -v s="$size" -v b="$(bits_of "$rate")" -v m="$members" 'BEGIN { printf "%d", s * 8388608 / b * (m + 1) * 3 + 60 }')
  "$cluster" exec "$name" "$members" timeout -s KILL "$bound" "$bin/heal_bench" --store "host0:$port" \
    --addr "$("$cluster" addr "$name" "$members")" \
    --members "$members" --join --state-mib "$size" --healing "$mode" --timeout-s "$timeout_s" >"$work/joiner.log" 2>&1 || true
  # The members end with the joiner's last step: a minute, then whatever is left is killed.
  local deadline=$((SECONDS + 60))
  while (($(jobs -pr | wc -l) > 0)) && ((SECONDS < deadline)); do sleep 0.2; done
  for ((k = 0; k <= members; k++)); do
    # shellcheck disable=SC2046  # one pid a word
    kill -KILL $(ip netns pids "$name-h$k") 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  sed -n -E 's/^heal: ([0-9]+) bytes from ([0-9]+) rank\(s\) in ([0-9.]+) s, loaded ([0-9.]+) s.*/\3 \1 \2 \4/p' "$work/joiner.log" | head -n 1 |
    grep . || { echo "the joiner printed no figure:" >&2; tail -n 5 "$work"/*.log >&2; return 1; }
}

IFS=, read -r -a size_list <<<"$sizes"
IFS=, read -r -a rate_list <<<"$rates"
for rate in "${rate_list[@]}"; do
  for size in "${size_list[@]}"; do
    for mode in peers broadcast; do
      if value=$(run_once "$rate" "$size" "$mode"); then
        read -r seconds bytes senders loaded <<<"$value"
        awk -v r="$rate" -v s="$size" -v m="$mode" -v t="$seconds" -v b="$bytes" -v k="$senders" -v l="$loaded" \
          -v bits="$(bits_of "$rate")" 'BEGIN { printf "%s, %d MiB, %-9s from %d rank(s): transfer %.2f s, %.1f MB/s, %.0f%% of the link; loaded and checked after %.2f s\n", r, s, m, k, t, b / t / 1e6, 100 * b * 8 / t / bits, l }'
      else
        echo "$rate, $size MiB, $mode: failed"
      fi
    done
  done
done
echo "load at the end: $(uptime)"
