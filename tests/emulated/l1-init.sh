#!/bin/sh
# The emulated host's init (tests/tests/microvm.rs; with brig.l1=fullvm or brig.l1=chost it
# runs fullvm.sh or chost.sh instead). It loads KVM with nested SVM; boots the guest with
# brig-vmm until the guest asks for a snapshot, resumes it from that snapshot in a new brig-vmm
# process and runs a command in it through the agent (the guest reports on the console, see
# l2-init.sh); runs brig-vmtier-check (the tier library's steps, each checked in code); then
# serves brigd for the test outside, which drives the rest with the SDK.
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
insmod /mod/irqbypass.ko && insmod /mod/kvm.ko && insmod /mod/kvm-amd.ko nested=1
echo "BRIG-L1-UP kvm=$(test -c /dev/kvm && echo yes || echo no)"
# The full-VM tier's run (brig.l1=fullvm): the OS image is QEMU's first disk.
grep -q brig.l1=fullvm /proc/cmdline && exec /bin/sh /fullvm.sh
# Containers in a container-host VM (brig.l1=chost).
grep -q brig.l1=chost /proc/cmdline && exec /bin/sh /chost.sh
/bin/brig-vmm boot --kernel /l2/vmlinuz --initrd /l2/initrd.gz --mem-mib 256 --timeout-s 120 \
    --cmdline "console=ttyS0 reboot=t panic=-1 quiet initcall_blacklist=i8042_init pci=off brig.test=1" \
    --snapshot-to /tmp/snap --rng --vsock-uds /tmp/v0.sock \
    --disk /l2/busybox.erofs:ro --disk /l2/scratch.img
echo "BRIG-L1-SNAPSHOT rc=$?"
/bin/brig-vmm resume --snapshot /tmp/snap --timeout-s 120 --vsock-uds /tmp/v1.sock \
    --disk /l2/busybox.erofs:ro --disk /l2/scratch.img &
vmm=$!
i=0
until /bin/brig-vmm exec --uds /tmp/v1.sock -- 'echo "hello from $(uname -n)"; echo "disk after resume: $(cat /from-guest.txt)"; echo oops >&2; exit 7'; do
    rc=$?
    [ $rc -eq 7 ] && break
    i=$((i + 1)); [ $i -ge 100 ] && break
    sleep 0.2
done
echo "BRIG-L1-EXEC rc=$rc"
/bin/brig-vmm exec --uds /tmp/v1.sock -- \
    'while [ ! -e /resumed ]; do sleep 0.1; done; reboot -f' >/dev/null 2>&1
wait $vmm
echo "BRIG-L1-RESULT rc=$?"
# The node's microVM tier (brig-vmtier) on the same guest: snapshot, two VMs, commands, destroy.
# Each VMM gets a cgroup of its own (cgroup v2 here, with the controllers it needs).
mount -t cgroup2 cgroup2 /sys/fs/cgroup && echo "+memory +pids +cpu" > /sys/fs/cgroup/cgroup.subtree_control
/bin/brig-vmtier-check /l2/vmlinuz /l2/initrd.gz \
    "console=ttyS0 reboot=t panic=-1 quiet initcall_blacklist=i8042_init pci=off" /tmp/tier &
check=$!
# A check that stalls (it takes 2-4 minutes here) is described, then stopped, so the test
# outside fails with where it stood instead of at its own deadline with nothing to go on.
(sleep 480; kill -0 $check 2>/dev/null || exit 0; /bin/sh /stalled.sh "$check"; kill -9 $check) &
watchdog=$!
wait $check
echo "BRIG-L1-VMTIER rc=$?"
kill $watchdog 2>/dev/null
# Snapshots take room in this RAM-backed root (at most half the emulated host's memory).
rm -rf /tmp/tier /tmp/snap
# brigd serving the microvm tier on the emulated host's network; the test outside drives it
# with the SDK through QEMU's port forward.
ip link set lo up
for m in virtio_ring virtio virtio_mmio failover net_failover virtio_net; do insmod /mod/$m.ko; done
ip addr add 10.0.2.15/24 dev eth0; ip link set eth0 up
# Guest file reads capped at 16 MiB here, so the test's endless reads end soon under TCG.
printf 'max_guest_read_mib = 16\n[microvm]\nkernel = "/l2/vmlinuz"\ninitrd = "/l2/initrd.gz"\nvmm = "/bin/brig-vmm"\nimages_dir = "/l2"\nboot_limit_s = 420\n' > /etc/brigd.toml
export BRIG_STATE_DIR=/tmp/brig
brigd_flags="--config /etc/brigd.toml --listen 10.0.2.15:7070 --metrics off --on-exit destroy --log warn"
/bin/brigd $brigd_flags &
brigd=$!
i=0; until [ -e /tmp/brig/endpoint.json ] || [ $i -ge 300 ]; do sleep 0.2; i=$((i + 1)); done
. /announce.sh
# The test outside asks for a crash: brigd is killed (kill -9) and started again, and the new
# one adopts the VMs the old one left running. The VMM of the sandbox labelled role=doomed is
# killed too, and removing the phase=restart marker tells the test both are done.
wait_label restart 4200
kill -9 $brigd
echo "BRIG-L1-BRIGD-KILLED"
/bin/brigd $brigd_flags &
i=0; until /bin/brig ls >/dev/null 2>&1 || [ $i -ge 900 ]; do sleep 0.2; i=$((i + 1)); done
doomed=$(/bin/brig ls --label role=doomed | grep -o 'sb-[0-9a-z-]*' | head -1)
[ -n "$doomed" ] && kill -9 "$(cut -d' ' -f1 /tmp/brig/microvm/$doomed.pid)" && echo "BRIG-L1-VMM-KILLED $doomed"
/bin/brig rm --label phase=restart >/dev/null
echo "BRIG-L1-BRIGD-RESTARTED"
wait_label done 4200
echo "BRIG-L1-OUTSIDE-DONE"
reboot -f
