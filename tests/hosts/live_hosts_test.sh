#!/usr/bin/env bash
# ddp_launch --recovery live: a whole host lost is marked gone by the launchers (See Note [Lost hosts
# in a live job] in launcher/channel/live_watch.cpp), on network-namespace hosts:
#   live_hosts_test.sh NETNS_CLUSTER DDP_LAUNCH LIVE_RECOVERY_DEMO
# 3 hosts x 1 worker (--nnodes 2:3, so the job is at MAX), the demo with a settle timeout of 60 s, so
# that only the launchers' mark explains a round closed before it:
#   1. host2 SIGKILLed (every process in it): host0's launcher (it serves the store) names the lost
#      node and host2's address and marks its 1 worker gone; the survivors close the next round by
#      the left count, not the settle timeout, and go on at world size 2.
#   2. a 4th host (host3) is started: the job is at MAX = 3 by its rendezvous round, but the lost
#      node no longer counts, so host3 is admitted and trains at world size 3.
#   3. host1's link goes down (a partition: nothing closes): after the liveness timeout
#      (--rdzv_conf keep_alive_interval=0.5,keep_alive_max_attempt=4: 2 s) host0's launcher marks it
#      gone, the round closes by the left count, host0 and host3 finish at world size 2, equal.
#   4. one command (--hosts host0:1,host1:1,host2:1 over a fake ssh entering the namespace hosts)
#      starts a live job; host2 SIGKILLed whole: marked gone, the one command exits 0.
# Asserts by log lines, never by timing; prints the recovery figures (the time from the kill, and
# from the link down, to the next completed step on the survivors). Exits 77 (CTest skip) without
# namespaces. Every wait is bounded; the hosts and every process in them go away on exit.
set -euo pipefail

cluster=$1 launch=$2 demo=$3
source "$(dirname "${BASH_SOURCE[0]}")/bed.sh"
source "$(dirname "${BASH_SOURCE[0]}")/live_checks.sh"
bed_up "$cluster" lh 4 --no-data  # sets name and work; removes both on exit
pids=()
steps=${LIVE_HOSTS_STEPS:-300}

fail() { bed_fail "live hosts" "$@"; }
wait_for() { bed_wait_for "$@"; }  # wait_for SECONDS FILE TEXT

start() {  # start K: host K's launcher in the background (killed after 45 s), output in hostK.log
  local k=$1
  "$cluster" exec "$name" "$k" env OMP_NUM_THREADS=1 timeout -s KILL 45 "$launch" --nproc_per_node 1 \
    --monitor_interval 0.05 --shutdown_grace 3 --nnodes 2:3 --rdzv_endpoint host0:29400 --rdzv_id livehosts \
    --rdzv_timeout 20 --rdzv_conf last_call_timeout=1,keep_alive_interval=0.5,keep_alive_max_attempt=4 \
    --recovery live --max_restarts 1 \
    "$demo" --steps "$steps" --step-ms 40 --settle-ms 60000 --timeout-ms 2000 >"$work/host$k.log" 2>&1 &
  pids[$k]=$!
}

# One port per job (See Note [One port per job] in launcher/rendezvous/rendezvous.h): the rendezvous port's
# neighbour, taken on the store's host, changes nothing; the liveness channel listens on a port the
# OS picked, published in the store, and the other launchers find it there.
"$cluster" exec "$name" 0 timeout -s KILL 60 python3 -c "
import os, socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('$("$cluster" addr "$name" 0)', 29401)); s.listen()
while not os.path.exists('$work/unblock'): time.sleep(0.05)" &
blocker=$!
deadline=$((SECONDS + 10))
until [[ -n $("$cluster" exec "$name" 0 ss -Hltn "sport = :29401") ]]; do
  ((SECONDS < deadline)) || fail "the port blocker did not listen within 10 s"
  sleep 0.1
done

