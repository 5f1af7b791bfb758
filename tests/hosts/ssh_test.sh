#!/usr/bin/env bash
# One command starts every host (docs/launcher.md "One command, every host"), over a real sshd per
# namespace host:
#   ssh_test.sh SCENARIO NETNS_CLUSTER DDP_LAUNCH LAUNCH_TEST_WORKER DDP_TEST_WORKER
# Hosts host0 and host1 (scripts/netns-cluster.sh) each run Debian's sshd, listening only on that
# host's address, with host keys, a client key, authorized_keys and known_hosts made for this run
# in a private temporary folder; host2 is the "login node" where `ddp_launch --hostfile` runs.
# Exits 77 (CTest skip) without the rights to make namespaces or without openssh. Every wait is
# bounded; the hosts, every sshd and every process in them go away on every exit path.
set -euo pipefail

scenario=$1
# Absolute paths: the test works in its own folder.
cluster=$(readlink -f "$2") launch=$(readlink -f "$3") test_worker=$(readlink -f "$4") worker=$(readlink -f "$5")
reason=$("$cluster" check) || {
  echo "SKIP: $reason"
  exit 77
}
if [[ ! -x /usr/sbin/sshd ]] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
  echo "SKIP: openssh-server and openssh-client are needed (scripts/setup.sh installs them)"
  exit 77
fi

# Beds of runs that were SIGKILLed (a CTest timeout) are removed (the pid is in the name).
for stale in $(ip netns list | sed -n -E 's/^ssh([0-9]+)-sw.*/\1/p' | sort -u); do
  if [[ ! -d /proc/$stale || $(awk '{print $3}' "/proc/$stale/stat" 2>/dev/null) == Z ]]; then
    "$cluster" down "ssh$stale"
  fi
done
name="ssh$$"
work=$(mktemp -d)
keys="$work/keys"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  "$cluster" down "$name" # ends every process inside, the sshds included
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM
"$cluster" up "$name" 3

