#!/usr/bin/env bash
# Installs what the build needs, idempotently; prints nothing when everything is already there.
#   scripts/setup.sh          what building and running need (all that scripts/demo.sh uses): the
#                             compiler, CMake, Ninja, ccache, the C++ libraries, Fashion-MNIST, and
#                             .venv with torch==$DDP_TORCH_VERSION (the 2.13.0 CPU wheel; another version:
#                             .venv-VERSION, scripts/common.sh) unless LIBTORCH is set
#   scripts/setup.sh --test   also what the test beds need (scripts/test.sh and CI call it): network
#                             namespaces, sshd/pdsh/clush, Slurm, OpenMPI, Prometheus, gnuplot
#   scripts/setup.sh --fuzz   also clang-14 and its runtimes, for scripts/fuzz.sh
# No service that a package would start is started or left enabled: the tests start their own, in
# their namespace hosts, and stop them (tests/base/setup_services_test.sh checks it).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

debian_packages=(g++ cmake ninja-build pkg-config libcxxopts-dev libspdlog-dev catch2 libgloo-dev zlib1g-dev
                 nlohmann-json3-dev            # JSON in ddp/base and the launcher (header-only)
                 libxxhash-dev xxhash          # the checkpoint MANIFEST checksum (XXH3-64) and xxhsum
                 dataset-fashion-mnist
                 libcpp-httplib-dev            # ddp_launch --metrics_port (docs/observability.md)
                 libssl-dev                    # the rendezvous plugin's HMAC proofs (docs/launcher.md)
                 ccache)                       # scripts/build.sh: rebuilds and other checkouts of the same sources
test_packages=(iproute2                        # scripts/netns-cluster.sh, the hosts tests (docs/hosts.md)
               iptables                        # netns-cluster.sh --delay/--loss without sch_netem (link_delay)
               openssh-server openssh-client pdsh clustershell  # --hostfile's tests: an sshd per namespace host
               slurmctld slurmd slurm-client munge openmpi-bin  # hosts.slurm_cluster, hosts.mpirun (docs/launcher.md)
               prometheus curl                 # faults.prometheus: a real Prometheus scrapes /metrics; probes by curl
               gnuplot-nox)                    # scripts/plot_bench.sh and its test
case ${1:-} in
  "") ;;
  --test) debian_packages+=("${test_packages[@]}") ;;
  # clang and its runtimes (libFuzzer, ASan, UBSan) as well.
  --fuzz) debian_packages+=(clang-14 libclang-rt-14-dev) ;;
  *) ddp_die "scripts/setup.sh: unknown option '$1': use --test (the test beds too) or --fuzz (and clang)" ;;
esac
missing=()
for pkg in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || ddp_die "installing ${missing[*]} needs root (or sudo)"
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  # A fresh machine has no package lists; an old list may name versions that are gone. Update first.
  "${sudo[@]}" apt-get update -qq
  # Debian's prometheus, openssh-server, munge and Slurm packages would start system services (on
  # every interface: :9090, :22, :6817-6818); the tests run their own instances, on loopback or in
  # their namespace hosts. So no service starts (policy-rc.d, honoured by invoke-rc.d and
  # deb-systemd-invoke), and where systemd runs, their units stay disabled.
  policy=/usr/sbin/policy-rc.d
  own_policy=
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    own_policy=1
  fi
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [[ -n $own_policy ]] && "${sudo[@]}" rm -f "$policy"
  if command -v systemctl >/dev/null; then
    for unit in prometheus ssh.service ssh.socket munge slurmd slurmctld; do
      "${sudo[@]}" systemctl disable --now "$unit" >/dev/null 2>&1 || true
    done
  fi
fi

if [[ -n ${LIBTORCH:-} ]]; then
  ddp_torch_prefix >/dev/null   # validates the folder
  exit 0
fi

if ! "$DDP_VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$DDP_TORCH_VERSION')" 2>/dev/null; then
  echo "setup: creating $DDP_VENV with torch==$DDP_TORCH_VERSION"
  [[ -x $DDP_VENV/bin/python ]] || python3 -m venv "$DDP_VENV"
  "$DDP_VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$DDP_TORCH_VERSION"
fi

# The newest torchrun's own parser for launcher.torchrun_parity (tests/launcher/torchrun_parity.py
# checks every flag of it against ddp_launch): run.py read from the torch 2.14.1 wheel, which is
# downloaded (not installed) and removed; its parser runs on the venv's torch.
if [[ ${1:-} == --test ]]; then
  newest=$DDP_VENV/torchrun-2.14.1/run.py
  if [[ ! -f $newest && $DDP_TORCH_VERSION == 2.14.1 ]]; then
    mkdir -p "$(dirname "$newest")"
    cp "$("$DDP_VENV/bin/python" -c 'import torch.distributed.run as r; print(r.__file__)')" "$newest"
  elif [[ ! -f $newest ]]; then
    wheel_dir=$(mktemp -d)
    "$DDP_VENV/bin/python" -m pip download -q --no-deps --disable-pip-version-check -d "$wheel_dir" torch==2.14.1 2>/dev/null &&
      "$DDP_VENV/bin/python" -c 'import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "torch-2.14.1-*.whl"))[0]
os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
open(sys.argv[2], "wb").write(zipfile.ZipFile(wheel).read("torch/distributed/run.py"))' "$wheel_dir" "$newest" ||
      echo "setup: no torch 2.14.1 wheel to read torchrun's run.py from: launcher.torchrun_parity checks $DDP_TORCH_VERSION only"
    rm -rf "$wheel_dir"
  fi
fi
