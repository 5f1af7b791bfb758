#!/usr/bin/env bash
# The Debian packages (cmake/DdpPackage.cmake) as a user gets them: cpack makes them from this build;
# dpkg installs them into a clean root (a copy-on-write overlay of this machine's /, in a mount and
# network namespace of its own, so nothing reaches the real system); a consumer is configured
# there with find_package(ddp) alone (the package in /usr, no CMAKE_PREFIX_PATH), built, and run
# without LD_LIBRARY_PATH; ddp_launch runs from /usr/bin with the static and the c10d rendezvous (its
# plugin found in /usr/lib); dpkg --purge removes them, and then no file of theirs is left.
# Usage: deb_test.sh BUILD_DIR CONSUMER_SOURCE_DIR TORCH_DIR VERSION [CUDA_ROOT: a CUDA LibTorch's toolkit]
set -euo pipefail
build=$1 consumer=$2 torch_dir=$3 version=$4 cuda_root=${5:-}

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || skip "needs root (a mount namespace and dpkg)"
command -v dpkg >/dev/null && command -v cpack >/dev/null && command -v unshare >/dev/null ||
  skip "needs dpkg, cpack and unshare"

work=$(mktemp -d)
cleanup() { umount -R "$work/root" 2>/dev/null || true; umount "$work/ov" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

cpack --config "$build/CPackConfig.cmake" -G DEB -B "$work/debs" >"$work/cpack.log" 2>&1 ||
  fail "cpack failed: $(tail -n 5 "$work/cpack.log")"
debs=("$work"/debs/*.deb)
((${#debs[@]} == 3)) || fail "cpack made ${#debs[@]} packages, not 3: ${debs[*]}"
for package in ddp-launch libddp-dev "libddp${version%.*}"; do
  [[ -f $work/debs/${package}_${version}_amd64.deb ]] || fail "no package $package $version in $(ls "$work/debs")"
done
# Nothing internal is shipped (Note [Installed headers]).
if dpkg-deb -c "$work/debs/libddp-dev_${version}_amd64.deb" | grep -q "/detail/"; then
  fail "libddp-dev ships detail/ headers"
fi

# Everything below runs in its own mount and network namespace: the overlay, /proc and /tmp vanish
# with it, and the real / is never written.
unshare --mount --net --propagation private bash -euo pipefail -s -- "$work" "$consumer" "$torch_dir" "$version" "$cuda_root" <<'INSIDE'
work=$1 consumer=$2 torch_dir=$3 version=$4 cuda_root=$5
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$work/ov" "$work/root"
mount -t tmpfs tmpfs "$work/ov"
mkdir "$work/ov/upper" "$work/ov/work"
mount -t overlay overlay -o "lowerdir=/,upperdir=$work/ov/upper,workdir=$work/ov/work" "$work/root"
mount -t proc proc "$work/root/proc"
mount --rbind /dev "$work/root/dev"
mount -t tmpfs tmpfs "$work/root/tmp"
# LibTorch under /tmp (a checkout cloned there, its venv) would be hidden by that fresh /tmp: it is
# seen read-only at its real path (the consumer's Torch_DIR and its rpath name it).
torch_root=$(cd "$torch_dir/../../.." && pwd)
if [[ $torch_root == /tmp/* ]]; then
  mkdir -p "$work/root$torch_root"
  mount --bind "$torch_root" "$work/root$torch_root"
  mount -o remount,bind,ro "$work/root$torch_root"
fi
mkdir "$work/root/tmp/debs"
cp "$work"/debs/*.deb "$work/root/tmp/debs/"
cp -r "$consumer" "$work/root/tmp/consumer"
ip link set lo up
in_root() { chroot "$work/root" env -u LD_LIBRARY_PATH -u CMAKE_PREFIX_PATH HOME=/tmp "$@"; }

# The names are spelled out: a glob here would be expanded by this shell against the real /tmp,
# not the root's (it passed only where a /tmp/debs of an earlier run was left over).
debs=()
for package in ddp-launch libddp-dev "libddp${version%.*}"; do debs+=("/tmp/debs/${package}_${version}_amd64.deb"); done
in_root dpkg -i "${debs[@]}" >"$work/dpkg-install.log" 2>&1 ||
  fail "dpkg -i failed: $(tail -n 5 "$work/dpkg-install.log")"
for file in /usr/bin/ddp_launch /usr/lib/libddp_launch_rdzv.so "/usr/lib/libddp.so.${version%.*}" \
            /usr/lib/cmake/ddp/ddpConfig.cmake /usr/include/ddp/ddp.h; do
  [[ -e $work/root$file ]] || fail "$file is not installed"
done

# A consumer against the installed package only: find_package(ddp) searches /usr by itself.
cuda_args=()   # a CUDA LibTorch's config needs the toolkit (tests/package/CMakeLists.txt)
[[ -n $cuda_root ]] && cuda_args=("-DCUDAToolkit_ROOT=$cuda_root" "-DCUDA_TOOLKIT_ROOT_DIR=$cuda_root")
in_root env TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" cmake -S /tmp/consumer -B /tmp/consumer-build \
  -DCMAKE_BUILD_TYPE=Release "-DTorch_DIR=$torch_dir" "${cuda_args[@]}" \
  >"$work/configure.log" 2>&1 || fail "configuring the consumer failed: $(grep -m 3 -A 3 'Error' "$work/configure.log")"
grep -q "^ddp_DIR:PATH=/usr/lib/cmake/ddp$" "$work/root/tmp/consumer-build/CMakeCache.txt" ||
  fail "the consumer did not find the package in /usr/lib/cmake/ddp"
in_root cmake --build /tmp/consumer-build --target ddp_consumer ddp_consumer_plain -j 2 >"$work/build.log" 2>&1 ||
  fail "building the consumer failed: $(grep -m 5 'error' "$work/build.log")"
out=$(in_root /tmp/consumer-build/ddp_consumer 2>&1) || fail "the consumer failed: $out"
[[ $out == *"ddp $version "* ]] || fail "the consumer printed: $out"
out=$(in_root /tmp/consumer-build/ddp_consumer_plain 2>&1) || fail "the consumer that needs no LibTorch library failed: $out"
[[ $out == "ddp $version torch "* ]] || fail "ddp_consumer_plain printed: $out"

# ddp_launch from /usr/bin: two workers with the static rendezvous, one with the c10d store (its
# plugin from /usr/lib; this namespace's loopback is its own, so the port is free).
out=$(in_root ddp_launch --nproc_per_node 2 --master_port 0 /bin/sh -c 'echo "rank $RANK of $WORLD_SIZE"' 2>&1) ||
  fail "ddp_launch failed: $out"
[[ $out == *"rank 0 of 2"* && $out == *"rank 1 of 2"* ]] || fail "ddp_launch printed: $out"
out=$(in_root ddp_launch --nnodes 1 --nproc_per_node 1 --rdzv_endpoint 127.0.0.1:29400 --rdzv_id deb \
  --rdzv_timeout 30 /bin/sh -c 'echo "store rendezvous: rank $RANK"' 2>&1) || fail "ddp_launch --rdzv_endpoint failed: $out"
[[ $out == *"store rendezvous: rank 0"* ]] || fail "ddp_launch --rdzv_endpoint printed: $out"

in_root dpkg --purge ddp-launch libddp-dev "libddp${version%.*}" >"$work/dpkg-purge.log" 2>&1 ||
  fail "dpkg --purge failed: $(tail -n 5 "$work/dpkg-purge.log")"
# What the overlay holds now is all that installing and removing changed: only dpkg's own records
# and the loader's cache may remain, no file of the packages.
left=$(cd "$work/ov/upper" && find . -mindepth 1 \( -type f -o -type l -o -type c \) |
  grep -v -E '^\./(var/lib/dpkg/|var/log/dpkg\.log$|etc/ld\.so\.cache$|tmp$)' || true)
[[ -z $left ]] || fail "after dpkg --purge these are left: $(echo "$left" | head -n 10 | tr '\n' ' ')"
for file in /usr/bin/ddp_launch /usr/lib/libddp_launch_rdzv.so /usr/include/ddp /usr/lib/cmake/ddp; do
  [[ ! -e $work/root$file ]] || fail "$file is still there after dpkg --purge"
done
INSIDE
echo "OK: 3 packages; installed into an overlay root, a find_package(ddp) consumer built and ran there, ddp_launch ran (static and c10d), purged without leftovers"