fail() {
  echo "FAIL ($scenario): $*"
  local log
  for log in "$work"/*.log; do
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

# sshd_up K [SHADOW]: Debian's sshd on host K, on host K's address only. SHADOW: a folder hidden on
# that host (an empty tmpfs over it, in a mount namespace of the sshd's own): what is in it is
# "missing on that host".
sshd_up() {
  local k=$1 shadow=${2:-} addr
  addr=$("$cluster" addr "$name" "$k")
  ssh-keygen -q -t ed25519 -N '' -C "host$k" -f "$keys/host$k"
  cat >"$keys/sshd$k.conf" <<EOF
ListenAddress $addr
HostKey $keys/host$k
AuthorizedKeysFile $keys/authorized_keys
PidFile none
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
PrintMotd no
EOF
  echo "host$k,$addr $(cut -d' ' -f1,2 "$keys/host$k.pub")" >>"$keys/known_hosts"
  local start=(/usr/sbin/sshd -D -e -f "$keys/sshd$k.conf")
  if [[ -n $shadow ]]; then
    on "$k" unshare --mount --propagation private sh -c 'mount -t tmpfs none "$0" && exec "$@"' "$shadow" \
      "${start[@]}" >"$work/sshd$k.log" 2>&1 &
  else
    on "$k" "${start[@]}" >"$work/sshd$k.log" 2>&1 &
  fi
  pids+=($!)
  disown $! # `down` ends it; no "Killed" line for it
  local deadline=$((SECONDS + 20))
  until [[ -n $(on "$k" ss -Hltn "sport = :22") ]]; do
    ((SECONDS < deadline)) || fail "sshd on host $k did not listen within 20 s"
    sleep 0.1
  done
  [[ $(on "$k" ss -Hltn "sport = :22" | awk '{print $4}') == "$addr:22" ]] ||
    fail "sshd on host $k listens on $(on "$k" ss -Hltn "sport = :22" | awk '{print $4}'), not $addr:22 only"
}

mkdir -p /run/sshd # sshd's privilege separation folder (Debian's service makes it at boot)
mkdir -m 700 "$keys"
ssh-keygen -q -t ed25519 -N '' -C "ssh_test" -f "$keys/client"
cp "$keys/client.pub" "$keys/authorized_keys"
ssh_options="-F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=$keys/known_hosts \
-o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes -i $keys/client -o ConnectTimeout=10"
ssh_cmd="ssh $ssh_options"
mkdir -p "$work/hidden"
cp "$test_worker" "$work/hidden/worker" # missing on host 1 in `check`
sshd_up 0
if [[ $scenario == check ]]; then sshd_up 1 "$work/hidden"; else sshd_up 1; fi
cd "$work"
# Node ranks follow the file: host1 is node 0 (and the master), host0 node 1.
cat >hostfile <<EOF
# the job's hosts, in node-rank order
host1 slots=2

host0 slots=2   # the second node
EOF
host_of_rank() { echo "host$((1 - $1 / 2))"; } # ranks 0, 1 on host1; 2, 3 on host0
# Each host is a network namespace of its own that only this test uses: 29500 and the ports
# after it are free there by construction (on a shared host a test picks free ports instead).
port=29500
mkdir out tmp
# Every host's launcher makes its run folder in $work/tmp (forwarded by .ddp_env), so that the test
# sees what it leaves behind.
echo "TMPDIR=$work/tmp" >.ddp_env

# job LOG LAUNCHER_ARGS...: ddp_launch on host 2 (the login node) in the foreground, bounded; sets
# status.
job() {
  local log=$1
  shift
  status=0
  on 2 timeout -s KILL 90 "$launch" "$@" >"$work/$log" 2>&1 || status=$?
}

# bg_job LOG LAUNCHER_ARGS...: the same in the background; sets bg (its pid on this machine).
bg_job() {
  local log=$1
  shift
  on 2 timeout -s KILL 90 "$launch" "$@" >"$work/$log" 2>&1 &
  bg=$!
  pids+=("$bg")
}

# The local ddp_launch (on host 2; its pid on this machine).
local_launcher() {
  local p
  for p in $(ip netns pids "$name-h2"); do
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == ddp_launch ]] && echo "$p"
  done
  return 0
}

# kill_launcher SIGNAL: sends SIGNAL to the local ddp_launch.
kill_launcher() {
  local p
  p=$(local_launcher)
  [[ -n $p ]] || fail "no ddp_launch on host 2"
  kill "-$1" $p
}

# Whether process PID has ended (gone, or a zombie: this machine's init reaps slowly).
ended() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 0
  [[ -z $state || $state == Z ]]
}

# The processes of this test's jobs on hosts 0 and 1: their launchers and workers.
remote_processes() {
  local k p
  for k in 0 1; do
    for p in $(ip netns pids "$name-h$k"); do
      ended "$p" && continue
      case $(cat "/proc/$p/comm" 2>/dev/null) in
        ddp_launch | launch_test_wor* | worker | ddp_test_worker) echo "$p" ;;
      esac
    done
  done
}

# wait_no_remote SECONDS: fails unless every launcher and worker on hosts 0 and 1 ended in time.
wait_no_remote() {
  local deadline=$((SECONDS + $1)) left
  while left=$(remote_processes) && [[ -n $left ]]; do
    ((SECONDS < deadline)) || fail "left on the hosts after $1 s: $(for p in $left; do tr '\0' ' ' <"/proc/$p/cmdline"; echo; done)"
    sleep 0.1
  done
}

# wait_files COUNT GLOB: COUNT files match GLOB within 60 s.
wait_files() {
  local deadline=$((SECONDS + 60))
  until (($(compgen -G "$2" | wc -l) >= $1)); do
    ((SECONDS < deadline)) || fail "fewer than $1 files $2 within 60 s"
    sleep 0.1
  done
}

expect_status() { ((status == $1)) || fail "ddp_launch exited $status, not $1"; }
expect_line() {  # expect_line LOG TEXT: TEXT (fixed) is on a line of LOG
  grep -q -F -- "$2" "$work/$1" || fail "no line with '$2' in $1"
}
count_lines() { grep -c -F -- "$2" "$work/$1" || true; }

# A failing rank 3 (on the second node) while ranks 0..2 sleep: the workers record SIGTERM in out/.
failing_worker=("$test_worker" --out "$work/out" --mark-sigterm --sleep 0:60 --sleep 1:60 --sleep 2:60
  --sleep 3:0.5 --exit 3:7 --error-message "3:rank 3 gave up")
# Workers that run until stopped.
sleeping_worker=("$test_worker" --out "$work/out" --mark-sigterm --sleep '*:60')

# sleepers LOG N: a job of sleeping workers on the hostfile's hosts in the background (master port
# port + N), once its 4 workers run.
sleepers() {
  rm -rf out && mkdir out
  bg_job "$1" --hostfile hostfile --ssh_cmd "$ssh_cmd" --master_port $((port + $2)) --shutdown_grace 5 \
    "${sleeping_worker[@]}"
  wait_files 4 "out/rank*.attempt0"
}

# all_stopped WHAT: every rank recorded a SIGTERM, and the hosts' launchers removed their run folders.
all_stopped() {
  local r
  for r in 0 1 2 3; do [[ -f out/sigterm$r ]] || fail "$1: rank $r was not stopped with SIGTERM"; done
  no_run_folders "$1"
}
no_run_folders() { [[ -z $(ls tmp) ]] || fail "$1: the hosts' launchers left run folders behind: $(ls tmp)"; }

case $scenario in
  run)
    # Arguments and forwarded variables with spaces, quotes and $ arrive verbatim; node ranks follow
    # the hostfile; MASTER_ADDR is its first host; every line carries its host and rank.
    printf '# forwarded to every host\nFROM_FILE=a b $c "d"\n' >>.ddp_env
    awkward=("two words" "it's" '$HOME' '"q"' '`id`' 'a;b' '')
    status=0
    on 2 env FORWARDED="it's \"quoted\" \$HOME \\" timeout -s KILL 90 "$launch" --hostfile hostfile \
      --ssh_cmd "$ssh_cmd" --master_port $port --env FORWARDED "$test_worker" --out "$work/out" --print hi \
      "${awkward[@]}" >"$work/run.log" 2>&1 || status=$?
    expect_status 0
    for r in 0 1 2 3; do
      f="out/rank$r.attempt0"
      [[ -f $f ]] || fail "rank $r did not run"
      got=$(sed -n 's/^argv=//p' "$f" | tail -n ${#awkward[@]})
      want=$(printf '%s\n' "${awkward[@]}")
      [[ $got == "$want" ]] || fail "rank $r's arguments: '$got', not '$want'"
      grep -qxF 'env:FROM_FILE=a b $c "d"' "$f" || fail "rank $r: FROM_FILE from .ddp_env not forwarded verbatim"
      grep -qxF "env:FORWARDED=it's \"quoted\" \$HOME \\" "$f" || fail "rank $r: --env FORWARDED not verbatim"
      grep -qxF "env:MASTER_ADDR=host1" "$f" || fail "rank $r: MASTER_ADDR is not host1, the file's first"
      expect_line run.log "$(host_of_rank $r): [rank $r]: hi"
    done
    [[ $(count_lines run.log "=====") == 0 ]] || fail "a failure summary after a job that succeeded"
    # A real job over the hosts: Gloo collectives across host1 and host0 (2 x 2 ranks).
    job collectives.log --hostfile hostfile --ssh_cmd "$ssh_cmd" --master_port $((port + 1)) "$worker" collectives
    expect_status 0
    for r in 0 1 2 3; do expect_line collectives.log "$(host_of_rank $r): [rank $r]: OK: collectives on rank"; done
    # --include host0:1: host0 alone, node 0 and master, one worker on its slot 1 (as its GPU).
    rm -rf out && mkdir out
    job include.log --hostfile hostfile --include host0:1 --ssh_cmd "$ssh_cmd" --master_port $((port + 2)) \
      "$test_worker" --out "$work/out" --print hi
    expect_status 0
    expect_line include.log "host0: [rank 0]: hi"
    [[ $(count_lines include.log "host1:") == 0 ]] || fail "--include host0:1 started host1"
    [[ $(ls out) == rank0.attempt0 ]] || fail "--include host0:1 ran $(ls out | tr '\n' ' ')"
    for want in WORLD_SIZE=1 MASTER_ADDR=host0 CUDA_VISIBLE_DEVICES=1; do
      grep -qxF "env:$want" out/rank0.attempt0 || fail "--include host0:1: the worker has no $want"
    done
    wait_no_remote 10
    echo "run: arguments and variables verbatim on 2 hosts; collectives on 2 x 2 ranks; --include"
    ;;
  elastic)
    # --hosts with --nnodes 1:2 (docs/launcher.md "Elastic membership"): host1's launcher SIGKILLed
    # mid-job is not restarted and host0 goes on alone (round 1, WORLD_SIZE 1); host1 started again
    # by hand with the same --rdzv_endpoint/--rdzv_id joins (round 2, WORLD_SIZE 2); the job exits 0.
    printf '%s\n' '#!/bin/sh' 'echo "world $WORLD_SIZE round $TORCHELASTIC_RESTART_COUNT"' \
      "for i in \$(seq 300); do [ -e '$work/finish' ] && exit 0; sleep 0.1; done" 'exit 3' >elastic_worker.sh
    chmod +x elastic_worker.sh
    elastic_flags=(--nnodes 1:2 --rdzv_id el1 --rdzv_conf last_call_timeout=1 --max_restarts 3 --monitor_interval 0.05
      --shutdown_grace 3)
    bg_job elastic.log --hosts host0:1,host1:1 --ssh_cmd "$ssh_cmd" "${elastic_flags[@]}" "$work/elastic_worker.sh"
    wait_for_line() {  # wait_for_line LOG TEXT: within 30 s
      local deadline=$((SECONDS + 30))
      until grep -q -F -- "$2" "$work/$1" 2>/dev/null; do
        ((SECONDS < deadline)) || fail "no line with '$2' in $1 within 30 s"
        sleep 0.1
      done
    }
    # Node ranks are the order in which the launchers claimed their slots (docs/launcher.md): either
    # host may be node 0 of round 0.
    wait_for_line elastic.log "]: world 2 round 0"
    deadline=$((SECONDS + 30))
    until (($(count_lines elastic.log "]: world 2 round 0") == 2)); do
      ((SECONDS < deadline)) || fail "round 0 did not start both workers within 30 s"
      sleep 0.1
    done
    [[ $(count_lines elastic.log "host0: [rank") == 1 && $(count_lines elastic.log "host1: [rank") == 1 ]] ||
      fail "round 0 did not run one worker on each host"
    victim=""
    for p in $(ip netns pids "$name-h1"); do [[ $(cat "/proc/$p/comm" 2>/dev/null) != ddp_launch ]] || victim=$p; done
    [[ -n $victim ]] || fail "no ddp_launch on host 1"
    kill -KILL "$victim"
    wait_for_line elastic.log "host0: [rank 0]: world 1 round 1"
    expect_line elastic.log "the elastic job goes on without it (not restarted"
    on 1 timeout -s KILL 60 "$launch" --rdzv_endpoint host0:29400 "${elastic_flags[@]}" "$work/elastic_worker.sh" \
      >"$work/by_hand.log" 2>&1 &
    by_hand=$!
    pids+=("$by_hand")
    wait_for_line elastic.log "world 2 round 2"
    wait_for_line by_hand.log "world 2 round 2"
    touch "$work/finish"
    status=0
    wait "$bg" || status=$?
    expect_status 0
    wait "$by_hand" || fail "the launcher started by hand on host1 failed: $(tail -n 3 "$work/by_hand.log")"
    [[ $(count_lines elastic.log "host1: [rank") == 1 ]] || fail "host1 was restarted by the local launcher"
    wait_no_remote 10
    # Only the SIGKILLed launcher's run folder is left (it could not clean up).
    [[ $(ls tmp | wc -l) == 1 ]] || fail "run folders left: $(ls tmp | tr '\n' ' ') (only the killed launcher's may be)"
    rm -rf tmp/*
    echo "elastic: host1 lost (host0 alone in round 1), host1 by hand joined round 2, exit 0"
    ;;
  failure)
    # Rank 3 on host1 exits 7: every host stops, the exit code is rank 3's, one summary names it.
    job failure.log --hosts host0:2,host1:2 --ssh_cmd "$ssh_cmd" --master_port $port --shutdown_grace 5 \
      "${failing_worker[@]}"
    expect_status 7
    expect_line failure.log "ddp_launch: job FAILED: host1 (node 1) of 2 failed first, exit code 7"
    expect_line failure.log "  message   : rank 3 gave up"
    # host0 is stopped by the launchers' job channel (exit 1) or by its closed stdin (SIGTERM, 143),
    # whichever comes first (Note [Coordinated restarts]); either way it reports, never ssh's 255.
    grep -qE -- "^  host0 \(node 0\): exit code (1|143) \(stopped after it\)$" "$work/failure.log" ||
      fail "host0 was not reported as stopped after host1 (exit code 1 or 143) in failure.log"
    [[ $(count_lines failure.log "================") == 2 ]] || fail "not exactly one failure summary"
    wait_no_remote 10
    for r in 0 1 2; do [[ -f out/sigterm$r ]] || fail "rank $r was not stopped with SIGTERM"; done
    echo "failure: exit 7 from rank 3 on host1, one summary, host0 stopped"
    ;;
  stop)
    # SIGTERM to the local launcher: every host stops its workers (SIGTERM), exit 143.
    sleepers sigterm.log 0
    kill_launcher TERM
    status=0
    wait "$bg" || status=$?
    expect_status 143
    wait_no_remote 10
    all_stopped "SIGTERM"
    # The local launcher SIGKILLed: each remote launcher sees its stdin close and stops its workers.
    sleepers sigkill.log 1
    kill_launcher KILL
    wait_no_remote 20
    all_stopped "SIGKILL"
    # host1's ssh connection dropped (its ssh process killed): host1's launcher stops its workers;
    # the local launcher names host1 and stops host0.
    sleepers drop.log 2
    for p in $(ip netns pids "$name-h2"); do
      [[ $(cat "/proc/$p/comm" 2>/dev/null) == ssh && $(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") == *" host1 "* ]] &&
        kill -KILL "$p"
    done
    status=0
    wait "$bg" || status=$?
    # ssh killed by SIGKILL: 137 (a connection lost on the network: ssh's 255).
    expect_status 137
    expect_line drop.log "ddp_launch: job FAILED: host1 (node 0) of 2 failed first, exit code 137"
    wait_no_remote 20
    all_stopped "dropped"
    echo "stop: SIGTERM, SIGKILL of the local launcher and a dropped connection stop every host"
    ;;
  check)
    # Host problems are found before anything starts: one line naming the host, exit 2.
    printf 'host0 slots=1\n198.18.0.9 slots=1\n' >unreachable
    job unreachable.log --hostfile unreachable --ssh_cmd "$ssh_cmd" "$test_worker" --out "$work/out"
    expect_status 2
    expect_line unreachable.log "ddp_launch: error: host 198.18.0.9 (node 1): --ssh_cmd failed (exit 255): ssh: connect to host 198.18.0.9 port 22"
    [[ $(count_lines unreachable.log "error:") == 1 ]] || fail "unreachable: not one error line"
    ssh-keygen -q -t ed25519 -N '' -f "$keys/stranger"
    job refused.log --hosts host0,host1 --ssh_cmd "${ssh_cmd/client/stranger}" "$test_worker" --out "$work/out"
    expect_status 2
    expect_line refused.log "ddp_launch: error: host host1 (node 1): --ssh_cmd failed (exit 255): root@host1: Permission denied (publickey)."
    job missing.log --hostfile hostfile --ssh_cmd "$ssh_cmd" "$work/hidden/worker" --out "$work/out"
    expect_status 2
    expect_line missing.log "ddp_launch: error: host host1 (node 0): training binary '$work/hidden/worker' does not exist (exit 2)"
    [[ $(count_lines missing.log "error:") == 1 ]] || fail "missing binary: not one error line"
    printf 'host0 slots=1\nhost1 slots=1\nhost0 slots=1\n' >duplicate
    job duplicate.log --hostfile duplicate --ssh_cmd "$ssh_cmd" "$test_worker"
    expect_status 2
    expect_line duplicate.log "ddp_launch: error: hostfile duplicate line 3: host host0 is listed twice (also line 1)"
    printf 'host0 slots=1\nhost1 slots=one\n' >malformed
    job malformed.log --hostfile malformed --ssh_cmd "$ssh_cmd" "$test_worker"
    expect_status 2
    expect_line malformed.log "ddp_launch: error: hostfile malformed line 2 (host host1) slots= expects an integer"
    [[ -z $(ls out) ]] || fail "a worker ran although a host check failed"
    echo "check: unreachable, refused, binary missing, duplicate, malformed: one line each, exit 2"
    ;;
  pdsh_clush)
    # clush (stdin passed on) fits as it is; pdsh -R ssh starts the job and passes the exit code on
    # (see docs/launcher.md for what it cannot do).
    job clush.log --hostfile hostfile --ssh_cmd "clush -S -N -o '$ssh_options' -w" --master_port $port \
      --shutdown_grace 5 "${failing_worker[@]}"
    expect_status 7
    expect_line clush.log "ddp_launch: job FAILED: host0 (node 1) of 2 failed first, exit code 7"
    wait_no_remote 10
    for r in 0 1 2; do [[ -f out/sigterm$r ]] || fail "clush: rank $r was not stopped with SIGTERM"; done
    # pdsh does not pass stdin on: the other host stops when ddp_launch ends its pdsh (SIGTERM after
    # --shutdown_grace + 5 s), whose ssh then closes the channel.
    rm -rf out && mkdir out
    status=0
    on 2 env PDSH_SSH_ARGS="$ssh_options -l%u %h" timeout -s KILL 90 "$launch" --hostfile hostfile \
      --ssh_cmd "pdsh -S -N -R ssh -w" --master_port $((port + 1)) --shutdown_grace 1 "${failing_worker[@]}" \
      --print hi >"$work/pdsh.log" 2>&1 || status=$?
    expect_status 7
    for r in 0 1 2 3; do expect_line pdsh.log "$(host_of_rank $r): [rank $r]: hi"; done
    expect_line pdsh.log "ddp_launch: job FAILED: host0 (node 1) of 2 failed first, exit code 7"
    wait_no_remote 10 # the remote launchers stop after their pdsh ended
    for r in 0 1; do [[ -f out/sigterm$r ]] || fail "pdsh: rank $r was not stopped with SIGTERM"; done
    # The local launcher SIGKILLed: pdsh gets SIGTERM (PR_SET_PDEATHSIG), its ssh ends, and so do
    # the hosts' launchers.
    rm -rf out && mkdir out
    on 2 env PDSH_SSH_ARGS="$ssh_options -l%u %h" timeout -s KILL 90 "$launch" --hostfile hostfile \
      --ssh_cmd "pdsh -S -N -R ssh -w" --master_port $((port + 2)) --shutdown_grace 5 "${sleeping_worker[@]}" \
      >"$work/pdsh_kill.log" 2>&1 &
    bg=$!
    pids+=("$bg")
    wait_files 4 "out/rank*.attempt0"
    kill_launcher KILL
    wait_no_remote 20
    echo "pdsh_clush: clush stops every host; pdsh starts the job, passes exit codes, is ended to stop a host"
    ;;
  measure)
    # Not a test (figures, no pass/fail): start-to-exit of a 2 x 2 job of workers that exit at
    # once, `ddp_launch --hostfile` (its check included) against one ssh per host started by hand,
    # alternating, 5 runs each; medians in seconds.
    median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
    one=() hand=()
    for rep in 1 2 3 4 5; do
      t=$EPOCHREALTIME
      job measure.log --hostfile hostfile --ssh_cmd "$ssh_cmd ${MEASURE_SSH_OPTIONS:-}" --master_port $((port + rep)) \
        "$test_worker"
      expect_status 0
      one+=("$(awk -v a="$t" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }')")
      t=$EPOCHREALTIME
      for k in 0 1; do
        on 2 $ssh_cmd "host$((1 - k))" "cd $work && $launch --nnodes=2 --node_rank=$k --master_addr=host1 \
          --master_port=$((port + 10 + rep)) --nproc_per_node=2 $test_worker" >>"$work/hand.log" 2>&1 &
        pids+=($!)
      done
      wait "${pids[@]: -2}"
      hand+=("$(awk -v a="$t" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }')")
    done
    echo "ddp_launch --hostfile: median $(printf '%s\n' "${one[@]}" | median) s (${one[*]})"
    echo "ssh per host by hand:  median $(printf '%s\n' "${hand[@]}" | median) s (${hand[*]})"
    ;;
  *)
    fail "unknown scenario"
    ;;
esac
no_run_folders "at the end"
