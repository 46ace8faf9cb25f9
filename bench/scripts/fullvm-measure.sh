#!/bin/sh
# Boots COUNT full VMs through brigd's fullvm tier, one after another, and reports for each
# the time from `brig create` to its agent answering (boot to agent) and its VMM's memory
# (RSS and PSS from smaps_rollup) after boot, then again after SETTLE_S seconds (the guests
# hand freed pages back through the balloon's free-page reporting). Runs wherever brigd
# serves the tier: natively on hardware virtualization, or inside the emulated host
# (brig-bench fullvm picks). Each VM has a network device (a link with every destination
# denied), as a sandbox that runs services would. Prints `BRIG-FULLVM-BENCH` lines; POSIX sh
# and busybox suffice.
# Usage: fullvm-measure.sh BRIG_CLI STATE_DIR COUNT SETTLE_S
brig=$1 state=$2 count=$3 settle=$4
up() { cut -d' ' -f1 /proc/uptime; }
mem() { awk '/^Rss:/ {r = $2} /^Pss:/ {p = $2} END {print "rss_kib=" r " pss_kib=" p}' "/proc/$1/smaps_rollup"; }
ids=""
i=0
while [ "$i" -lt "$count" ]; do
    t0=$(up)
    id=$("$brig" create --tier fullvm --network) || { echo "BRIG-FULLVM-BENCH error create failed"; break; }
    t1=$(up)
    pid=$(cat "$state/fullvm/$id.pid")
    used=$("$brig" exec "$id" -- sh -c "free -m | awk '/^Mem:/ {print \$3}'")
    ms=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%d", (b - a) * 1000}')
    echo "BRIG-FULLVM-BENCH boot vm=$i boot_ms=$ms $(mem "$pid") guest_used_mib=$used"
    ids="$ids $id"
    i=$((i + 1))
done
sleep "$settle"
for id in $ids; do
    pid=$(cat "$state/fullvm/$id.pid")
    used=$("$brig" exec "$id" -- sh -c "free -m | awk '/^Mem:/ {print \$3}'")
    echo "BRIG-FULLVM-BENCH settled pid=$pid $(mem "$pid") guest_used_mib=$used"
done
# shellcheck disable=SC2086
[ -n "$ids" ] && "$brig" rm $ids >/dev/null
echo "BRIG-FULLVM-BENCH done"