live_start_hosts start 0 1 2
for k in 0 1 2; do wait_for 30 "$work/host$k.log" "live demo: step 10 world 3"; done
touch "$work/unblock"
wait "$blocker" || fail "the port blocker failed"
watch_port=$(sed -n 's/.*watching the live job.s launchers on port \([0-9]*\).*/\1/p' "$work/host0.log" | head -n 1)
[[ -n $watch_port && $watch_port != 29401 && $watch_port != 29400 ]] ||
  fail "the liveness channel's port is '$watch_port', not one the OS picked: $(grep watching "$work/host0.log")"

# 1. host2 lost whole.
addr2=$("$cluster" addr "$name" 2)
victims=$(ip netns pids "$name-h2")
[[ -n $victims ]] || fail "no process in host 2"
killed_ms=$(date +%s%3N)
# shellcheck disable=SC2086  # one pid a word
kill -KILL $victims
wait "${pids[2]}" || true
wait_for 20 "$work/host0.log" "world 2 at_ms"
grep -q -E "lost node node[0-9] \(.* at $addr2\): its launcher's connection closed; marked 1 worker\(s\) gone" \
  "$work/host0.log" || fail "host 0's launcher did not name host 2 ($addr2) lost and mark its 1 worker gone"
closed=$(grep -h -F "closed by the left count" "$work/host0.log" "$work/host1.log") ||
  fail "no survivor closed the round after host 2's loss by the left count"
grep -q -F "1 marked gone" <<<"$closed" || fail "the round after host 2's loss: $closed"

# 2. a 4th host at MAX: admitted, since the lost node no longer counts.
start 3
wait_for 30 "$work/host3.log" "world 3 at_ms"
grep -q -F "joining the running job" "$work/host3.log" || fail "host 3's launcher did not join the running job"
grep -q -F "1 lost node(s) no longer counted" "$work/host0.log" ||
  fail "host 0's launcher did not admit host 3 in place of the lost node"

# 3. host1 partitioned: nothing closes, the launchers' silence timeout marks it.
addr1=$("$cluster" addr "$name" 1)
wait_for 20 "$work/host1.log" "world 3 at_ms"
down_ms=$(date +%s%3N)
"$cluster" exec "$name" 1 ip link set eth0 down
for k in 0 3; do
  status=0
  wait "${pids[$k]}" || status=$?
  ((status == 0)) || fail "host $k's launcher exited with $status"
done
grep -q -E "lost node node[0-9] \(.* at $addr1\): nothing heard from its launcher for 2 s .*; marked 1 worker\(s\) gone" \
  "$work/host0.log" || fail "host 0's launcher did not mark the partitioned host 1 ($addr1) gone"
# The round after the kill and the one after the partition, each closed with 1 marked gone.
(($(cat "$work/host0.log" "$work/host1.log" "$work/host3.log" | grep -c -F "closed by the left count") >= 2)) ||
  fail "no survivor closed a round by the left count after host 1's partition"
! grep -q -F "closed after the settle timeout" "$work/host0.log" "$work/host1.log" "$work/host3.log" ||
  fail "a round closed by the settle timeout: $(grep -h -F "closed after the settle timeout" "$work"/host*.log)"
