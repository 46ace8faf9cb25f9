#!/bin/sh
# The emulated host's description of a stalled brig-vmtier-check (pid $1), on the console:
# every user process with its state and where its threads wait in the kernel, then the
# tier's directory and the end of each VM's console log.
echo "BRIG-L1-VMTIER-STALLED pid=$1"
for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)
    [ -n "$cmd" ] || continue
    echo "STALLED process ${p#/proc/}: $cmd"
    for t in "$p"/task/*; do
        state=$(sed -n 's/^State:[[:space:]]*//p' "$t/status" 2>/dev/null)
        echo "STALLED   thread ${t##*/} $(cat "$t/comm" 2>/dev/null) [$state] wchan=$(cat "$t/wchan" 2>/dev/null)"
        sed 's/^/STALLED     /' "$t/stack" 2>/dev/null
    done
done
ls -la /tmp/tier 2>&1 | sed 's/^/STALLED dir /'
for log in /tmp/tier/*.log; do
    [ -e "$log" ] || continue
    tail -n 5 "$log" | sed "s|^|STALLED $log: |"
done
