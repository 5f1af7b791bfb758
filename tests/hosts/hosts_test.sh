#!/usr/bin/env bash
# Multi-host tests on a cluster of network-namespace hosts (scripts/netns-cluster.sh, docs/hosts.md):
#   hosts_test.sh SCENARIO NETNS_CLUSTER DDP_LAUNCH DDP_TEST_WORKER [FAULT_WORKER TRAIN_FASHION_MNIST]
# 3 hosts, each its own namespace, hostname hostK and Debian-style /etc/hosts (hostK -> 127.0.1.1);
# one ddp_launch per host (each killed after 45 s), Gloo between them. Exits 77 (CTest skip) without
# the rights to make namespaces. Every wait is bounded; the hosts and every process in them go away
# on exit.
set -euo pipefail

scenario=$1 cluster=$2 launch=$3 worker=$4 fault_worker=${5:-} train=${6:-}
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
"$cluster" up "$name" "$([[ $scenario == straggler_replace ]] && echo 4 || echo 3)"  # the 4th: a spare host

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
  on "$k" env "${env[@]}" timeout -s KILL "${launcher_limit:-45}" "$launch" --log_dir "$work/logs$k" "$@" >"$work/host$k.log" 2>&1 &
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

# Waits (bounded) until host K holds a TCP connection to PORT that stays open (a store client's,
# not the one-shot probe that waits for the store to listen: See open_store in
# launcher/rendezvous/plugin/plugin.cpp).
wait_connected() {
  local deadline=$((SECONDS + 30))
  until [[ -n $(on "$1" ss -Htn state established "( dport = :$2 )") ]] && sleep 0.3 &&
        [[ -n $(on "$1" ss -Htn state established "( dport = :$2 )") ]]; do
    ((SECONDS < deadline)) || fail "host $1 held no connection to port $2 within 30 s"
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

# The ddp_launch process inside host K's namespace (its pid on this machine).
launcher_pid() {
  local p
  for p in $(ip netns pids "$name-h$1"); do
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == ddp_launch ]] && echo "$p"
  done
  return 0
}