sums=()
for k in 0 3; do
  log=$work/host$k.log
  (($(grep -c "live demo: started pid" "$log") == 1)) || fail "host $k's worker was started more than once"
  finished=$(grep -F "live demo: finished $steps steps pid " "$log") || fail "host $k: no 'finished $steps steps'"
  sums[$k]=${finished##* params }
done
[[ ${sums[0]} == "${sums[3]}" ]] || fail "the survivors' parameters differ: ${sums[0]} vs ${sums[3]}"

# The figures: from the kill (and from the link down) to the survivors' next completed step.
log=$work/host0.log
at_kill=$(awk -v t="$killed_ms" '/live demo: step [0-9]+ world 2 at_ms/ && $NF > t { print $NF; exit }' "$log")
at_down=$(awk -v t="$down_ms" '/live demo: step [0-9]+ world 2 at_ms/ && $NF > t { print $NF; exit }' "$log")
[[ -n $at_kill && -n $at_down ]] || fail "no step at world 2 after the kill or after the link down in host0.log"
echo "live hosts figure: $((at_kill - killed_ms)) ms from host 2 SIGKILLed to the survivors' next completed step" \
  "(settle timeout 60 s: the launchers' mark closed the round)"
echo "live hosts figure: $((at_down - down_ms)) ms from host 1's link down to the survivors' next completed step" \
  "(collective timeout 2 s, liveness timeout 2 s)"

# 4. One command (--hosts, over a fake ssh that enters the namespace host) starts a live job on 3
# hosts; host2 SIGKILLed whole (its ssh with it): the first host's launcher marks it gone, the job
# goes on and the one command exits 0.
victims=$(ip netns pids "$name-h1")  # the partitioned host's launcher and worker
# shellcheck disable=SC2086  # one pid a word
[[ -z $victims ]] || kill -KILL $victims
wait "${pids[1]}" || true
"$cluster" exec "$name" 1 ip link set eth0 up
cat >"$work/fake_ssh" <<FAKE
#!/usr/bin/env bash
host=\$1
shift
exec "$cluster" exec "$name" "\${host#host}" bash -c "\$*"
FAKE
chmod +x "$work/fake_ssh"
hsteps=200
env OMP_NUM_THREADS=1 timeout -s KILL 45 "$launch" --hosts host0:1,host1:1,host2:1 --ssh_cmd "$work/fake_ssh" \
  --nnodes 2:3 --rdzv_endpoint host0:29410 --rdzv_id onecmd --rdzv_timeout 20 \
  --rdzv_conf last_call_timeout=2 --recovery live --monitor_interval 0.05 --shutdown_grace 3 \
  "$demo" --steps $hsteps --step-ms 40 --settle-ms 60000 --timeout-ms 2000 >"$work/hosts_one.log" 2>&1 &
one=$!
for k in 0 1 2; do
  deadline=$((SECONDS + 30))
  until grep -q -F "host$k: [rank" "$work/hosts_one.log"; do
    ((SECONDS < deadline)) || fail "--hosts: no 'host$k: [rank' within 30 s: $(grep -v -F "live demo: step" "$work/hosts_one.log" | head -40)"
    sleep 0.05
  done
done
deadline=$((SECONDS + 30))
for k in 0 1 2; do
  until grep -q -E "host$k: \[rank [0-9]+\]: live demo: step [0-9]+ world 3 " "$work/hosts_one.log"; do
    ((SECONDS < deadline)) || fail "--hosts: host$k did not train at world size 3 within 30 s"
    sleep 0.05
  done
done
victims=$(ip netns pids "$name-h2")
# shellcheck disable=SC2086  # one pid a word
kill -KILL $victims
status=0
wait "$one" || status=$?
((status == 0)) || fail "--hosts --recovery live: the one command exited with $status: $(tail -20 "$work/hosts_one.log")"
grep -q -E "lost node node[0-9] \(host2 at $addr2\): its launcher's connection closed; marked 1 worker\(s\) gone" \
  "$work/hosts_one.log" || fail "--hosts: host2's loss was not marked by the launchers: $(tail -20 "$work/hosts_one.log")"
grep -q -F "closed by the left count" "$work/hosts_one.log" || fail "--hosts: no round closed by the left count"
(($(grep -c "live demo: finished $hsteps steps" "$work/hosts_one.log") == 2)) ||
  fail "--hosts: the 2 survivors did not both finish $hsteps steps"

echo "live hosts: ok (a lost host and a partitioned one marked gone by the launchers, a 4th host admitted at MAX," \
  "one --hosts command through a host loss, params ${sums[0]})"
