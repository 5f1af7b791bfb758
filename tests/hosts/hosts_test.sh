#!/usr/bin/env bash
# Multi-host tests on a cluster of network-namespace hosts (scripts/netns-cluster.sh, docs/hosts.md):
#   hosts_test.sh SCENARIO NETNS_CLUSTER DDP_LAUNCH DDP_TEST_WORKER
# 3 hosts, each its own namespace, hostname hostK and Debian-style /etc/hosts (hostK -> 127.0.1.1);
# one ddp_launch per host (each killed after 45 s), Gloo between them. Exits 77 (CTest skip) without
# the rights to make namespaces. Every wait is bounded; the hosts and every process in them go away
# on exit.
set -euo pipefail

scenario=$1 cluster=$2 launch=$3 worker=$4
reason=$("$cluster" check) || {
  echo "SKIP: $reason"
  exit 77
}

# A run killed with SIGKILL (a CTest timeout) could not clean up: remove the hosts of runs whose
# script is gone (the pid is in the name).
for stale in $(ip netns list | sed -n -E 's/^hs([0-9]+)b?-sw.*/\1/p' | sort -u); do
  if [[ ! -d /proc/$stale || $(awk '{print $3}' "/proc/$stale/stat" 2>/dev/null) == Z ]]; then
    "$cluster" down "hs$stale"
    "$cluster" down "hs${stale}b"
  fi
done
name="hs$$"
work=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  "$cluster" down "$name"
  "$cluster" down "${name}b"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM
"$cluster" up "$name" 3

fail() {
  echo "FAIL ($scenario): $*"
  local log
  for log in "$work"/host*.log; do
    echo "---- $log"
    tail -n 40 "$log"
  done
  exit 1
}

on() {  # on K COMMAND...: COMMAND on host K
  local k=$1
  shift
  "$cluster" exec "$name" "$k" "$@"
}

# start K ENV... -- LAUNCHER_ARGS...: host K's launcher in the background, output in host K.log.
start() {
  local k=$1
  shift
  local env=()
  while [[ $1 != -- ]]; do
    env+=("$1")
    shift
  done
  shift
  on "$k" env "${env[@]}" timeout -s KILL 45 "$launch" --log_dir "$work/logs$k" "$@" >"$work/host$k.log" 2>&1 &
  pids+=($!)
}

# Waits for every launcher (each bounded by its timeout); fails unless all succeeded.
finish() {
  local k status=0
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}" || status=$?
    ((status == 0)) || fail "host $k's launcher exited with $status"
  done
  pids=()
}

# The TCP listeners on PORT inside host K, as "address:port" lines.
listeners() {
  on "$1" ss -Hltn "sport = :$2" | awk '{print $4}'
}

# Waits (bounded) until something listens on PORT inside host K.
wait_listening() {
  local deadline=$((SECONDS + 30))
  until [[ -n $(listeners "$1" "$2") ]]; do
    ((SECONDS < deadline)) || fail "nothing listened on port $2 on host $1 within 30 s"
    sleep 0.1
  done
}

expect_in_logs() {  # expect_in_logs COUNT TEXT: TEXT in COUNT output lines in all
  local found
  found=$(cat "$work"/host*.log | grep -c -F -- "$2" || true)
  ((found == $1)) || fail "expected $1 lines with '$2', found $found"
}

no_warning_noise() {
  if grep -h -E "cannot be retrieved|Connection refused|\[W[0-9]" "$work"/host*.log; then
    fail "c10d or Gloo warnings in the normal path (above)"
  fi
}

