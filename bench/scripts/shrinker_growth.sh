#!/usr/bin/env bash
# What growing the kernel's memory cgroup shrinker maps costs with few memory cgroups and with
# 10,000 (docs/density.md, "A freshly booted host, profiled"), in one run: the case for
# raising the largest shrinker id at node start (host/node/src/host/shrinker_ids.rs).
#
#   sudo bench/scripts/shrinker_growth.sh [MEMCGS]
#
# Each step mounts empty ramfs instances in a throwaway mount namespace (`unshare -m`), first
# past the host's largest shrinker id by ~3,200 (about 50 growths of every memory cgroup's
# map), then the same number again (no growth). The largest id is read from how many 1 KiB
# slab objects a new memory cgroup takes (one per 64 ids).
# Side effect: the host's largest shrinker id rises by about 6,400 until the next reboot, so
# every memory cgroup made afterwards holds about 100 KiB more.
set -euo pipefail
memcgs=${1:-10000}
root=/sys/fs/cgroup/memory/brig-shrinker-growth
[[ -d /sys/fs/cgroup/memory ]] || { echo "needs the cgroup v1 memory hierarchy" >&2; exit 1; }

largest_id() {
    python3 - <<'PY'
import os
def objects():
    for line in open("/proc/slabinfo"):
        if line.startswith("kmalloc-1k "):
            return int(line.split()[1])
probe = "/sys/fs/cgroup/memory/brig-shrinker-probe"
os.makedirs(probe, exist_ok=True)
before = objects()
for i in range(50):
    os.mkdir(f"{probe}/m{i}")
after = objects()
for i in range(50):
    os.rmdir(f"{probe}/m{i}")
os.rmdir(probe)
print(round((after - before) / 50) * 64)
PY
}

# Prints the seconds that mounting $1 ramfs instances took.
mount_many() {
    unshare -m python3 - "$1" <<'PY'
import ctypes, os, sys, time
n = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
base = b"/tmp/brig-shrinker-growth"
os.makedirs(base, exist_ok=True)
assert libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None) == 0  # MS_REC | MS_PRIVATE
assert libc.mount(b"scratch", base, b"tmpfs", 0, b"size=64k") == 0
began = time.perf_counter()
for i in range(n):
    d = base + b"/%d" % i
    os.mkdir(d)
    if libc.mount(b"r", d, b"ramfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), f"mount {i}")
print(f"{time.perf_counter() - began:.2f}")
PY
    rmdir /tmp/brig-shrinker-growth 2>/dev/null || true
}

step() {
    local label=$1 from n grow again
    from=$(largest_id)
    n=$((from + 3200))
    grow=$(mount_many "$n")
    again=$(mount_many "$n")
    echo "$label: largest id ~$from -> ~$(largest_id); $n mounts took $grow s growing the maps, $again s again"
}

step "$(find /sys/fs/cgroup/memory -type d | wc -l) memory cgroups"
mkdir -p "$root"
trap 'find "$root" -mindepth 1 -maxdepth 1 -type d -exec rmdir {} + 2>/dev/null; rmdir "$root" 2>/dev/null' EXIT
python3 -c "import os, sys
for i in range(int(sys.argv[1])): os.mkdir(f'$root/m{i}')" "$memcgs"
step "$memcgs more memory cgroups"
