#!/usr/bin/env bash
# Installs what the build needs, idempotently; prints nothing when everything is already there.
#   Debian packages: compiler, CMake, Ninja, cxxopts, spdlog, Catch2 (v2), Gloo headers, Fashion-MNIST,
#   cpp-httplib and Prometheus (metrics), gnuplot-nox (scripts/plot_bench.sh), iproute2 (the hosts tests),
#   ccache (scripts/build.sh uses it when present).
#   --fuzz: also clang-14 and libclang-rt-14-dev, for scripts/fuzz.sh.
#   .venv: a project-local virtual environment with torch==2.13.0 (CPU), unless LIBTORCH is set.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

debian_packages=(g++ cmake ninja-build pkg-config libcxxopts-dev libspdlog-dev catch2 libgloo-dev zlib1g-dev
                 nlohmann-json3-dev            # JSON in ddp/base and the launcher (header-only)
                 libxxhash-dev xxhash          # the checkpoint MANIFEST checksum (XXH3-64) and xxhsum
                 dataset-fashion-mnist
                 libcpp-httplib-dev prometheus  # ddp_launch --metrics_port and its test (docs/observability.md)
                 libssl-dev                    # the rendezvous plugin's HMAC proofs (docs/launcher.md)
                 iproute2                      # scripts/netns-cluster.sh, the hosts tests (docs/hosts.md)
                 iptables                      # netns-cluster.sh --delay/--loss without sch_netem (link_delay)
                 openssh-server openssh-client pdsh clustershell  # --hostfile's tests: an sshd per namespace host
                 slurmctld slurmd slurm-client munge openmpi-bin  # hosts.slurm_cluster, hosts.mpirun (docs/launcher.md)
                 gnuplot-nox                    # scripts/plot_bench.sh and its test
                 ccache)                        # scripts/build.sh: rebuilds and other checkouts of the same sources
# --fuzz (scripts/fuzz.sh): clang and its runtimes (libFuzzer, ASan, UBSan) as well.
[[ ${1:-} == --fuzz ]] && debian_packages+=(clang-14 libclang-rt-14-dev)
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
  # Debian's prometheus package would start a system service listening on every interface (:9090);
  # the project only runs its own instance on loopback in a test, so keep services from starting
  # (policy-rc.d, honoured by invoke-rc.d and deb-systemd-invoke) and leave the unit disabled.
  policy=/usr/sbin/policy-rc.d
  own_policy=
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    own_policy=1
  fi
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [[ -n $own_policy ]] && "${sudo[@]}" rm -f "$policy"
  if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null; then
    "${sudo[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
  # openssh-server: the tests start their own sshd per namespace host; none for the machine.
  if [[ " ${missing[*]} " == *" openssh-server "* ]] && command -v systemctl >/dev/null; then
    "${sudo[@]}" systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
  fi
  # The same for munge and Slurm: the tests start their own daemons inside the namespace hosts.
  if command -v systemctl >/dev/null; then
    for unit in munge slurmd slurmctld; do
      if [[ " ${missing[*]} " == *" $unit "* ]]; then
        "${sudo[@]}" systemctl disable --now "$unit" >/dev/null 2>&1 || true
      fi
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
