#!/usr/bin/env bash
# A real Slurm cluster on the network-namespace hosts (scripts/netns-cluster.sh, docs/hosts.md):
#   slurm_test.sh NETNS_CLUSTER DDP_LAUNCH TRAIN_FASHION_MNIST SBATCH_EXAMPLE
# Debian's slurmctld on host0, a slurmd on each of 3 hosts (own spool, pid and log files), one munged
# with a key made for this run; a slurm.conf naming the namespace hosts and their 198.18.0.x
# addresses only. Then:
#   1. `sbatch SBATCH_EXAMPLE train_fashion_mnist ...` on 3 nodes: one ddp_launch per node; after the
#      first steps `scancel --signal=USR1` reaches the workers through srun and ddp_launch, rank 0
#      writes a checkpoint, the job requeues itself, runs again, resumes from that checkpoint and
#      completes;
#   2. `srun -N3 --ntasks-per-node 1 train_fashion_mnist` with no ddp_launch: the library takes rank,
#      size, master (host0) and port (from SLURM_JOB_ID) from Slurm's variables and trains.
# Exits 77 (CTest skip) without the rights to make namespaces or without Slurm, munge or the data.
# Everything is started here and removed on exit (the hosts take every daemon with them).
set -euo pipefail

launch=$2 train=$3 example=$4
source "$(dirname "${BASH_SOURCE[0]}")/bed.sh"
bed_up "$1" sl 3 munged slurmctld slurmd sbatch srun scancel scontrol sinfo

