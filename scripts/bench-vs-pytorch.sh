#!/usr/bin/env bash
# Side by side, in one run, on this machine, rotating the order of the runs from round to round (A
# first in odd rounds, B first in even ones; with three sides A B C, B C A, C A B) and taking medians:
#   1. this library's DDP (build/bin/ddp_bench --mode ddp under ddp_launch) against PyTorch's Python DDP
#      (benchmarks/torch_ddp_reference.py under the venv's torchrun): the same models (the examples'),
#      data, per-rank batch, ranks, threads, iterations, Gloo on the CPU; for the small CNN (lenet,
#      batch 64) and ResNet-18.
#      --data synthetic (default): the in-memory synthetic batches (see Note [Synthetic data]).
#      --data fashion-mnist: Debian's Fashion-MNIST through each side's real pipeline (LeNet only):
#        C++: the examples' ImageDataset + DistributedSampler + data loader (see Note [Real data]);
#        Python, two ratios: the users' idiomatic per-sample Dataset + DataLoader + DistributedSampler
#        ("dataset"), and the whole set as one tensor indexed per batch ("tensor", Python at its best).
#   2. ddp_launch against torchrun, start-to-exit of 8 workers (build/bin/launch_startup_bench);
#   3. DP against DDP on GPUs: only where CUDA devices are present.
# Prints every round and all the ratios.
#   scripts/bench-vs-pytorch.sh [--data synthetic|fashion-mnist]
#   environment: ROUNDS=3 NPROC=2 THREADS=1 MODELS="lenet resnet18" LENET_BATCH=64 LENET_ITERS=60
#   RESNET_BATCH=16 RESNET_ITERS=10 WARMUP=3 STARTUP_REPS=5 SKIP_LAUNCH= (1: skip 2. and 3.)
#   DATA_DIR=/usr/share/datasets/fashion-mnist
#   PIN=1: pin both sides' workers to the same CPUs (C++: ddp_launch --cpu_bind exclusive; Python: each
#   torchrun worker through taskset, with the CPU list ddp_launch's dry run gives its local rank)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${DDP_BUILD_DIR:-$root/build}/bin
rounds=${ROUNDS:-3} nproc=${NPROC:-2} warmup=${WARMUP:-3}
data=synthetic
while (($#)); do
  case $1 in
    --data) data=${2:-}; shift 2 || { echo "bench-vs-pytorch: --data needs a value" >&2; exit 2; } ;;
    --data=*) data=${1#--data=}; shift ;;
    -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-vs-pytorch: unknown argument '$1' (usage: scripts/bench-vs-pytorch.sh [--data synthetic|fashion-mnist])" >&2; exit 2 ;;
  esac
done
[[ $data == synthetic || $data == fashion-mnist ]] ||
  { echo "bench-vs-pytorch: --data must be synthetic or fashion-mnist, not '$data'" >&2; exit 2; }
data_dir=${DATA_DIR:-/usr/share/datasets/fashion-mnist}
export OMP_NUM_THREADS=${THREADS:-1}
for tool in ddp_bench ddp_launch launch_startup_bench; do
  [[ -x $bin/$tool ]] || { echo "bench-vs-pytorch: no $bin/$tool: cmake --build build --target $tool" >&2; exit 2; }
done
[[ -x $root/.venv/bin/torchrun ]] || { echo "bench-vs-pytorch: no .venv/bin/torchrun: run scripts/setup.sh" >&2; exit 2; }
# The users' per-sample pipeline (--data fashion-mnist) decodes through Pillow and NumPy: install them
# into the venv when missing (PyPI or the machine's mirror; setup.sh leaves them out, the tests do
# not need them).
if [[ $data == fashion-mnist ]] && ! "$root/.venv/bin/python" -c "import PIL, numpy" 2>/dev/null; then
  echo "bench-vs-pytorch: installing pillow and numpy into .venv for the Python per-sample pipeline"
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check pillow numpy ||
    { echo "bench-vs-pytorch: could not install pillow and numpy into .venv (pip failed above)" >&2; exit 1; }
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pin_flags=() py_launch=()
if [[ -n ${PIN:-} ]]; then
  pin_flags=(--cpu_bind exclusive)
  "$bin/ddp_launch" --nproc_per_node "$nproc" --cpu_bind exclusive --dry_run /bin/true |
    sed -n 's/^\[rank \([0-9]*\)\]: cpus: \(.*\)$/\1 \2/p' > "$work/cpus.txt"
  [[ -s $work/cpus.txt ]] || { echo "bench-vs-pytorch: PIN=1: ddp_launch --cpu_bind exclusive gave no CPU lists" >&2; exit 1; }
  cat > "$work/pinned_python" <<EOF
#!/usr/bin/env bash
exec taskset -c "\$(awk -v r="\$LOCAL_RANK" '\$1 == r { print \$2 }' "$work/cpus.txt")" "$root/.venv/bin/python" "\$@"
EOF
  chmod +x "$work/pinned_python"
  py_launch=(--no-python "$work/pinned_python")
fi

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

# Each side: model batch iters -> samples/s on stdout.
side_cpp() {
  rm -f "$work/cpp.csv"
  "$bin/ddp_launch" --nproc_per_node "$nproc" --master_port 0 "${pin_flags[@]}" "$bin/ddp_bench" --mode ddp --model "$1" --batch "$2" \
    --iters "$3" --warmup "$warmup" --data "$data" --data-dir "$data_dir" --no-markdown --csv "$work/cpp.csv" \
    > "$work/cpp.log" 2>&1 || { cat "$work/cpp.log" >&2; return 1; }
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } { print $c["samples_per_s"] }' "$work/cpp.csv"
}
py_run() {  # pipeline model batch iters
  local pipeline=$1
  shift
  "$root/.venv/bin/torchrun" --standalone --nproc_per_node "$nproc" "${py_launch[@]}" "$root/benchmarks/torch_ddp_reference.py" \
    --model "$1" --batch "$2" --iters "$3" --warmup "$warmup" --data "$data" --data-dir "$data_dir" \
    --pipeline "$pipeline" --work-dir "$work/torchvision" > "$work/py.log" 2>&1 || true
  grep -m1 'data pipeline' "$work/py.log" > "$work/py_pipeline_$pipeline.txt" || true
  # The figure counts once printed (a rank that aborts in Gloo's teardown afterwards does not change it).
  grep -o 'samples_per_s=[0-9.]*' "$work/py.log" | cut -d= -f2 | grep . || { cat "$work/py.log" >&2; return 1; }
}
side_py() { py_run dataset "$@"; }
side_py_tensor() { py_run tensor "$@"; }

