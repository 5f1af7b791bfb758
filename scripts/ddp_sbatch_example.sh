#!/usr/bin/env bash
# Example Slurm batch script: 2 nodes x 4 GPUs, one ddp_launch per node (started by srun).
# Submit with:  sbatch scripts/ddp_sbatch_example.sh build/bin/train_fashion_mnist --mode ddp --epochs 1
#
# Under srun, ddp_launch reads SLURM_NNODES (--nnodes), SLURM_NODEID (--node_rank) and the first host
# of SLURM_JOB_NODELIST (--master_addr), and derives --master_port from SLURM_JOB_ID
# (10000 + SLURM_JOB_ID % 50000), so no topology flag is needed. Flags given explicitly win.
#SBATCH --job-name=ddp-example
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1          # one launcher per node; it starts the workers itself
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --time=01:00:00
#SBATCH --output=ddp-%j.out
set -euo pipefail

root=${DDP_ROOT:-$(pwd)}
launcher="$root/build/bin/ddp_launch"
[[ $# -ge 1 ]] || { echo "usage: sbatch $0 TRAINING_BINARY [its arguments...]" >&2; exit 2; }

# --gpus auto: on each node, pick the GPUs with the most free memory and no other process.
# --log_dir: one folder per job, attempt and rank (DIR/<run id>_<random>/attempt_<k>/<rank>/{stdout,stderr}.log).
srun --kill-on-bad-exit=1 "$launcher" \
  --nproc_per_node 4 \
  --gpus auto \
  --max_restarts 1 \
  --run_id "slurm-$SLURM_JOB_ID" \
  --log_dir "$root/logs" \
  "$@"
