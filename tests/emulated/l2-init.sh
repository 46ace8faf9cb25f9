#!/bin/sh
# The guest's init (the initramfs scripts/build-vm-guests.sh makes: busybox, brig-agent,
# brig-shim, virtio modules). As a microVM it reports on the console, keeps some state in its
# tmpfs, asks the VMM for a snapshot (a write to the trigger address) and on resume shows that
# state again; the host drives the rest through the agent. With `brig.role=container-host` on
# its command line it is a container-host VM instead: brig-agent runs the container runtime.
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
role=$(sed -n 's/.*brig\.role=\([a-z-]*\).*/\1/p' /proc/cmdline)
if [ "$role" = container-host ] && [ ! -e /.brig-root ]; then
    # Each container's init pivot_roots into its rootfs, which the kernel refuses under the
    # initramfs's rootfs: move into a tmpfs first and start again from there.
    mkdir -p /newroot && mount -t tmpfs -o mode=0755 root /newroot
    cp -a /bin /mod /init /newroot/
    mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/tmp /newroot/run
    touch /newroot/.brig-root
    mount --move /proc /newroot/proc; mount --move /sys /newroot/sys; mount --move /dev /newroot/dev
    exec switch_root /newroot /init
fi
mount -t tmpfs tmp /tmp
echo "BRIG-L2-UP kernel=$(uname -r) cmdline=$(cat /proc/cmdline)"
insmod /mod/virtio_ring.ko; insmod /mod/virtio.ko; insmod /mod/virtio_mmio.ko; insmod /mod/virtio-rng.ko
insmod /mod/vsock.ko; insmod /mod/vmw_vsock_virtio_transport_common.ko; insmod /mod/vmw_vsock_virtio_transport.ko
insmod /mod/virtio_blk.ko; insmod /mod/libcrc32c.ko; insmod /mod/erofs.ko; insmod /mod/overlay.ko
insmod /mod/virtio_balloon.ko
if [ "$role" = container-host ]; then
    # A container-host VM: the node's layer images are its disks (vda, vdb, …), and the agent
    # runs the container runtime (cgroup v2, user namespaces, overlay on EROFS) for the node.
    mount -t cgroup2 cgroup2 /sys/fs/cgroup && echo "+memory +pids +cpu" > /sys/fs/cgroup/cgroup.subtree_control
    mount -t tmpfs -o mode=0755 run /run
    echo "BRIG-L2-CONTAINER-HOST disks=$(ls /dev | grep -c '^vd')"
    export BRIG_AGENT_CONTAINERS=/run/brig BRIG_SHIM=/bin/brig-shim
    while true; do /bin/brig-agent; sleep 1; done
fi
# With disks (`brig.layers=N` read-only EROFS layers, base first, on vda, vdb, ..., then a
# writable disk, formatted on first use; without the parameter vda and vdb mean one layer),
# the sandbox's tree is the layers under an overlay whose upper half lives on the writable
# disk, and the agent runs commands chrooted into it.
layers=$(sed -n 's/.*brig\.layers=\([0-9]*\).*/\1/p' /proc/cmdline)
[ -z "$layers" ] && [ -e /dev/vda ] && [ -e /dev/vdb ] && layers=1
if [ -n "$layers" ] && [ "$layers" -gt 0 ]; then
    i=0; lower=""; scratch=""; ok=yes
    for d in a b c d e f g h i j k l m n o p q; do
        if [ $i -lt $layers ]; then
            mkdir -p /layers/$i && mount -t erofs -o ro /dev/vd$d /layers/$i || ok=no
            lower="/layers/$i${lower:+:$lower}"
        elif [ $i -eq $layers ]; then
            scratch=/dev/vd$d
        fi
        i=$((i + 1))
    done
    mkdir -p /scratch /merged
    [ $ok = yes ] &&
        { mount $scratch /scratch 2>/dev/null || { mke2fs -q $scratch && mount $scratch /scratch; }; } &&
        mkdir -p /scratch/upper /scratch/work &&
        mount -t overlay overlay -o lowerdir=$lower,upperdir=/scratch/upper,workdir=/scratch/work /merged &&
        echo "written in the guest" > /merged/from-guest.txt && sync &&
        echo "BRIG-L2-DISKS layers=$layers layer-files=$(ls /layers/0/bin | wc -l) merged=$(cat /merged/from-guest.txt)" &&
        export BRIG_AGENT_ROOT=/merged
fi
/bin/brig-agent &
echo "BRIG-L2-RNG current=$(cat /sys/devices/virtual/misc/hw_random/rng_current) bytes=$(head -c 16 /dev/hwrng | od -An -tx1 | tr -d ' \n')"
echo "made-before-snapshot-$$" > /tmp/state
devmem 0xd0000000 32 1
echo "BRIG-L2-RESUMED state=$(cat /tmp/state) rng=$(head -c 16 /dev/hwrng | od -An -tx1 | tr -d ' \n')"
echo done > /resumed
[ -n "$BRIG_AGENT_ROOT" ] && echo done > "$BRIG_AGENT_ROOT/resumed"
# The host drives the rest through the agent (and ends with `reboot -f`).
while true; do sleep 1; done
