#!/usr/bin/env bash
# A cluster of N "hosts" on this machine, for tests that need real hosts (docs/hosts.md):
#   netns-cluster.sh up NAME N [--rate R] [--delay D] [--loss L] [--shape K:R:D:L]...
#   netns-cluster.sh exec NAME K COMMAND...     run COMMAND on host K (its network, hostname, /etc/hosts)
#   netns-cluster.sh addr NAME K                print host K's address
#   netns-cluster.sh down NAME                  remove everything `up NAME` made (idempotent)
#   netns-cluster.sh check                      exit 0 when this user may make namespaces, else print why
# Host K is the network namespace NAME-hK with one interface eth0 (198.18.0.(K+1)/24, from the
# range reserved for network benchmarks, RFC 2544), whose veth peer sits on a bridge inside a
# namespace NAME-sw of its own: nothing is added to this machine's namespace, there is no default
# route and no uplink, so traffic never leaves the machine. Each host has a UTS namespace with the
# hostname hostK and an /etc/hosts as on a stock Debian host (hostK -> 127.0.1.1) plus every other
# host's name and address. --rate/--delay/--loss shape every host's link (e.g. 100mbit, 1ms, 1%): with
# tc netem where the kernel has sch_netem; else the rate with tbf and the delay and loss on the
# host's incoming packets by link_delay (tests/hosts/link_delay.cpp, Note [A delay line without
# netem]; found at $DDP_LINK_DELAY or build/bin/link_delay, with iptables); a rate alone uses tbf.
# --shape K:RATE:DELAY:LOSS shapes one host's (empty fields: unshaped). NAME (letters and digits) is
# unique per test run: the tests use a prefix and their pid, so runs go in parallel.
set -euo pipefail

subnet=198.18.0
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run_root=/run/netns-cluster  # per host: the delay line's pid file and log

die() {
  echo "netns-cluster.sh: $*" >&2
  [[ -n ${cleanup_name:-} ]] && down "$cleanup_name"
  exit 2
}

address_of() { echo "$subnet.$(($1 + 1))"; }

check() {  # everything `up` and `exec` need, tried on a throw-away namespace
  if ! command -v ip >/dev/null || ! command -v unshare >/dev/null || ! command -v ss >/dev/null; then
    echo "ip and ss (iproute2) and unshare (util-linux) are needed"
    return 1
  fi
  local probe="ddpcheck$$" problem=""
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "cannot create network namespaces (needs root, or CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    return 1
  fi
  if ! ip -n "$probe" link add br0 type bridge 2>/dev/null ||
    ! ip -n "$probe" link add eth0 type veth peer name p0 2>/dev/null; then
    problem="cannot create bridges or veth pairs in a namespace (kernel modules bridge, veth)"
  elif ! ip netns exec "$probe" unshare --uts true 2>/dev/null; then
    problem="cannot enter a namespace with a UTS namespace of its own (ip netns exec, unshare --uts)"
  elif ! mkdir -p /etc/netns 2>/dev/null || [[ ! -w /etc/netns ]]; then
    problem="cannot write /etc/netns (each host's hosts and hostname files)"
  fi
  ip netns del "$probe"
  [[ -z $problem ]] || echo "$problem"
  [[ -z $problem ]]
}

# Note [tbf burst]
# ~~~~~~~~~~~~~~~~
# tbf lets a host send at most `burst` bytes at once. The veth hands it segments of up to 64 KB
# (GSO), so a bucket of 64 kB holds one of them and the link idles while it refills: at 1 Gb/s
# all-reduce reached 16-43% of the rate (2 and 4 hosts) with 64kb and 88-96% with 256 KB to 1 MB
# (Gloo's and ours alike; at 100 Mb/s 91-92% against 94-95%). The bucket holds four segments, or
# 2 ms of the rate where that is more (1 Gb/s: 250 KB; 10 Gb/s: 2.5 MB).
tbf_burst() {  # tbf_burst RATE: bytes, for tc's rate units (bit, kbit, mbit, gbit, tbit, bps, kbps, ...)
  awk -v rate="$1" 'BEGIN {
    bits = -1
    if (match(rate, /^[0-9.]+/)) {
      n = substr(rate, 1, RLENGTH) + 0; unit = tolower(substr(rate, RLENGTH + 1))
      split("bit kbit mbit gbit tbit bps kbps mbps gbps tbps", names, " ")
      split("1 1e3 1e6 1e9 1e12 8 8e3 8e6 8e9 8e12", factors, " ")
      for (i = 1; i <= 10; i++) if (unit == names[i] || (unit == "" && i == 1)) bits = n * factors[i]
    }
    bytes = bits / 8 * 0.002
    printf "%d\n", (bytes > 262144 ? bytes : 262144)
  }'
}

