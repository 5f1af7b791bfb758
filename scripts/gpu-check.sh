#!/usr/bin/env bash
# Validation on a machine with a GPU (docs/gpu.md): builds against that machine's Python PyTorch
# (its LibTorch, CUDA and NCCL), runs the GPU subset of the tests, then the GPU benchmarks side by side
# with Python's DDP, and writes a Markdown report.
#
#   scripts/gpu-check.sh --pack             HERE, on a machine with Debian's registry: packs the build
#                                           dependencies (cxxopts, spdlog, fmt, Catch2, Gloo headers)
#                                           into .devdeps/ (git-ignored) to carry to the GPU machine
#   scripts/gpu-check.sh [--stage S] [DIR]  on the GPU machine (carry .devdeps); S = all (default),
#                                           build, test or bench, so that each fits one 10-minute call;
#                                           the report goes to DIR/gpu-report.md (default: $OUT, else out/)
# Environment: DDP_GPU_PYTHON (default python3: the one with torch), DDP_JOBS, ROUNDS (default 3),
#   LENET_ITERS (300), RESNET_ITERS (30), CUDA_HOME (default: nvcc's toolkit).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
die() { echo "gpu-check: $*" >&2; exit 1; }

if [[ ${1:-} == --pack ]]; then
  pkgs=(libcxxopts-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 catch2 libgloo-dev)
  rm -rf .devdeps && mkdir -p .devdeps/debs .devdeps/root
  if ! (cd .devdeps/debs && apt-get download "${pkgs[@]}" >/dev/null 2>&1); then
    apt-get update >/dev/null && (cd .devdeps/debs && apt-get download "${pkgs[@]}" >/dev/null) || die "apt-get download failed"
  fi
  for deb in .devdeps/debs/*.deb; do dpkg -x "$deb" .devdeps/root; done
  rm -rf .devdeps/debs .devdeps/root/usr/share/doc
  echo "gpu-check: packed $(du -sh .devdeps | cut -f1) into .devdeps; carry [\".devdeps\"] and run scripts/gpu-check.sh there"
  exit 0
fi

stage=all
if [[ ${1:-} == --stage ]]; then stage=$2; shift 2; fi
case $stage in all | build | test | bench) ;; *) die "--stage all, build, test or bench, not '$stage'" ;; esac
report_dir=${1:-${OUT:-$root/out}}
mkdir -p "$report_dir"
report=$report_dir/gpu-report.md
log=$report_dir/gpu-check.log
python=${DDP_GPU_PYTHON:-python3}
build=$root/build-gpu
bin=$build/bin

command -v nvidia-smi >/dev/null || die "no nvidia-smi: this is not a GPU machine"
"$python" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' || die "$python has no torch with a usable GPU"
prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
deps=$root/.devdeps/root/usr
gloo=()
if [[ -d $deps ]]; then
  export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  prefix="$deps;$prefix"
  gloo=(-DDDP_GLOO_INCLUDE_DIR="$deps/include")
fi

if [[ $stage == all || $stage == build ]]; then
  cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
  start=$(date +%s)
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DCUDAToolkit_ROOT="$cuda_home" -DCUDA_TOOLKIT_ROOT_DIR="$cuda_home" -DDDP_PYTHON="$(command -v "$python")" \
    "${gloo[@]}" -DDDP_INSTALL=OFF >"$log" 2>&1 ||
    { tail -40 "$log"; die "configure failed (log: $log)"; }
  grep -q 'ddp: CUDA LibTorch' "$log" || die "configured without CUDA (log: $log)"
  cmake --build "$build" --parallel "${DDP_JOBS:-$(nproc)}" --target ddp_launch gpu_test_worker test_gpu_units \
    sync_bn_worker gpu_bench ddp_bench >>"$log" 2>&1 || { tail -60 "$log"; die "build failed (log: $log)"; }
  echo "gpu-check: built in $(($(date +%s) - start)) s"
fi

if [[ $stage == all || $stage == test ]]; then
  (cd "$build" && ctest -R 'gpu\.|ddp\.sync_bn' --output-on-failure --timeout 300) 2>&1 | tee "$report_dir/gpu-tests.log"
fi

if [[ $stage == all || $stage == bench ]]; then
  rounds=${ROUNDS:-3}
  bench_log=$report_dir/gpu-bench.log
  : >"$bench_log"
  run_pair() {  # model batch iters: alternates C++ and Python, $rounds rounds
    for ((r = 1; r <= rounds; r++)); do
      if ((r % 2)); then
        "$bin/gpu_bench" --model "$1" --batch "$2" --iters "$3" >>"$bench_log" 2>&1
        "$python" benchmarks/gpu_torch_reference.py --model "$1" --batch "$2" --iters "$3" >>"$bench_log" 2>&1
      else
        "$python" benchmarks/gpu_torch_reference.py --model "$1" --batch "$2" --iters "$3" >>"$bench_log" 2>&1
        "$bin/gpu_bench" --model "$1" --batch "$2" --iters "$3" >>"$bench_log" 2>&1
      fi
    done
  }
  run_pair lenet 64 "${LENET_ITERS:-300}"
  run_pair resnet18 256 "${RESNET_ITERS:-30}"
  # Medians per (side, model, mode) -> Markdown.
  tests_line=$(grep -E '^[0-9]+% tests passed|tests passed' "$report_dir/gpu-tests.log" 2>/dev/null | tail -1)
  {
    echo "# GPU check ($(date -u '+%F %T') UTC)"
    echo
    echo "- device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
    echo "- $("$python" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {\".\".join(map(str, torch.cuda.nccl.version()))}, cuDNN {torch.backends.cudnn.version()}")')"
    echo "- tests (\`ctest -R 'gpu\\.|ddp\\.sync_bn'\` in build-gpu): ${tests_line:-see gpu-tests.log}"
    echo "- benchmarks: \`build-gpu/bin/gpu_bench\` and \`benchmarks/gpu_torch_reference.py\`, alternated, $rounds rounds, medians"
    echo
    awk '
      /^(gpu_bench|torch_gpu) model=/ {
        side = ($1 == "gpu_bench") ? "C++" : "Python"
        for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
        key = f["model"] " " f["batch"] " " f["mode"]
        if (!(key in seen)) { seen[key] = 1; keys[++nk] = key }
        it[side, key] = it[side, key] " " f["it_per_s"]; peak[side, key] = f["peak_mib"]; grad[key] = f["grad_mib"]
      }
      function median(list,   n, a, i, j, t) {
        n = split(list, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n == 0 ? 0 : (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2)
      }
      END {
        print "| model | batch | mode | C++ it/s | Python it/s | C++ / Python | C++ peak MiB | Python peak MiB | gradients MiB |"
        print "|---|---|---|---|---|---|---|---|---|"
        for (k = 1; k <= nk; k++) {
          key = keys[k]; split(key, p, " ")
          c = median(it["C++", key]); y = median(it["Python", key])
          printf "| %s | %s | %s | %.1f | %.1f | %.2fx | %.1f | %.1f | %.1f |\n", p[1], p[2], p[3], c, y, (y > 0 ? c / y : 0), peak["C++", key], peak["Python", key], grad[key]
          cpp[p[1], p[3]] = c; cpeak[p[1], p[3]] = peak["C++", key]; models[p[1]] = grad[key]
        }
        print ""
        for (m in models) {
          if (cpp[m, "plain"] > 0 && cpp[m, "ddp"] > 0)
            printf "- %s: C++ DDP (NCCL, world size 1) vs plain C++: %+.1f%% iterations/s; peak memory DDP - plain = %.1f MiB (gradient_as_bucket_view: %.1f MiB), gradients %.1f MiB\n", m, 100 * (cpp[m, "ddp"] / cpp[m, "plain"] - 1), cpeak[m, "ddp"] - cpeak[m, "plain"], cpeak[m, "ddp_view"] - cpeak[m, "plain"], models[m]
        }
      }' "$bench_log"
    echo
    echo "Targets (issue 7): lenet batch 64, C++ DDP >= 2x Python DDP; resnet18 batch 256, C++ DDP >= Python DDP;"
    echo "DDP at world size 1 within 2% of plain; peak memory DDP - plain <= gradients (less with gradient_as_bucket_view)."
  } >"$report"
  echo "gpu-check: report in $report"
  cat "$report"
fi