host0=$("$cluster" addr "$name" 0)
port=29500
case $scenario in
  bed)
    # The bed itself: names, Debian's /etc/hosts, no way out, shaping, and nothing left after down.
    for k in 0 1 2; do
      [[ $(on $k hostname) == "host$k" ]] || fail "host $k is called '$(on $k hostname)'"
      [[ $(on $k getent hosts "host$k" | awk '{print $1}') == 127.0.1.1 ]] || fail "host$k is not 127.0.1.1 on itself"
      [[ -z $(on $k ip route show default) ]] || fail "host $k has a default route"
    done
    [[ $(on 1 getent hosts host0 | awk '{print $1}') == "$host0" ]] || fail "host0 is not $host0 on host1"
    [[ $(hostname) != host0 ]] || fail "the test changed this machine's hostname"
    on 2 bash -c "exec 3<>/dev/tcp/$host0/9" 2>/dev/null && fail "a connection to a closed port succeeded"
    on 2 timeout 5 bash -c "exec 3<>/dev/tcp/198.51.100.1/80" 2>/dev/null && fail "host 2 reached beyond the bed"
    "$cluster" up "${name}b" 2 --shape 1:10mbit:: || fail "up with --shape failed"
    [[ $("$cluster" exec "${name}b" 1 tc qdisc show dev eth0) == *"tbf"*"rate 10Mbit"* ]] || fail "host 1 is not shaped"
    "$cluster" down "${name}b"
    [[ -z $(ip netns list | grep "^${name}b-") && ! -e /etc/netns/${name}b-h0 ]] || fail "down left something behind"
    ;;
  static_equivalence)
    # Static rendezvous, master given as host0's address, 3 hosts x 2 workers: DDP's parameters equal
    # single-process training on the whole batch (the worker checks), and the store listens on
    # host0's address only. Hosts 1 and 2 start once the store listens, so it is seen for sure.
    start 0 -- --nnodes 3 --node_rank 0 --nproc_per_node 2 --master_addr "$host0" --master_port $port \
      "$worker" train --model mlp
    wait_listening 0 $port
    [[ $(listeners 0 $port) == "$host0:$port" ]] ||
      fail "the store on host0 listens on '$(listeners 0 $port | tr '\n' ' ')', not on $host0:$port only"
    for k in 1 2; do
      start $k -- --nnodes 3 --node_rank $k --nproc_per_node 2 --master_addr "$host0" --master_port $port \
        "$worker" train --model mlp
    done
    finish
    expect_in_logs 1 "OK: world 6"
    no_warning_noise
    ;;
  static_hostname)
    # The master as the name host0, which resolves to 127.0.1.1 on host0 itself (Debian's default)
    # and to host0's address elsewhere: no rank advertises loopback, and the store listens where
    # the other hosts can reach it.
    start 0 -- --nnodes 3 --node_rank 0 --nproc_per_node 1 --master_addr host0 --master_port $port \
      "$worker" collectives
    wait_listening 0 $port
    [[ $(listeners 0 $port) == "0.0.0.0:$port" ]] ||
      fail "the store on host0 listens on '$(listeners 0 $port | tr '\n' ' ')', not on every interface"
    for k in 1 2; do
      start $k -- --nnodes 3 --node_rank $k --nproc_per_node 1 --master_addr host0 --master_port $port \
        "$worker" collectives
    done
    finish
    expect_in_logs 3 "OK: collectives on rank"
    no_warning_noise
    [[ $(listeners 0 $port) == "" ]] || fail "the store still listens after the job"
    ;;
  c10d)
    # Dynamic rendezvous at host0:PORT (a name, 127.0.1.1 on host0), node ranks assigned; DDP (a CNN)
    # equals single-process training.
    # host0 serves the rendezvous store on every interface (host0 is 127.0.1.1 there).
    for k in 0 1 2; do
      start $k -- --nnodes 3 --nproc_per_node 1 --rdzv_endpoint "host0:29400" --rdzv_id hosts \
        --rdzv_timeout 30 "$worker" train --model cnn
      if ((k == 0)); then
        wait_listening 0 29400
        [[ $(listeners 0 29400) == "0.0.0.0:29400" ]] ||
          fail "the rendezvous store listens on '$(listeners 0 29400 | tr '\n' ' ')', not on every interface"
      fi
    done
    finish
    expect_in_logs 1 "OK: world 3"
    no_warning_noise
    ;;
  slurm)
    # Slurm's variables: the node list's first name is the master, resolved in each host's
    # /etc/hosts; GLOO_SOCKET_IFNAME still chooses the interface.
    for k in 0 1 2; do
      start $k SLURM_JOB_NODELIST='host[0-2]' SLURM_NNODES=3 SLURM_NODEID=$k SLURM_JOB_ID=4242 \
        GLOO_SOCKET_IFNAME=eth0 -- --nproc_per_node 1 "$worker" collectives
    done
    finish
    expect_in_logs 3 "OK: collectives on rank"
    expect_in_logs 3 "master_addr=host0 from SLURM_JOB_NODELIST"
    ;;
  two_interfaces)
    # host0 has a second interface and the master is its Debian name: which address would the
    # other hosts reach? Rank 0 says so in one line naming both; GLOO_SOCKET_IFNAME settles it.
    on 0 ip link add eth1 type veth peer name eth1p
    on 0 ip addr add 198.19.0.1/24 dev eth1
    on 0 ip link set eth1 up
    on 0 ip link set eth1p up
    for k in 0 1 2; do
      start $k -- --nnodes 3 --node_rank $k --nproc_per_node 1 --master_addr host0 --master_port $port \
        "$worker" train --model mlp --timeout-s 10
    done
    wait "${pids[0]}" && fail "rank 0 trained although it could not tell which address to advertise"
    for k in 1 2; do wait "${pids[$k]}" || true; done
    pids=()
    grep -q -F "error: no address to advertise to the other ranks: MASTER_ADDR host0 resolves to 127.0.1.1 here" \
      "$work/host0.log" || fail "rank 0 did not say why it had no address"
    grep -q -E "interfaces up are: .*eth0 198.18.0.1" "$work/host0.log" || fail "the line does not name eth0"
    grep -q -E "interfaces up are: .*eth1 198.19.0.1" "$work/host0.log" || fail "the line does not name eth1"
    for k in 0 1 2; do
      start $k GLOO_SOCKET_IFNAME=eth0 -- --nnodes 3 --node_rank $k --nproc_per_node 1 --master_addr host0 \
        --master_port $((port + 1)) "$worker" train --model mlp --timeout-s 10
    done
    finish
    expect_in_logs 1 "OK: world 3"
    ;;
  *)
    echo "unknown scenario $scenario"
    exit 2
    ;;
esac
echo "PASS ($scenario)"
