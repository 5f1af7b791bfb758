#!/usr/bin/env bash
# Example Slurm batch script: one ddp_launch per node (started by srun), each starting the node's
# workers; on SIGUSR1 (`--signal=USR1@120` below: two minutes before the time limit, or
# `scancel --signal=USR1 JOBID`) the training writes a checkpoint and stops, and the job goes back to
# the queue; started again, it resumes from that checkpoint.
#   sbatch scripts/ddp_sbatch_example.sh build/bin/train_fashion_mnist --mode ddp --epochs 10
#
# Under srun, ddp_launch reads SLURM_NNODES (--nnodes), SLURM_NODEID (--node_rank) and the first host
# of SLURM_JOB_NODELIST (--master_addr), and derives --master_port from SLURM_JOB_ID
# (10000 + SLURM_JOB_ID % 50000), so no topology flag is needed. Flags given explicitly win.
# The training program must take the examples' flags --checkpoint-dir, --checkpoint-on-signal,
# --resume and --allow-fresh-start (build/bin/train_*; see docs/examples.md).
# On GPU nodes add `#SBATCH --gpus-per-node=N` and set DDP_NPROC_PER_NODE=gpu.
#SBATCH --job-name=ddp-example
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1          # one launcher per node; it starts the workers itself
#SBATCH --signal=USR1@120            # to every step: ddp_launch forwards it to its workers
#SBATCH --requeue
#SBATCH --open-mode=append           # a requeued run appends to the same output file
#SBATCH --time=01:00:00
#SBATCH --output=ddp-%j.out
set -uo pipefail

root=${DDP_ROOT:-${SLURM_SUBMIT_DIR:-$(pwd)}}
launcher=${DDP_LAUNCH:-$root/build/bin/ddp_launch}
checkpoints=${DDP_CHECKPOINT_DIR:-$root/checkpoints/$SLURM_JOB_ID}
[[ $# -ge 1 ]] || { echo "usage: sbatch $0 TRAINING_BINARY [its arguments...]" >&2; exit 2; }
echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, run ${SLURM_RESTART_COUNT:-0} (restarts after a requeue)"

# --signals_to_handle adds SIGUSR1 to torchrun's default set: ddp_launch forwards it to the workers
#   (which checkpoint and stop) and then exits with 128 + 10.
# --log_dir: one folder per job, attempt and rank (DIR/<run id>_<random>/attempt_<k>/<rank>/{stdout,stderr}.log).
srun --kill-on-bad-exit=1 "$launcher" \
  --nproc_per_node "${DDP_NPROC_PER_NODE:-auto}" \
  --signals_to_handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
  --max_restarts 1 \
  --run_id "slurm-$SLURM_JOB_ID" \
  --log_dir "$root/logs" \
  "$@" --checkpoint-dir "$checkpoints" --checkpoint-on-signal USR1 --resume --allow-fresh-start
status=$?
if ((status == 128 + 10)); then  # SIGUSR1: the checkpoint is written; back to the queue
  echo "job $SLURM_JOB_ID: stopped on SIGUSR1 with a checkpoint in $checkpoints; requeueing"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
exit "$status"