summary=()
compare() {  # model batch iters; sides: C++ then the Python ones
  local model=$1 batch=$2 iters=$3
  local names=("C++ DDP" "Python DDP") sides=(side_cpp side_py)
  if [[ $data == fashion-mnist ]]; then
    names=("C++ DDP (ImageDataset + DistributedSampler + loader)" "Python DDP, per-sample Dataset + DataLoader"
           "Python DDP, one tensor indexed per batch")
    sides=(side_cpp side_py side_py_tensor)
  fi
  local n=${#sides[@]} round k j
  declare -A values
  for ((round = 1; round <= rounds; round++)); do
    local line="  round $round:"
    for ((k = 0; k < n; k++)); do
      j=$(((round - 1 + k) % n))
      values[$j,$round]=$("${sides[j]}" "$model" "$batch" "$iters")
    done
    for ((j = 0; j < n; j++)); do line+=" ${names[j]} ${values[$j,$round]};"; done
    echo "$line samples/s"
  done
  local medians=() all
  for ((j = 0; j < n; j++)); do
    all=()
    for ((round = 1; round <= rounds; round++)); do all+=("${values[$j,$round]}"); done
    medians+=("$(median "${all[@]}")")
  done
  local head
  head=$(printf '%-9s %s data, batch/rank %3s, %s ranks, %s thread(s)/rank%s:' "$model" "$data" "$batch" "$nproc" \
    "$OMP_NUM_THREADS" "${PIN:+, workers pinned}")
  for ((j = 1; j < n; j++)); do
    summary+=("$(printf '%s %s %.1f samples/s vs %s %.1f samples/s: ratio %sx' "$head" "${names[0]}" "${medians[0]}" \
      "${names[j]}" "${medians[j]}" "$(ratio "${medians[0]}" "${medians[j]}")")")
    echo "${summary[-1]}"
  done
  for f in "$work"/py_pipeline_*.txt; do [[ -s $f ]] && sed 's/^/  python side: /' "$f"; done
  rm -f "$work"/py_pipeline_*.txt
}

echo "== machine: $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%F %T') UTC"
echo "== 1. C++ DDP vs Python DDP (Gloo, CPU, $data data, medians of $rounds rotated rounds)"
for model in ${MODELS:-lenet resnet18}; do
  case $model in
    lenet) compare lenet "${LENET_BATCH:-64}" "${LENET_ITERS:-60}" ;;
    resnet18)
      if [[ $data == fashion-mnist ]]; then
        summary+=("resnet18: skipped with --data fashion-mnist (1x28x28 images; ResNet-18 takes CIFAR's 3x32x32)")
      else
        compare resnet18 "${RESNET_BATCH:-16}" "${RESNET_ITERS:-10}"
      fi ;;
    *) echo "bench-vs-pytorch: unknown model '$model' in MODELS (lenet, resnet18)" >&2; exit 2 ;;
  esac
done

if [[ -z ${SKIP_LAUNCH:-} ]]; then
  echo "== 2. ddp_launch vs torchrun, start-to-exit of 8 workers"
  "$bin/launch_startup_bench" --reps "${STARTUP_REPS:-5}" --nproc 8 --torchrun "$root/.venv/bin/torchrun" | tee "$work/startup.log"
  summary+=("launch, 8 workers: $(grep "^median" "$work/startup.log"); $(grep "^ratio" "$work/startup.log")")

  echo "== 3. DP vs DDP on GPUs"
  gpus=$("$root/.venv/bin/python" -c 'import torch; print(torch.cuda.device_count())' 2> /dev/null || echo 0)
  if ((gpus >= 2)); then
    rm -f "$work/dp.csv"
    "$bin/ddp_bench" --mode dp --model lenet --batch $((64 * gpus)) --no-markdown --csv "$work/dp.csv"
    "$bin/ddp_launch" --nproc_per_node "$gpus" --master_port 0 "$bin/ddp_bench" --mode ddp --model lenet --batch 64 \
      --no-markdown --csv "$work/dp.csv" --append
    read -r dp ddp < <(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } { v[NR] = $c["samples_per_s"] } END { print v[2], v[3] }' "$work/dp.csv")
    summary+=("DP vs DDP, lenet, $gpus GPUs, 64 per GPU: DP $dp samples/s, DDP $ddp samples/s, DDP/DP $(ratio "$ddp" "$dp")x")
  else
    summary+=("DP vs DDP: skipped: $gpus CUDA device(s) here (this LibTorch is the CPU build, or the machine has no GPU); DP on one CPU device is plain training")
  fi
fi
echo "== summary"
printf '%s\n' "${summary[@]}"