fail() {
  echo "FAIL (slurm): $*"
  local log
  for log in "$work"/*.log "$work"/*.out "$work"/run/*.out; do
    [[ -f $log ]] || continue
    echo "---- $log"
    tail -n 30 "$log" | tr '\r' '\n' | tail -n 30
  done
  exit 1
}
on() {  # on K COMMAND...: COMMAND on host K
  local k=$1
  shift
  "$cluster" exec "$name" "$k" "$@"
}
export SLURM_CONF=$work/slurm.conf

# munge: a key of this run's own, its socket in the work folder (munged listens on no address).
head -c 1024 /dev/urandom >"$work/munge.key"
chmod 400 "$work/munge.key"
on 0 munged --force --key-file="$work/munge.key" --socket="$work/munge.sock" --pid-file="$work/munged.pid" \
  --log-file="$work/munged.log" --seed-file="$work/munged.seed" || fail "munged did not start"

cpus=$(nproc)
mkdir -p "$work/state" "$work/spool/host0" "$work/spool/host1" "$work/spool/host2" "$work/run"
{
  echo "ClusterName=ddptest$$"
  echo "SlurmctldHost=host0($("$cluster" addr "$name" 0))"
  echo "SlurmUser=root"
  echo "AuthType=auth/munge"
  echo "AuthInfo=socket=$work/munge.sock"
  echo "CredType=cred/munge"
  echo "StateSaveLocation=$work/state"
  echo "SlurmdSpoolDir=$work/spool/%n"
  echo "SlurmctldPidFile=$work/slurmctld.pid"
  echo "SlurmdPidFile=$work/slurmd.%n.pid"
  echo "SlurmctldLogFile=$work/slurmctld.log"
  echo "SlurmdLogFile=$work/slurmd.%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "SchedulerType=sched/builtin"
  echo "SelectType=select/linear"
  echo "MpiDefault=none"
  echo "ReturnToService=2"
  echo "JobRequeue=1"
  for k in 0 1 2; do
    echo "NodeName=host$k NodeAddr=$("$cluster" addr "$name" $k) CPUs=$cpus CoresPerSocket=$cpus RealMemory=100"
  done
  echo "PartitionName=debug Nodes=host[0-2] Default=YES MaxTime=INFINITE State=UP"
} >"$SLURM_CONF"
# slurmd's cgroup plugin wants /sys/fs/cgroup, which `ip netns exec` replaces with an empty sysfs:
# mount cgroup v1 hierarchies there, in the host's private mount namespace (nothing outside changes).
printf 'CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n' >"$work/cgroup.conf"
cat >"$work/with_cgroups.sh" <<'SH'
#!/bin/sh
mount -t tmpfs cgroups /sys/fs/cgroup || exit 1
for c in freezer cpuset memory devices; do
  mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c || exit 1
done
exec "$@"
SH
chmod +x "$work/with_cgroups.sh"
on 0 timeout -s KILL 110 slurmctld -D -i -f "$SLURM_CONF" >"$work/slurmctld.out" 2>&1 &
for k in 0 1 2; do
  on $k "$work/with_cgroups.sh" timeout -s KILL 110 slurmd -D -f "$SLURM_CONF" -N host$k >"$work/slurmd$k.out" 2>&1 &
done
idle=""
for _ in $(seq 60); do
  idle=$(on 0 sinfo -h -o '%D %T' 2>/dev/null || true)
  [[ $idle == "3 idle" ]] && break
  sleep 0.5
done
[[ $idle == "3 idle" ]] || fail "the cluster did not come up with 3 idle nodes (sinfo: '$idle')"

job_state() { on 0 scontrol show job "$1" | grep -o -E 'JobState=[A-Z_]+' | cut -d= -f2; }
wait_state() {  # wait_state JOB STATE SECONDS
  local state="" i
  for ((i = 0; i < $3 * 2; i++)); do
    state=$(job_state "$1")
    [[ $state == "$2" ]] && return 0
    sleep 0.5
  done
  fail "job $1 is $state, not $2, after $3 s"
}

# 1. sbatch through ddp_launch; USR1, checkpoint, requeue, resume.
# 8 epochs of 10 steps (0.4 to 0.8 s each here): USR1 must land while training runs; with 2 epochs an
# idle machine finished them before the signal (1 s after the start, plus Slurm's delivery) arrived.
out="$work/run/job.out"
job=$(on 0 env DDP_ROOT="$work/run" DDP_LAUNCH="$launch" DDP_NPROC_PER_NODE=1 DDP_CHECKPOINT_DIR="$work/run/ck" \
  sbatch --parsable -N3 -o "$out" -D "$work/run" "$example" \
  "$train" --mode ddp --limit 960 --epochs 8 --batch-size 32 --seed 3) || fail "sbatch refused the example"
for _ in $(seq 80); do
  grep -q "starting from scratch" "$out" 2>/dev/null && break
  sleep 0.5
done
grep -q "starting from scratch" "$out" || fail "job $job's training did not start"
sleep 1
on 0 scancel --signal=USR1 "$job"
for _ in $(seq 60); do
  grep -q "requeueing" "$out" && break
  sleep 0.5
done
grep -q "requeueing" "$out" || fail "job $job did not stop for requeue after SIGUSR1"
grep -q "signal USR1: checkpoint of step [0-9]* written" "$out" || fail "no checkpoint written on SIGUSR1"
step=$(grep -o "checkpoint of step [0-9]*" "$out" | head -1 | grep -o "[0-9]*$")
# Note [Releasing a requeued job]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Slurm holds a requeued batch job for 120 s (its begin time); an administrator's `StartTime=now`
# releases it. The hold is there for a reason: the requeue revokes the job's credential on its nodes,
# and a slurmd refuses any credential of that job issued in the same second as the revocation or
# before (whole seconds: ctime <= revoked). Released within that second, the new run's batch launch
# is refused and the job ends FAILED at once ("Killing non-startable batch JobId=1: Job credential
# revoked" in slurmctld.log), which a loaded machine made likely. So: wait for PENDING (the
# revocation is sent when the job becomes PENDING), then more than a second, then release.
state=""
for _ in $(seq 20); do
  state=$(job_state "$job")
  [[ $state == PENDING ]] && break
  sleep 0.5
done
[[ $state == PENDING ]] || fail "job $job is $state, not PENDING, 10 s after it asked to be requeued"
sleep 1.2
on 0 scontrol update JobId="$job" StartTime=now || fail "cannot release the requeued job"
wait_state "$job" COMPLETED 60
grep -q "run 1 (restarts after a requeue)" "$out" || fail "the job did not run a second time"
grep -q "resuming from $work/run/ck/step-$(printf %012d "$step")" "$out" ||
  fail "the requeued job did not resume from the checkpoint of step $step"
grep -q "starting 1 workers (ranks 2..2 of 3) on node 2 of 3, master host0:" "$out" ||
  fail "ddp_launch on host2 did not take its node from Slurm"
[[ -f $work/run/ck/step-000000000080/MANIFEST ]] || fail "the resumed job did not train to its end (step 80)"
echo "sbatch: 3 nodes through ddp_launch, SIGUSR1 at step $step, requeued, resumed, completed"

# 2. srun starts the training binary directly: no launcher, Slurm's variables.
on 0 timeout -s KILL 60 srun -N3 --ntasks-per-node 1 -D "$work/run" \
  "$train" --mode ddp --limit 384 --epochs 1 --batch-size 32 >"$work/srun.out" 2>&1 || fail "srun's training failed"
grep -q -E "rank 0 of 3 from slurm \(SLURM_PROCID=0, SLURM_NTASKS=3\), master host0:[0-9]+ from the first host of SLURM_JOB_NODELIST and SLURM_JOB_ID" \
  "$work/srun.out" || fail "rank 0 did not say it took its place and its master from Slurm"
grep -q "3 process(es)" "$work/srun.out" || fail "srun's job did not train with 3 processes"
grep -q "final test accuracy" "$work/srun.out" || fail "srun's job did not finish training"
echo "srun: the binary trained on 3 nodes from Slurm's variables alone"
echo "PASS (slurm)"
