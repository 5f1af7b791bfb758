#!/usr/bin/env bash
# test_killed_job.sh LAUNCHER WORKER DIR: a job of 2 workers holding GPU memory is killed through its
# launcher (SIGTERM); afterwards no worker process is alive and NVML (nvidia-smi) lists none of them on
# the GPU. Exit 77 (skipped) without nvidia-smi or a GPU.
set -uo pipefail
launcher=$1 worker=$2 dir=$3
command -v nvidia-smi >/dev/null || { echo "SKIPPED: nvidia-smi (NVML) is not installed"; exit 77; }
gpu_pids() { nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' '; }
rm -rf "$dir" && mkdir -p "$dir"
"$launcher" --nproc_per_node 2 --master_port 0 "$worker" hold --marker "$dir" --seconds 120 &
job=$!
for _ in $(seq 600); do
  (($(find "$dir" -maxdepth 1 -name '[0-9]*' ! -name '*.tmp' | wc -l) >= 2)) && break
  sleep 0.1
done
mapfile -t pids < <(find "$dir" -maxdepth 1 -name '[0-9]*' ! -name '*.tmp' -printf '%f\n')
if ((${#pids[@]} < 2)); then
  echo "FAILED: the workers did not start within 60 s"; kill -TERM "$job" 2>/dev/null; wait "$job"; exit 1
fi
listed=$(gpu_pids)
seen=0
for pid in "${pids[@]}"; do grep -qx "$pid" <<<"$listed" && seen=$((seen + 1)); done
echo "workers ${pids[*]}: NVML lists $seen of them on the GPU before the kill"
kill -TERM "$job"
for _ in $(seq 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then echo "FAILED: the launcher is still running 30 s after SIGTERM"; kill -KILL "$job"; exit 1; fi
wait "$job"
status=0
for pid in "${pids[@]}"; do
  if kill -0 "$pid" 2>/dev/null; then echo "FAILED: worker $pid is still alive"; kill -KILL "$pid"; status=1; fi
done
for _ in $(seq 100); do
  left=$(gpu_pids | grep -xF -f <(printf '%s\n' "${pids[@]}") || true)
  [[ -z $left ]] && break
  sleep 0.1
done
if [[ -n $left ]]; then echo "FAILED: NVML still lists $left on the GPU 10 s after the job ended"; status=1; fi
((seen == 0)) && echo "note: NVML listed no process of this job even while it ran (a sandbox hides them?)"
((status == 0)) && echo "no worker left, none listed on the GPU"
exit $status
