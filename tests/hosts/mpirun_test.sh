#!/usr/bin/env bash
# OpenMPI's mpirun starts the training binary directly on 2 network-namespace hosts
# (scripts/netns-cluster.sh): no ddp_launch; the library takes rank and size from
# OMPI_COMM_WORLD_*, the master from `-x MASTER_ADDR -x MASTER_PORT` (See Note [Launch sources]).
#   mpirun_test.sh NETNS_CLUSTER TRAIN_FASHION_MNIST
# mpirun reaches host1 through its rsh agent (--mca plm_rsh_agent): a script that runs the command
# in the namespace host (`netns-cluster.sh exec`), in place of ssh. Exits 77 (CTest skip) without the
# rights to make namespaces, without mpirun or without the data.
set -euo pipefail

train=$2
source "$(dirname "${BASH_SOURCE[0]}")/bed.sh"
bed_up "$1" mp 2 mpirun

# The rsh agent: "agent [ssh options] HOST COMMAND..." -> COMMAND on namespace host HOST.
cat >"$work/agent.sh" <<SH
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
host=\$1
shift
exec "$cluster" exec "$name" "\${host#host}" sh -c "\$*"
SH
chmod +x "$work/agent.sh"
master=$("$cluster" addr "$name" 0)
port=$((20000 + $$ % 20000))
status=0
"$cluster" exec "$name" 0 timeout -s KILL 90 mpirun --allow-run-as-root --mca plm_rsh_agent "$work/agent.sh" \
  --mca oob_tcp_if_include eth0 --host host0,host1 -np 2 -x MASTER_ADDR="$master" -x MASTER_PORT="$port" \
  sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname)" >&2; exec "$0" "$@"' \
  "$train" --mode ddp --limit 384 --epochs 1 --batch-size 32 >"$work/mpirun.log" 2>&1 || status=$?
fail() {
  echo "FAIL (mpirun): $*"
  tr '\r' '\n' <"$work/mpirun.log" | tail -n 40
  exit 1
}
((status == 0)) || fail "mpirun exited with $status"
grep -q "rank 0 on host0" "$work/mpirun.log" || fail "rank 0 did not run on host0"
grep -q "rank 1 on host1" "$work/mpirun.log" || fail "rank 1 did not run on host1"
grep -q "rank 0 of 2 from openmpi (OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=2), master $master:$port" \
  "$work/mpirun.log" || fail "rank 0 did not say it took its place from OpenMPI's variables"
grep -q "2 process(es)" "$work/mpirun.log" || fail "the job did not train with 2 processes"
grep -q "final test accuracy" "$work/mpirun.log" || fail "the job did not finish training"
echo "PASS (mpirun): 2 hosts, ranks from OMPI_COMM_WORLD_*"