# The pids fault_worker recorded (--pid-dir "$work/pids") for the given ranks, or for all.
rank_pids() {
  local r
  if (($# == 0)); then
    cat "$work"/pids/rank*.pid 2>/dev/null || true
    return 0
  fi
  for r in "$@"; do cat "$work/pids/rank$r.attempt0.pid"; done
}

# Whether process PID has ended (gone from /proc, or a zombie: this machine's init reaps slowly).
ended() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 0
  [[ -z $state || $state == Z ]]
}

# wait_ended SECONDS PID...: fails unless every PID has ended within SECONDS.
wait_ended() {
  local deadline=$((SECONDS + $1)) p
  shift
  for p in "$@"; do
    until ended "$p"; do
      ((SECONDS < deadline)) || fail "process $p ($(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)) still runs"
      sleep 0.05
    done
  done
}

# wait_training COUNT: COUNT workers recorded their pids and rank 0 wrote two checkpoints (bounded).
wait_training() {
  local deadline=$((SECONDS + 40))
  until (($(ls "$work/pids" 2>/dev/null | grep -c '\.pid$') >= $1)) &&
    (($(ls "$work/ck" 2>/dev/null | grep -c '^step-') >= 2)); do
    ((SECONDS < deadline)) || fail "the job did not start training within 40 s"
    sleep 0.1
  done
}

# Seconds since an $EPOCHREALTIME value, to 0.01 s.
seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

# within SECONDS LIMIT WHAT: fails unless SECONDS < LIMIT (a hang guard, not a timing test).
within() {
  awk -v s="$1" -v l="$2" 'BEGIN { exit !(s < l) }' || fail "$3 took $1 s, over the bound of $2 s"
}

# wait_failed K...: waits for host K's launcher; fails unless it exited non-zero.
wait_failed() {
  local k status
  for k in "$@"; do
    status=0
    wait "${pids[$k]}" || status=$?
    ((status != 0)) || fail "host $k's launcher exited 0 after the fault"
  done
}

# lose_launcher K SURVIVOR...: SIGKILLs host K's launcher mid-training (--shutdown_grace 3): its
# workers end within 3 s (the parent-death signal), every SURVIVOR host's launcher fails within the
# grace period + 5 s, and no worker is left. Sets elapsed (seconds from the kill to the survivors' exit).
lose_launcher() {
  local k=$1 victim killed p workers=()
  shift
  victim=$(launcher_pid "$k")
  [[ -n $victim ]] || fail "no ddp_launch in host $k"
  for p in $(ip netns pids "$name-h$k"); do
    [[ $(cat "/proc/$p/comm" 2>/dev/null) != fault_worker ]] || workers+=("$p")
  done
  ((${#workers[@]} > 0)) || fail "no worker in host $k"
  killed=$EPOCHREALTIME
  kill -KILL "$victim"
  wait_ended 3 "${workers[@]}"
  wait_failed "$@"
  elapsed=$(seconds_since "$killed")
  within "$elapsed" $((3 + 5)) "the other hosts stopping after host $k's launcher was killed"
  wait "${pids[$k]}" || true
  pids=()
  wait_ended 2 $(rank_pids)
}

# fault_job K NPROC LAUNCHER_FLAGS... -- WORKER_FLAGS...: host K's launcher (static, master host0)
# running fault_worker, which records its pid and rank 0's checkpoints in $work.
fault_job() {
  local k=$1 nproc=$2 flags=()
  shift 2
  while [[ $1 != -- ]]; do
    flags+=("$1")
    shift
  done
  shift
  mkdir -p "$work/pids"
  start "$k" TMPDIR="$work" -- --nnodes 3 --node_rank "$k" --nproc_per_node "$nproc" --master_addr "$host0" \
    --master_port $port --monitor_interval 0.05 "${flags[@]}" "$fault_worker" train --steps 100000 --step-ms 20 \
    --checkpoint-dir "$work/ck" --checkpoint-every 5 --pid-dir "$work/pids" "$@"
}

host0=$("$cluster" addr "$name" 0)
# Each host is a network namespace of its own that only this test uses: 29500 and the ports
# after it are free there by construction (on a shared host a test picks free ports instead).
port=29500
# A TCP echo on port 7000 of the address given, and its client: the least of 20 round trips, in ms.
echo_server='import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 7000)); s.listen()
c = s.accept()[0]; c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (d := c.recv(64)): c.sendall(d)'
echo_client='import socket, sys, time
for attempt in range(50):
    try: c = socket.create_connection((sys.argv[1], 7000), timeout=2); break
    except ConnectionRefusedError: time.sleep(0.1)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); best = 1e9
for i in range(20):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(64); best = min(best, time.perf_counter() - t)
print("%.3f" % (best * 1e3))'

# The straggler scenarios' slow host: quota_group makes a cgroup v1 CPU group (skips without one),
# removed after the hosts (cleanup: it can go once its worker is gone); quota_hold PID... holds
# those processes to 5% of a core: 1 ms (the kernel's least) in every 20 ms, a short period, so
# that the quota slows every step alike rather than stopping the worker for 95 ms of every 100.
quota_group() {
  [[ -w /sys/fs/cgroup/cpu/cgroup.procs ]] || { echo "SKIP: no cgroup v1 cpu controller to write to"; exit 77; }
  launcher_limit=90
  quota=/sys/fs/cgroup/cpu/ddp-straggler-$$
  mkdir "$quota"
  trap 'cleanup; for i in $(seq 50); do rmdir "$quota" 2>/dev/null && break; sleep 0.1; done' EXIT
}
quota_hold() {
  local p
  echo 20000 >"$quota/cpu.cfs_period_us"
  echo 1000 >"$quota/cpu.cfs_quota_us"
  for p in "$@"; do echo "$p" >"$quota/cgroup.procs"; done
}

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
  delay)
    # --delay and --loss (netem, or tbf and link_delay where the kernel has no sch_netem): 5 ms on
    # each host's link is a round trip of 10 ms at least; 100% loss lets nothing through; down
    # leaves no delay line behind; a bad delay is one line and nothing made.
    "$cluster" down "$name"  # this scenario makes its own hosts
    "$cluster" up "${name}b" 2 --delay 5ms || fail "up with --delay 5ms failed"
    "$cluster" exec "${name}b" 1 timeout -s KILL 20 python3 -c "$echo_server" "$("$cluster" addr "${name}b" 1)" &
    pids+=($!)
    rtt=$("$cluster" exec "${name}b" 0 timeout -s KILL 20 python3 -c "$echo_client" "$("$cluster" addr "${name}b" 1)") ||
      fail "no round trip between host 0 and host 1 with --delay 5ms"
    echo "round trip with 5 ms on each link: $rtt ms at least (10 expected)"
    awk -v rtt="$rtt" 'BEGIN { exit !(rtt >= 10) }' || fail "round trip $rtt ms: under the 10 ms of two 5 ms links"
    "$cluster" down "${name}b"
    [[ -z $(pgrep -f "link_delay.*/${name}b-h" || true) ]] || fail "down left a delay line running"
    [[ -z $(ip netns list | grep "^${name}b-") && ! -e /run/netns-cluster/${name}b-h0 ]] || fail "down left something behind"
    "$cluster" up "${name}b" 2 --shape 1:::100% || fail "up with 100% loss on host 1 failed"
    "$cluster" exec "${name}b" 1 timeout -s KILL 20 python3 -c "$echo_server" "$("$cluster" addr "${name}b" 1)" &
    pids+=($!)
    sleep 0.5
    "$cluster" exec "${name}b" 0 timeout -s KILL 3 python3 -c "$echo_client" "$("$cluster" addr "${name}b" 1)" \
      >/dev/null 2>&1 && fail "a connection reached host 1 through 100% loss"
    "$cluster" down "${name}b"
    # link_delay itself (where netns-cluster.sh uses it): each bad option is one line and exit 2.
    if [[ -x ${DDP_LINK_DELAY:-} ]]; then
      for bad in "--delay 5" "--delay 1ms --loss 150%" "--delay 1ms --queue 70000" "--delay 1ms --bogus" "--loss"; do
        out=$("$DDP_LINK_DELAY" $bad 2>&1) && fail "link_delay accepted $bad"
        [[ $? == 2 && $(wc -l <<<"$out") == 1 && $out == "link_delay: "* ]] || fail "link_delay $bad gave: $out"
      done
    fi
    out=$("$cluster" up "${name}b" 2 --delay 5 2>&1) && fail "up accepted --delay 5 (no unit)"
    [[ $(wc -l <<<"$out") == 1 && $out == *"--delay"* ]] || fail "a bad --delay gave: $out"
    [[ -z $(ip netns list | grep "^${name}b-") ]] || fail "a failed up left hosts behind"
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
  resume)
    # Checkpoints written on host0 resume a job across hosts: 3 hosts x 1 worker train
    # train_fashion_mnist to step 7 (checkpoints at steps 3, 4 and 6, written by rank 0 on host0 into
    # a folder every host sees: the namespaces share the file system); the resumed job's node ranks
    # are rotated, so that its rank 0 (the master) is host2, and it ends with the parameters of an
    # uninterrupted run. 384 samples, 3 x 32 per step: 4 steps per epoch, 8 in all.
    train_job() {  # train_job ROTATION PORT ARGS...: node rank (K + ROTATION) % 3 on host K
      local k rotation=$1 job_port=$2 master
      shift 2
      master=$("$cluster" addr "$name" $(((3 - rotation) % 3)))
      for k in 0 1 2; do
        start $k -- --nnodes 3 --node_rank $(((k + rotation) % 3)) --nproc_per_node 1 --master_addr "$master" \
          --master_port "$job_port" "$train" --mode ddp --limit 384 --epochs 2 --batch-size 32 --seed 5 "$@"
      done
      finish
    }
    if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
      echo "SKIP: no Fashion-MNIST in /usr/share/datasets/fashion-mnist (scripts/setup.sh installs it)"
      exit 77
    fi
    train_job 0 $port --save-params "$work/whole.bin"
    train_job 0 $((port + 1)) --checkpoint-dir "$work/ck" --checkpoint-every 3 --max-steps 7
    [[ -f $work/ck/step-000000000006/MANIFEST ]] || fail "no checkpoint of step 6 in $work/ck"
    [[ ! -e $work/ck/step-000000000007 ]] || fail "the interrupted job went past step 6's checkpoint"
    train_job 1 $((port + 2)) --checkpoint-dir "$work/ck" --resume --save-params "$work/resumed.bin"
    grep -q "step-000000000006" "$work/host2.log" ||
      fail "rank 0 on host2 did not say it resumed from step-000000000006"
    grep -q "starting 1 workers (ranks 0..0 of 3) on node 0 of 3, master $("$cluster" addr "$name" 2)" "$work/host2.log" ||
      fail "the resumed job's rank 0 is not on host2"
    [[ -f $work/ck/step-000000000008/MANIFEST ]] || fail "the resumed job wrote no checkpoint of step 8"
    # Bit for bit: the same data, the same sums in Gloo's all-reduce, the same optimizer state.
    cmp "$work/whole.bin" "$work/resumed.bin" || fail "the resumed job's parameters differ from the uninterrupted job's"
    # A coordinated restart resumes it too (Note [Coordinated restarts]): in round 0 every rank
    # stops after step 7 (--max-steps) and host2's rank then exits 1; every host restarts, every
    # rank resumes from step-000000000006, and the job ends with the uninterrupted run's parameters.
    cat >"$work/fail_once.sh" <<EOF
#!/bin/sh
if [ "\$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  "$train" "\$@" --max-steps 7 || exit
  [ "\$(hostname)" != host2 ] || { echo "fail_once: rank \$RANK on host2 fails after step 7"; exit 1; }
  exit 0
fi
exec "$train" "\$@"
EOF
    chmod +x "$work/fail_once.sh"
    for k in 0 1 2; do
      start $k -- --nnodes 3 --node_rank $k --nproc_per_node 1 --master_addr "$host0" --master_port $((port + 3)) \
        --max_restarts 1 --shutdown_grace 3 "$work/fail_once.sh" --mode ddp --limit 384 --epochs 2 --batch-size 32 \
        --seed 5 --checkpoint-dir "$work/ck2" --checkpoint-every 3 --resume --allow-fresh-start \
        --save-params "$work/restarted.bin"
    done
    finish
    grep -q "fail_once: rank 2 on host2 fails after step 7" "$work/host2.log" || fail "rank 2 did not fail on host2"
    for k in 0 1 2; do
      grep -q "restart 1 of 1" "$work/host$k.log" || fail "host $k's launcher did not restart with the job"
    done
    grep -q "resuming from .*step-000000000006" "$work/host0.log" || fail "round 1 did not resume from step 6"
    cmp "$work/whole.bin" "$work/restarted.bin" ||
      fail "the restarted job's parameters differ from the uninterrupted job's"
    ;;
  host_kill)
    # Host 1's launcher SIGKILLed mid-training (3 hosts x 2 workers, collective timeout 30 s): its
    # workers die with it (the parent-death signal); hosts 0 and 2 see their peers' connections
    # close, fail, and stop within --shutdown_grace (3 s) + a few seconds, long before the timeout.
    # Restarts are left (--max_restarts 2), but a lost host ends the job: membership is fixed
    # (Note [Coordinated restarts]).
    for k in 0 1 2; do
      fault_job $k 2 --shutdown_grace 3 --max_restarts 2 -- --timeout-ms 30000
    done
    wait_training 6
    lose_launcher 1 0 2
    for k in 0 2; do
      grep -q "worker group FAILED" "$work/host$k.log" || fail "host $k's launcher printed no failure summary"
      # Before Note [SIGPIPE in a rank], 1 run in 4 or 5 here had a rank of a surviving host die of it.
      ! grep -q "SIGPIPE" "$work/host$k.log" || fail "a rank on host $k died of SIGPIPE"
      grep -q "^  host      : host$k$" "$work/host$k.log" || fail "host $k's summary does not name host$k"
      grep -q -E "^  rank      : ($((2 * k))|$((2 * k + 1))) " "$work/host$k.log" ||
        fail "host $k's summary does not name one of its ranks $((2 * k)), $((2 * k + 1))"
      # The job channel (Note [Coordinated restarts]) named the lost host and its ranks to every survivor.
      grep -q -E "^  host1 \(node 1, ranks 2-3\) was lost: its launcher's connection .* closed" "$work/host$k.log" ||
        fail "host $k's summary does not name the lost host1 and its ranks 2-3"
      ! grep -q "restart 1 of 2" "$work/host$k.log" || fail "host $k restarted without host1"
    done
    echo "host 1 lost: hosts 0 and 2 stopped after $elapsed s; every worker gone"
    ;;
  partition)
    # Host 2's link goes down mid-training (3 hosts x 1 worker, collective timeout 3 s): nothing
    # closes a connection, so only the timeout ends the job. Ranks 0 and 1 name rank 2 as the one
    # that did not arrive; rank 2 cannot reach the store on host0 and says so; every process ends
    # (before Note [Bounded store wait], rank 2 hung for good when cut off during a checkpoint).
    for k in 0 1 2; do
      fault_job $k 1 --shutdown_grace 2 -- --timeout-ms 3000
    done
    wait_training 3
    cut=$EPOCHREALTIME
    on 2 ip link set eth0 down
    wait_failed 0 1 2
    pids=()
    elapsed=$(seconds_since "$cut")
    within "$elapsed" $((3 + 10)) "the job ending after the partition"
    wait_ended 2 $(rank_pids)
    # Rank 0 may complete the all-reduce that rank 1 still waits in and time out in the next one: it
    # names rank 2 alone and rank 1 as still inside (Note [Collectives end unevenly]).
    for k in 0 1; do
      grep -q -E "timed out after 3 s on rank $k: rank\(s\) 2 did not arrive" "$work/host$k.log" ||
        fail "rank $k does not name rank 2 as the rank that did not arrive"
    done
    # Rank 2 was in an all-reduce, or waiting (through the store) for rank 0 to write a checkpoint;
    # c10d's own store wait never returns once its host is cut off (see Note [Bounded store wait]).
    grep -q -E "timed out after 3 s on rank 2: .*the store did not answer|rank 2 waited 3 s for rank 0" \
      "$work/host2.log" || fail "rank 2 does not say that it timed out"
    # The survivors' summaries name the host cut off and its rank (the job channel heard nothing from it).
    for k in 0 1; do
      grep -q -E "^  host2 \(node 2, rank 2\): nothing heard from its launcher for" "$work/host$k.log" ||
        fail "host $k's summary does not name host2 and its rank 2"
    done
    echo "host 2 cut off: every launcher ended after $elapsed s"
    ;;
  slow_host)
    # Host 2 stops making progress: its worker is SIGSTOPped (tc netem delay is not available in
    # every kernel; a tbf rate limit slows every rank alike). Every launcher runs --hang_timeout 2
    # with a collective timeout of 60 s: host 2's watchdog names rank 2 and its step, and the job
    # ends long before the collective timeout (SIGTERM stays pending on a stopped process: SIGKILL
    # after the 2 s grace period).
    for k in 0 1 2; do
      fault_job $k 1 --shutdown_grace 2 --hang_timeout 2 -- --timeout-ms 60000
    done
    wait_training 3
    stopped=$EPOCHREALTIME
    kill -STOP "$(rank_pids 2)"
    wait_failed 0 1 2
    pids=()
    elapsed=$(seconds_since "$stopped")
    within "$elapsed" $((2 + 2 + 10)) "the job ending after host 2 stopped"
    wait_ended 2 $(rank_pids)
    # The first watchdog to fire (host2's on rank 2, or another host's on its own rank, silent in
    # the all-reduce) stops the job on every host (Note [Coordinated restarts]); its line names the
    # rank that did not arrive, from every launcher's progress, and every launcher prints it.
    grep -q "stopped by the hang watchdog" "$work"/host*.log || fail "no summary names the watchdog"
    # A rank blocked in the same collective as rank 2 may be named with it (seen once: rank 2
    # stopped inside step S's all-reduce, rank 0 completed it and reached S + 1, rank 1 still waited
    # in it: "did not arrive: rank 1 on host1, rank 2 on host2 at step S, the others at up to S + 1").
    also='(rank [01] on host[01], )?'
    behind=$(sed -n -E "s/.*did not arrive: ${also}rank 2 on host2 at step ([0-9]+),.*/\\2/p" "$work"/host*.log | head -n 1)
    if [[ -z $behind ]]; then
      # Rank 2 stopped between its step's heartbeat and the next all-reduce: every rank's last step is
      # the same, so no rank can be named as behind; the watchdog must say so, and blame nobody.
      grep -q "every rank heard of is at step" "$work"/host*.log ||
        fail "no launcher names rank 2 on host2 as the rank that did not arrive"
      grep -q "did not arrive: rank [01] " "$work"/host*.log && fail "a launcher blames a rank that was not stopped"
      echo "host 2 stopped at the same step as the others: every launcher ended after $elapsed s"
      exit 0
    fi
    for k in 0 1 2; do
      grep -q -E "did not arrive: ${also}rank 2 on host2 at step $behind, the others at" "$work/host$k.log" ||
        fail "host $k's launcher does not name rank 2 on host2 as the rank that did not arrive"
    done
    if grep -q -E "rank 2 \(pid [0-9]+, local_rank 0\) made no progress" "$work/host2.log"; then
      grep -q -E "rank 2 \(pid $(rank_pids 2), local_rank 0\) made no progress for [0-9.]+ s .*step $behind" \
        "$work/host2.log" || fail "host 2's watchdog did not name rank 2 at step $behind"
    fi
    # A watchdog on hosts 0 or 1 names its own rank, silent in the all-reduce, at a later step; at
    # rank 2's step only when the job's line named that rank with rank 2 (blocked in the same collective).
    for k in 0 1; do
      for step in $(sed -n -E "s/.*rank $k \(pid [0-9]+, local_rank 0\) made no progress .*last heartbeat at step ([0-9]+).*--hang_timeout.*/\1/p" \
        "$work/host$k.log"); do
        ((step > behind)) || { ((step == behind)) &&
          grep -q -E "did not arrive: rank $k on host$k, rank 2 on host2 at step $behind," "$work/host$k.log"; } ||
          fail "host $k's watchdog named rank $k at step $step, not after rank 2's step $behind"
      done
    done
    echo "host 2 stopped: every launcher ended after $elapsed s"
    ;;
  restart)
    # Coordinated restarts (Note [Coordinated restarts]), with static then c10d rendezvous, --max_restarts
    # 1: rank 2 (on host2 in the static job) exits 3 before step 8 of round 0; every host stops its
    # group and all start round 1 together: every rank records its pid as attempt 1
    # (TORCHELASTIC_RESTART_COUNT=1 on every host), resumes from the checkpoint of step 5, and the
    # job succeeds on every host.
    restart_job() {  # restart_job static|c10d
      local k job=$1 rdzv
      mkdir -p "$work/$job/pids"
      for k in 0 1 2; do
        rdzv=(--node_rank $k --master_addr "$host0" --master_port $port)
        [[ $job == static ]] || rdzv=(--rdzv_endpoint host0:29400 --rdzv_id restart --rdzv_timeout 30)
        start $k DDP_FAULT=rank=2,step=8,kind=exit,attempt=0 -- --nnodes 3 --nproc_per_node 1 "${rdzv[@]}" \
          --max_restarts 1 --monitor_interval 0.05 --shutdown_grace 3 "$fault_worker" train --steps 12 \
          --step-ms 20 --timeout-ms 30000 --checkpoint-dir "$work/$job/ck" --checkpoint-every 5 --resume \
          --pid-dir "$work/$job/pids"
        [[ $job == static || $k != 0 ]] || wait_listening 0 29400
      done
      finish
      for k in 0 1 2; do
        [[ -f $work/$job/pids/rank$k.attempt1.pid ]] || fail "rank $k did not run with restart count 1 ($job)"
        grep -q "every host restarts its group, restart 1 of 1" "$work/host$k.log" ||
          fail "host $k's launcher did not restart with the job ($job)"
      done
      [[ ! -e $work/$job/pids/rank0.attempt2.pid ]] || fail "a third round ran ($job)"
      expect_in_logs 3 "resumed from step 5"
      expect_in_logs 3 "finished 12 steps"
      expect_in_logs 1 "fault: exit on rank 2 at step 8"
    }
    restart_job static
    grep -q "fault: exit on rank 2 at step 8" "$work/host2.log" || fail "rank 2 did not fail on host2"
    for k in 0 1; do
      grep -q "host2 (node 2, rank 2): rank 2 exited with 3" "$work/host$k.log" ||
        fail "host $k's launcher did not say that host2's rank 2 failed"
    done
    restart_job c10d
    ;;
  rdzv_kill)
    # The rendezvous host (host0, --rdzv_endpoint host0:29400) loses its launcher while host 1
    # waits for a third node: host 1 ends with one line (no c10d backtrace) well within
    # --rdzv_timeout. Then a whole job loses host0 mid-training: hosts 1 and 2 stop within
    # --shutdown_grace + 5 s.
    for k in 0 1; do
      start $k -- --nnodes 3 --nproc_per_node 1 --rdzv_endpoint host0:29400 --rdzv_id lost --rdzv_timeout 30 \
        "$fault_worker" train --steps 5
      ((k == 1)) || wait_listening 0 29400
    done
    # Host 1 is in the rendezvous once its store client is connected: its "waiting for 3 nodes" line
    # comes before it loads the plugin (LibTorch: seconds on a loaded machine) and connects, and a
    # fixed pause after that line killed host0 before host 1 connected (it then waited out
    # --rdzv_timeout for a store that never came: 1 of 1 runs beside a CPU hog).
    wait_connected 1 29400
    killed=$EPOCHREALTIME
    kill -KILL "$(launcher_pid 0)"
    wait_failed 1
    elapsed=$(seconds_since "$killed")
    within "$elapsed" 10 "host 1 ending after the rendezvous host's loss"
    wait "${pids[0]}" || true
    pids=()
    errors=$(grep -c -v -E "^\[[0-9-]+ [0-9:.]+\] \[ddp_launch\] \[(info|warning)\]" "$work/host1.log" || true)
    ((errors == 1)) || fail "host 1 printed $errors lines beyond its log lines, not one"
    grep -q -E "^ddp_launch: error: .*rendezvous" "$work/host1.log" || fail "host 1's line does not name the rendezvous"
    echo "rendezvous host lost during the rendezvous: host 1 ended after $elapsed s: $(grep '^ddp_launch: error' "$work/host1.log")"
    # After the rendezvous: host0 serves the rendezvous store and the job's master store.
    for k in 0 1 2; do
      mkdir -p "$work/pids"
      start $k TMPDIR="$work" -- --nnodes 3 --nproc_per_node 1 --rdzv_endpoint host0:29401 --rdzv_id train \
        --rdzv_timeout 30 --monitor_interval 0.05 --shutdown_grace 3 "$fault_worker" train --steps 100000 \
        --step-ms 20 --timeout-ms 30000 --checkpoint-dir "$work/ck" --checkpoint-every 5 --pid-dir "$work/pids"
      ((k > 0)) || wait_listening 0 29401
    done
    wait_training 3
    lose_launcher 0 1 2
    echo "rendezvous host lost mid-training: hosts 1 and 2 ended after $elapsed s"
    ;;
  straggler)
    # Note [Stragglers] (--straggler_action warn), each worker computing 2 ms of CPU per step and
    # sleeping 10 ms (as a step waits for its data or a GPU): 3 hosts computing flat out on 2 cores are
    # not even (whichever shares a core is 1.5x slower for a window of 50 4-ms steps, seen here).
    # Beside a CPU hog a step takes 3-4 times its quiet 12 ms (wake-ups wait for a core): the
    # launchers' bound is 90 s here, not 45 (1000 steps of 15 ms sleep were killed at 45 s once in
    # 10 runs beside a hog; 10 ms leaves the cores as idle and the job shorter). An
    # even job of 1000 steps names nobody. Then, while a job steps, host 2's worker is held to 5% of
    # a core (a cgroup CPU quota; on a loaded machine the others get a quarter core or less each: a
    # quota of 15% made rank 2 only 1.5x slower there): host 0's launcher names rank 2 on host2 within the
    # window (its 50 steps end at most 50 steps after the quota), host 2's names its own rank, and
    # no launcher names another rank.
    quota_group
    straggler_job() {  # straggler_job WORKER_FLAGS...: every host's launcher
      local k
      for k in 0 1 2; do
        start $k TMPDIR="$work" -- --nnodes 3 --node_rank $k --nproc_per_node 1 --master_addr "$host0" \
          --master_port $port --monitor_interval 0.05 --shutdown_grace 2 --straggler_action warn "$fault_worker" train \
          --step-ms 10 --spin-ms 2 "$@"
      done
    }
    straggler_job --steps 1000
    finish
    grep -h -E "straggler: |no longer a straggler" "$work"/host*.log && fail "an even job of 1000 steps named a straggler (above)"
    grep -q "finished 1000 steps" "$work/host0.log" || fail "the even job did not finish its 1000 steps"
    port=$((port + 1))
    mkdir -p "$work/pids"
    straggler_job --steps 1000000 --say-steps --pid-dir "$work/pids"
    last_step() { { grep -o "step [0-9]* done" "$work/host$1.log" || true; } | awk '{ s = $2 } END { print s + 0 }'; }
    deadline=$((SECONDS + 30))
    until (($(last_step 2) >= 100)); do
      ((SECONDS < deadline)) || fail "the job did not reach step 100 within 30 s"
      sleep 0.1
    done
    quota_hold $(rank_pids 2)
    slowed=$(last_step 2)
    deadline=$((SECONDS + 30))
    until grep -q "straggler: rank 2 on host2" "$work/host0.log" && grep -q "straggler: rank 2 on host2" "$work/host2.log"; do
      ((SECONDS < deadline)) || fail "host 0's and host 2's launchers did not both name rank 2 on host2 within 30 s of the quota"
      sleep 0.1
    done
    named=$(grep -m 1 "straggler: rank 2 on host2" "$work/host0.log")
    through=$(sed -E 's/.*\(steps [0-9]+-([0-9]+)\).*/\1/' <<<"$named")
    ((through - slowed <= 50)) ||
      fail "rank 2 named with the window to step $through, $((through - slowed)) steps after the quota (at step $slowed)"
    grep -h -E "straggler: rank [01] " "$work"/host*.log && fail "a launcher named a rank that was not slowed (above)"
    echo "slowed at step $slowed; host 0: $named"
    # SIGTERM to host 0's launcher: the job channel stops the others (Note [Coordinated restarts]).
    kill -TERM "$(launcher_pid 0)"
    for k in 0 1 2; do wait "${pids[$k]}" || true; done
    pids=()
    wait_ended 5 $(rank_pids)
    ;;
  straggler_replace)
    # Note [Replacing a straggler] (--straggler_action replace): hosts 0-2 train in an elastic job at its
    # maximum (--nnodes 2:3, checkpoints every 20 steps) with the straggler test's steps (2 ms of CPU,
    # 10 ms of sleep); host 3 comes as a spare and waits for a place. Host 2's worker is held to 5% of a
    # core: its launcher names its rank a straggler, tells the others and leaves, exiting 0; hosts 0,
    # 1 and the spare go on in the next round at world size 3, resumed from the checkpoint; no launcher
    # names a rank of another host.
    quota_group
    mkdir -p "$work/pids"
    replace_job() {  # replace_job K: host K's launcher in the job
      start "$1" TMPDIR="$work" -- --nnodes 2:3 --rdzv_endpoint host0:29400 --rdzv_id replace --rdzv_timeout 60 \
        --rdzv_conf last_call_timeout=1 --max_restarts 3 --nproc_per_node 1 --monitor_interval 0.05 \
        --shutdown_grace 2 --straggler_action replace "$fault_worker" train --step-ms 10 --spin-ms 2 \
        --steps 1000000 --say-steps --timeout-ms 30000 --checkpoint-dir "$work/ck" --checkpoint-every 20 --resume \
        --pid-dir "$work/pids"
    }
    replace_job 0
    wait_listening 0 29400
    replace_job 1
    replace_job 2
    last_step() { { grep -o "step [0-9]* done" "$work/host$1.log" || true; } | awk '{ s = $2 } END { print s + 0 }'; }
    deadline=$((SECONDS + 40))
    until (($(last_step 2) >= 100)); do
      ((SECONDS < deadline)) || fail "the job did not reach step 100 within 40 s"
      sleep 0.1
    done
    replace_job 3
    deadline=$((SECONDS + 30))
    until grep -q "waiting to join, but the job is at its maximum of 3 nodes" "$work/host0.log"; do
      ((SECONDS < deadline)) || fail "host 0's launcher did not see the spare (host 3) waiting within 30 s"
      sleep 0.1
    done
    quota_hold $(for p in $(ip netns pids "$name-h2"); do [[ $(cat "/proc/$p/comm" 2>/dev/null) != fault_worker ]] || echo "$p"; done)
    status=0
    wait "${pids[2]}" || status=$?
    ((status == 0)) || fail "host 2's launcher (the straggler's) exited with $status, not 0"
    grep -q -E "straggler: rank [0-9]+ on host2: " "$work/host2.log" || fail "host 2's launcher did not name its own rank"
    grep -q -E "\-\-straggler_action replace: rank [0-9]+ on host2: .*; this node leaves the job: the other nodes go on without it; exiting 0" \
      "$work/host2.log" || fail "host 2's launcher did not say it leaves the job"
    # The spare trains in the next round, at world size 3, with hosts 0 and 1.
    deadline=$((SECONDS + 40))
    until grep -q -E "round [0-9]+: starting 1 workers? \(ranks? [0-9.]+ of 3\)" "$work/host3.log" && (($(last_step 3) > 0)); do
      ((SECONDS < deadline)) || fail "the spare (host 3) did not train at world size 3 within 40 s of the quota"
      sleep 0.1
    done
    for k in 0 1; do
      grep -q -E "round [1-9][0-9]*: starting 1 workers? \(ranks? [0-9.]+ of 3\)" "$work/host$k.log" ||
        fail "host $k did not go on in a later round at world size 3"
    done
    grep -h -E "straggler: rank [0-9]+ on host[013]: " "$work"/host*.log && fail "a launcher named a rank of a host that was not slowed (above)"
    echo "replaced: $(grep -m 1 -o -E "straggler_action replace: rank [0-9]+ on host2: [^;]*" "$work/host2.log"); the spare trains from step $(last_step 3)"
    kill -TERM "$(launcher_pid 0)"
    for k in 0 1 3; do wait "${pids[$k]}" || true; done
    pids=()
    wait_ended 5 $(rank_pids)
    ;;
  *)
    echo "unknown scenario $scenario"
    exit 2
    ;;
esac
echo "PASS ($scenario)"
