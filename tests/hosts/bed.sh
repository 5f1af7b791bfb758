# Sourced by the hosts tests that bring their own daemons (slurm_test.sh, mpirun_test.sh): a bed of
# namespace hosts named PREFIX<pid>, made after the checks, removed on every exit.
#   bed_up CLUSTER PREFIX N TOOL...   skips (exit 77) without namespaces, a TOOL or Fashion-MNIST
#                                     (a TOOL --no-data: the test needs no data set);
#                                     sets name (the bed) and work (a scratch folder)
#   bed_fail LABEL MESSAGE            prints FAIL (LABEL): MESSAGE and the tail of every $work/host*.log,
#                                     exits 1; with BED_KEEP_FAILED=DIR set, copies $work into DIR first
#                                     (to read a failed run's files)
#   bed_wait_for SECONDS FILE TEXT    waits until FILE holds TEXT; fails (through the caller's `fail`)
#                                     after SECONDS
#   bed_can_slow                      skips (exit 77) without a cgroup v1 cpu controller to write to
#   bed_slow PERCENT PID...           holds those processes together to PERCENT of a core: a CPU quota in
#                                     every 20 ms, a short period, so that every step is slowed alike
#                                     rather than stopped for most of every 100 ms; the cgroup goes with
#                                     the bed
# A bed of a run that was SIGKILLed (a CTest timeout) is removed by the next run of the same test.
bed_up() {
  cluster=$1
  local prefix=$2 n=$3 reason tool stale data=yes
  shift 3
  reason=$("$cluster" check) || {
    echo "SKIP: $reason"
    exit 77
  }
  for tool in "$@"; do
    [[ $tool != --no-data ]] || { data=no; continue; }
    command -v "$tool" >/dev/null || {
      echo "SKIP: no $tool (scripts/setup.sh installs it)"
      exit 77
    }
  done
  if [[ $data == yes && ! -d /usr/share/datasets/fashion-mnist ]]; then
    echo "SKIP: no Fashion-MNIST in /usr/share/datasets/fashion-mnist (scripts/setup.sh installs it)"
    exit 77
  fi
  for stale in $(ip netns list | sed -n -E "s/^$prefix([0-9]+)-sw.*/\\1/p" | sort -u); do
    if [[ ! -d /proc/$stale || $(awk '{print $3}' "/proc/$stale/stat" 2>/dev/null) == Z ]]; then
      "$cluster" down "$prefix$stale"
    fi
  done
  name="$prefix$$"
  work=$(mktemp -d)
  # Every daemon and job process lives in the hosts; a quota's cgroup can go once they are gone.
  trap '"$cluster" down "$name"; rm -rf "$work"; bed_unslow' EXIT
  trap 'exit 143' INT TERM
  "$cluster" up "$name" "$n"
}

bed_can_slow() {
  [[ -w /sys/fs/cgroup/cpu/cgroup.procs ]] || {
    echo "SKIP: no cgroup v1 cpu controller to write to"
    exit 77
  }
}

bed_slow() {
  local percent=$1 p
  shift
  bed_quota=/sys/fs/cgroup/cpu/ddp-bed-$$
  mkdir -p "$bed_quota"
  echo 20000 >"$bed_quota/cpu.cfs_period_us"
  echo $((200 * percent)) >"$bed_quota/cpu.cfs_quota_us"
  for p in "$@"; do echo "$p" >"$bed_quota/cgroup.procs"; done
}

bed_unslow() {
  local i
  [[ -n ${bed_quota:-} ]] || return 0
  for i in $(seq 50); do
    rmdir "$bed_quota" 2>/dev/null && return 0
    sleep 0.1
  done
}

bed_fail() {
  local label=$1 log
  shift
  echo "FAIL ($label): $*"
  for log in "$work"/host*.log; do
    echo "---- $log"
    tail -n 30 "$log"
  done
  if [[ -n ${BED_KEEP_FAILED:-} ]]; then
    mkdir -p "$BED_KEEP_FAILED" && cp -r "$work" "$BED_KEEP_FAILED/" && echo "kept $work in $BED_KEEP_FAILED"
  fi
  exit 1
}

bed_wait_for() {
  local deadline=$((SECONDS + $1))
  until grep -q -F -- "$3" "$2" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "no '$3' in $(basename "$2") within $1 s"
    sleep 0.05
  done
}