shape() {  # shape NAME K RATE DELAY LOSS: tbf for a rate alone, netem (or tbf and link_delay) for delay or loss
  local ns="$1-h$2"
  stop_delay_line "$ns"
  if [[ -n $4 || -n $5 ]]; then
    local args=()
    [[ -n $3 ]] && args+=(rate "$3")
    [[ -n $4 ]] && args+=(delay "$4")
    [[ -n $5 ]] && args+=(loss "$5")
    ip netns exec "$ns" tc qdisc replace dev eth0 root netem "${args[@]}" 2>/dev/null && return
    # No sch_netem in this kernel: see Note [A delay line without netem] (tests/hosts/link_delay.cpp).
    [[ -z $3 ]] || shape_rate "$ns" "$2" "$3"
    start_delay_line "$ns" "$2" "$4" "$5"
  elif [[ -n $3 ]]; then
    shape_rate "$ns" "$2" "$3"
  fi
}

shape_rate() {  # shape_rate NS K RATE
  # See Note [tbf burst].
  ip netns exec "$1" tc qdisc replace dev eth0 root tbf rate "$3" burst "$(tbf_burst "$3")" latency 400ms ||
    die "host $2: tc tbf rate $3 failed"
}

iptables_command() {  # the kernel's x_tables NFQUEUE target: iptables-legacy where both exist
  command -v iptables-legacy || command -v iptables ||
    die "--delay/--loss without sch_netem need iptables (Debian's iptables package; scripts/setup.sh --test installs it)"
}

start_delay_line() {  # start_delay_line NS K DELAY LOSS
  local ns=$1 k=$2 tool=${DDP_LINK_DELAY:-$script_dir/../build/bin/link_delay} iptables
  [[ -x $tool ]] || die "host $k: this kernel has no sch_netem, and --delay/--loss then need link_delay" \
    "(not at $tool: build it with scripts/build.sh, or set DDP_LINK_DELAY to it)"
  iptables=$(iptables_command)
  local dir=$run_root/$ns args=()
  mkdir -p "$dir"
  rm -f "$dir/link_delay.pid"
  [[ -n $3 ]] && args+=(--delay "$3")
  [[ -n $4 ]] && args+=(--loss "$4")
  ip netns exec "$ns" setsid "$tool" "${args[@]}" --seed "$((k + 1))" --ready-file "$dir/link_delay.pid" \
    </dev/null >"$dir/link_delay.log" 2>&1 &
  local pid=$! waited
  for ((waited = 0; waited < 100; waited++)); do  # 5 s at most
    [[ -s $dir/link_delay.pid ]] && break
    kill -0 "$pid" 2>/dev/null || die "host $k: $(head -n 1 "$dir/link_delay.log")"
    sleep 0.05
  done
  [[ -s $dir/link_delay.pid ]] || die "host $k: link_delay did not bind its queue within 5 s ($dir/link_delay.log)"
  # --queue-bypass: packets pass undelayed rather than dropped when no link_delay is bound.
  ip netns exec "$ns" "$iptables" -w 5 -A INPUT -i eth0 -j NFQUEUE --queue-num 0 --queue-bypass ||
    die "host $k: iptables could not send eth0's incoming packets to NFQUEUE 0"
}

stop_delay_line() {  # stop_delay_line NS: the host's link_delay and its rule, where there are
  local ns=$1 dir=$run_root/$1 pid
  [[ -s $dir/link_delay.pid ]] || return 0
  pid=$(<"$dir/link_delay.pid")
  ip netns exec "$ns" "$(iptables_command)" -w 5 -D INPUT -i eth0 -j NFQUEUE --queue-num 0 --queue-bypass \
    2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  local waited state
  for ((waited = 0; waited < 40; waited++)); do  # 2 s at most; a zombie has let its queue go
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || break
    [[ $state == Z ]] && break
    sleep 0.05
  done
  rm -f "$dir/link_delay.pid"
}

up() {
  local name=$1 n=$2
  shift 2
  [[ $name =~ ^[a-z0-9]{1,32}$ ]] || die "NAME '$name': 1 to 32 lower-case letters or digits"
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 200)) || die "N '$n': a number of hosts from 1 to 200"
  local rate="" delay="" loss="" shapes=()
  while (($#)); do
    case $1 in
      --rate) rate=$2 ;;
      --delay) delay=$2 ;;
      --loss) loss=$2 ;;
      --shape) shapes+=("$2") ;;
      *) die "unknown option $1" ;;
    esac
    shift 2
  done
  # A failed step leaves nothing behind.
  cleanup_name=$name
  trap 'down "$name"' ERR
  trap 'down "$name"; exit 2' INT TERM
  ip netns add "$name-sw"
  ip -n "$name-sw" link add br0 type bridge
  ip -n "$name-sw" link set br0 up
  local k j hosts
  for ((k = 0; k < n; k++)); do
    ip netns add "$name-h$k"
    ip -n "$name-h$k" link set lo up
    ip -n "$name-h$k" link add eth0 type veth peer name "p$k" netns "$name-sw"
    ip -n "$name-h$k" addr add "$(address_of "$k")/24" dev eth0
    ip -n "$name-h$k" link set eth0 up
    ip -n "$name-sw" link set "p$k" master br0 up
    hosts="127.0.0.1 localhost\n127.0.1.1 host$k\n"
    for ((j = 0; j < n; j++)); do
      ((j == k)) || hosts+="$(address_of "$j") host$j\n"
    done
    mkdir -p "/etc/netns/$name-h$k"
    printf '%b' "$hosts" >"/etc/netns/$name-h$k/hosts"
    echo "host$k" >"/etc/netns/$name-h$k/hostname"
    shape "$name" "$k" "$rate" "$delay" "$loss"
  done
  local spec
  for spec in "${shapes[@]}"; do
    IFS=: read -r k rate delay loss <<<"$spec"
    shape "$name" "$k" "$rate" "$delay" "$loss"
  done
  trap - ERR INT TERM
}

down() {
  local name=$1 ns
  [[ $name =~ ^[a-z0-9]{1,32}$ ]] || die "NAME '$name': 1 to 32 lower-case letters or digits"
  # `ip netns list` also asks the kernel for each namespace's id and prints "Error: Peer netns
  # reference is invalid." for one that another process deletes meanwhile (other tests' hosts come
  # and go in parallel): those lines are about namespaces not ours, and they made a failed `up`'s
  # one-line error three (hosts.delay, 1 of 4 runs). Only the names are read here.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$name-(sw|h[0-9]+)$" || true); do
    # Processes still inside would keep the namespace's network alive: end them first.
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns" "${run_root:?}/$ns"
  done
}

run_on() {
  local name=$1 k=$2
  shift 2
  [[ -d /etc/netns/$name-h$k ]] || die "no host $k in cluster $name (netns-cluster.sh up first)"
  exec ip netns exec "$name-h$k" unshare --uts sh -c 'hostname "$0"; exec "$@"' "host$k" "$@"
}

case ${1:-} in
  up) (($# >= 3)) || die "usage: up NAME N [options]"; shift; up "$@" ;;
  down) (($# == 2)) || die "usage: down NAME"; down "$2" ;;
  exec) (($# >= 4)) || die "usage: exec NAME K COMMAND..."; shift; run_on "$@" ;;
  addr) (($# == 3)) || die "usage: addr NAME K"; address_of "$3" ;;
  check) check ;;
  *) die "usage: netns-cluster.sh up|down|exec|addr|check ... (see the top of this script)" ;;
esac
