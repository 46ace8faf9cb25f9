#!/usr/bin/env bash
# Builds what the microVM tests boot, into artifacts/vm/:
#   vmlinuz          Debian's linux-image-cloud-amd64 kernel (guest, and the emulated host's)
#   l2-initrd.gz     the guest's initramfs: busybox, an /init that reports and reboots; with
#                    `brig.role=container-host` on its command line it is a container-host VM
#                    instead: brig-agent runs the container runtime (with brig-shim)
#   l1-initrd.gz     the emulated host's initramfs: busybox, the KVM modules (nested SVM), a
#                    static (musl) brig-vmm and the guest above; /init boots the guest with
#                    brig-vmm until it asks for a snapshot, resumes it from that snapshot in a
#                    new brig-vmm process, and reports how each step ended
# The kernel package is downloaded once (Debian's archive); the rest is rebuilt every run
# (a few seconds), so the emulated host always carries the current brig-vmm.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${BRIG_ARTIFACTS:-$root/artifacts}/vm"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. The kernel package.
pkg_dir="$out/kernel-pkg"
if [[ ! -f "$out/vmlinuz" ]]; then
    kernel_pkg() { apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
    version=$(kernel_pkg)
    # A machine whose package lists were never fetched knows no kernel package yet.
    [[ -n "$version" ]] || { apt-get update -qq && version=$(kernel_pkg); }
    [[ -n "$version" ]] || { echo "no linux-image-cloud-amd64 in the package index (apt-get update?)" >&2; exit 1; }
    (cd "$work" && apt-get download -q "$version" 2>/dev/null)
    rm -rf "$pkg_dir" && mkdir -p "$pkg_dir"
    dpkg-deb -x "$work"/linux-image-*.deb "$pkg_dir"
    cp "$pkg_dir"/boot/vmlinuz-* "$out/vmlinuz.tmp" && mv "$out/vmlinuz.tmp" "$out/vmlinuz"
fi
modules=$(ls -d "$pkg_dir"/lib/modules/*/kernel)

# 2. brig-vmm, static.
target_dir="${CARGO_TARGET_DIR:-$root/target}"
cargo build --quiet --release --target x86_64-unknown-linux-musl -p brig-vmm -p brig-agent \
    -p brig-vmtier -p brig-container --manifest-path "$root/Cargo.toml"
vmm="$target_dir/x86_64-unknown-linux-musl/release/brig-vmm"
agent="$target_dir/x86_64-unknown-linux-musl/release/brig-agent"
shim="$target_dir/x86_64-unknown-linux-musl/release/brig-shim"

# brigd and the brig CLI (this build's debug binaries, stripped) with the C libraries they need,
# so the emulated host can serve the microvm tier to the SDK.
cargo build --quiet -p brigd -p brig-cli --manifest-path "$root/Cargo.toml"
debug_bins="$target_dir/debug"

# 3. The guest's initramfs.
l2="$work/l2"
mkdir -p "$l2/bin" "$l2/proc" "$l2/sys" "$l2/dev"
cp /usr/bin/busybox "$l2/bin/busybox"
mkdir -p "$l2/tmp" "$l2/mod"
for a in sh mount echo uname reboot cat devmem insmod head od tr sleep [ hostname ps grep wc mkdir ls sync \
    mke2fs chroot dd rm sed printf pwd true false seq env; do ln -s busybox "$l2/bin/$a"; done
for m in drivers/virtio/virtio.ko drivers/virtio/virtio_ring.ko drivers/virtio/virtio_mmio.ko \
    drivers/char/hw_random/virtio-rng.ko net/vmw_vsock/vsock.ko \
    net/vmw_vsock/vmw_vsock_virtio_transport_common.ko net/vmw_vsock/vmw_vsock_virtio_transport.ko \
    drivers/block/virtio_blk.ko lib/libcrc32c.ko fs/erofs/erofs.ko fs/overlayfs/overlay.ko \
    drivers/virtio/virtio_balloon.ko; do
    cp "$modules/$m" "$l2/mod/"
done
cp "$agent" "$l2/bin/brig-agent"
cp "$shim" "$l2/bin/brig-shim"
for a in switch_root cp touch; do ln -sf busybox "$l2/bin/$a"; done
# The guest reports, keeps some state in its tmpfs, asks the VMM for a snapshot (a write to
# the trigger address), and on resume shows that state again before rebooting.
cat > "$l2/init" <<'INIT'
#!/bin/sh
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
INIT
chmod +x "$l2/init"
(cd "$l2" && find . | cpio -o -H newc --quiet | gzip -1 > "$out/l2-initrd.gz")

# 4. The emulated host's initramfs.
l1="$work/l1"
mkdir -p "$l1/bin" "$l1/proc" "$l1/sys" "$l1/dev" "$l1/mod" "$l1/l2" "$l1/tmp" "$l1/etc" \
    "$l1/lib/x86_64-linux-gnu" "$l1/lib64"
strip -o "$l1/bin/brigd" "$debug_bins/brigd"
strip -o "$l1/bin/brig" "$debug_bins/brig"
for lib in libc.so.6 libm.so.6 libgcc_s.so.1; do cp -L "/lib/x86_64-linux-gnu/$lib" "$l1/lib/x86_64-linux-gnu/"; done
cp -L /lib64/ld-linux-x86-64.so.2 "$l1/lib64/"
cp /usr/bin/busybox "$l1/bin/busybox"
for a in sh mount echo insmod reboot cat sleep [ test ip tr sed grep; do ln -s busybox "$l1/bin/$a"; done
# The full-VM tier's networking: iproute2, nftables and nsenter with their libraries, and the
# kernel modules they need (tun, veth, nf_tables…), loaded on demand by busybox modprobe.
rm -f "$l1/bin/ip"
for bin in /usr/sbin/ip /usr/sbin/nft /usr/bin/nsenter; do
    cp "$bin" "$l1/bin/"
    for lib in $(ldd "$bin" | awk '$3 ~ /^\// {print $3}'); do
        cp -Ln "$lib" "$l1/lib/x86_64-linux-gnu/" 2>/dev/null || true
    done
done
mkdir -p "$l1/sbin" && ln -s ../bin/busybox "$l1/sbin/modprobe"
kver=$(basename "$(dirname "$modules")")
for d in net/netfilter net/ipv4/netfilter net/ipv6/netfilter drivers/net/tun.ko drivers/net/veth.ko \
    lib/libcrc32c.ko; do
    mkdir -p "$l1/lib/modules/$kver/kernel/$(dirname "$d")"
    cp -r "$modules/$d" "$l1/lib/modules/$kver/kernel/$d"
done
depmod -b "$l1" "$kver"
cp "$modules/virt/lib/irqbypass.ko" "$modules/arch/x86/kvm/kvm.ko" "$modules/arch/x86/kvm/kvm-amd.ko" "$l1/mod/"
# Its network (QEMU's virtio-net over virtio-mmio): the test outside reaches brigd through it.
for m in drivers/virtio/virtio_ring.ko drivers/virtio/virtio.ko drivers/virtio/virtio_mmio.ko \
    net/core/failover.ko drivers/net/net_failover.ko drivers/net/virtio_net.ko \
    drivers/block/virtio_blk.ko; do
    cp "$modules/$m" "$l1/mod/"
done
cp "$vmm" "$l1/bin/brig-vmm"
cp "$target_dir/x86_64-unknown-linux-musl/release/brig-vmtier-check" "$l1/bin/brig-vmtier-check"
cp "$out/vmlinuz" "$l1/l2/vmlinuz"
cp "$out/l2-initrd.gz" "$l1/l2/initrd.gz"
# The guest's disks for the snapshot flow: the busybox layer image and an empty ext4 disk.
cp "${BRIG_ARTIFACTS:-$root/artifacts}/images/busybox.erofs" "$l1/l2/busybox.erofs"
truncate -s 32M "$l1/l2/scratch.img" && mkfs.ext4 -q -F "$l1/l2/scratch.img"
# A second layer to stack over busybox (`--image busybox+extra`), with one file of its own.
extra="$work/extra-layer"
mkdir -p "$extra/etc"
echo "from the extra layer" > "$extra/etc/extra-layer.txt"
mkfs.erofs --quiet "$l1/l2/extra.erofs" "$extra"
cat > "$l1/init" <<'INIT'
#!/bin/sh
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
    "console=ttyS0 reboot=t panic=-1 quiet initcall_blacklist=i8042_init pci=off" /tmp/tier
echo "BRIG-L1-VMTIER rc=$?"
# Snapshots take room in this RAM-backed root (at most half the emulated host's memory).
rm -rf /tmp/tier /tmp/snap
# brigd serving the microvm tier on the emulated host's network; the brig CLI (over the SDK and
# QUIC) drives it here, then the test outside drives it through QEMU's port forward.
ip link set lo up
for m in virtio_ring virtio virtio_mmio failover net_failover virtio_net; do insmod /mod/$m.ko; done
ip addr add 10.0.2.15/24 dev eth0; ip link set eth0 up
# Guest file reads capped at 16 MiB here, so the test's endless reads end soon under TCG.
printf 'max_guest_read_mib = 16\n[microvm]\nkernel = "/l2/vmlinuz"\ninitrd = "/l2/initrd.gz"\nvmm = "/bin/brig-vmm"\nimages_dir = "/l2"\nboot_limit_s = 420\n' > /etc/brigd.toml
export BRIG_STATE_DIR=/tmp/brig
/bin/brigd --config /etc/brigd.toml --listen 10.0.2.15:7070 --metrics off --on-exit destroy --log warn &
i=0; until [ -e /tmp/brig/endpoint.json ] || [ $i -ge 300 ]; do sleep 0.2; i=$((i + 1)); done
id=$(/bin/brig create --tier microvm)
echo "BRIG-L1-BRIG-CREATE id=$id"
/bin/brig exec "$id" -- sh -c 'echo "hello from a microvm sandbox"; echo to-stderr >&2; exit 5'
echo "BRIG-L1-BRIG-EXEC rc=$?"
echo "a file from the host" > /tmp/host-file
/bin/brig file put "$id" /tmp/host-file /work/notes.txt && \
    /bin/brig exec "$id" -- sh -c 'echo "and a line from the guest" >> /work/notes.txt' && \
    echo "BRIG-L1-BRIG-FILE $(/bin/brig file get "$id" /work/notes.txt | tr '\n' '|')"
/bin/brig rm "$id" && echo "BRIG-L1-BRIG-RM ok"
# A microVM sandbox from an image: its layer on a read-only disk, its own writable disk.
img=$(/bin/brig create --tier microvm --image busybox)
/bin/brig exec "$img" -- sh -c 'echo "BRIG-L1-BRIG-IMAGE busybox=$(test -x /bin/busybox && echo yes) entries=$(ls /bin | wc -l) $(cat /from-guest.txt)"'
/bin/brig rm "$img" >/dev/null
# The outside's turn: it learns the certificate pin and token here, and says it is done with a
# sandbox labelled phase=done (4 minutes at most).
pin=$(sed -n 's/.*"cert_sha256": *"\([0-9a-f]*\)".*/\1/p' /tmp/brig/endpoint.json)
echo "BRIG-L1-ENDPOINT pin=$pin token=$(cat /tmp/brig/access-token)"
i=0; until /bin/brig ls --label phase=done 2>/dev/null | grep -q sb- || [ $i -ge 1200 ]; do sleep 0.2; i=$((i + 1)); done
echo "BRIG-L1-OUTSIDE-DONE"
reboot -f
INIT
chmod +x "$l1/init"
# brig-bench fullvm's measurement, run in the emulated host when this host cannot boot Linux.
cp "$root/bench/scripts/fullvm-measure.sh" "$l1/fullvm-measure.sh"
cat > "$l1/fullvm.sh" <<'FULLVM'
# The full-VM tier in the emulated host: brigd boots the Debian image (QEMU's first disk) for
# each fullvm sandbox, and the brig CLI drives it. The sandbox has egress rules: its virtio-net
# is a tap in a network namespace of its own whose link to the node lets only the `web`
# service through, a web server in another namespace ("remote") on the emulated host.
for m in virtio_ring virtio virtio_mmio virtio_blk failover net_failover virtio_net; do insmod /mod/$m.ko; done
modprobe tun && modprobe veth || echo "BRIG-L1-FULLVM no tun or veth"
mount -t cgroup2 cgroup2 /sys/fs/cgroup && echo "+memory +pids +cpu" > /sys/fs/cgroup/cgroup.subtree_control
mkdir -p /fullvm && mount -t ext4 -o ro,noload /dev/vda /fullvm
k=$(ls /fullvm/boot/vmlinuz-* | head -1); i=$(ls /fullvm/boot/initrd.img-* | head -1)
echo "BRIG-L1-FULLVM image kernel=$k"
ip link set lo up; ip addr add 10.0.2.15/24 dev eth0; ip link set eth0 up
# (/bin/ip is iproute2: busybox sh would run its own `ip` applet, which knows no namespaces.)
mkdir -p /run/netns /srv/www && echo "hello from the allowed service" > /srv/www/hello.txt
/bin/ip netns add remote && /bin/ip link add rv0 type veth peer name rv1 && /bin/ip link set rv1 netns remote
/bin/ip addr add 10.77.0.1/24 dev rv0 && /bin/ip link set rv0 up
/bin/ip -n remote addr add 10.77.0.2/24 dev rv1 && /bin/ip -n remote link set rv1 up && /bin/ip -n remote link set lo up
/bin/ip netns exec remote busybox httpd -p 8080 -h /srv/www && /bin/ip netns exec remote busybox httpd -p 8081 -h /srv/www || echo "BRIG-L1-FULLVM no remote service"
printf '[fullvm]\nimage = "/dev/vda"\nkernel = "%s"\ninitrd = "%s"\nvmm = "/bin/brig-vmm"\nboot_limit_s = 420\n' "$k" "$i" > /etc/brigd.toml
export BRIG_STATE_DIR=/tmp/brig
/bin/brigd --config /etc/brigd.toml --listen 10.0.2.15:7070 --metrics off --on-exit destroy --log warn \
    --egress-service web=10.77.0.2:8080 &
n=0; until [ -e /tmp/brig/endpoint.json ] || [ $n -ge 300 ]; do sleep 0.2; n=$((n + 1)); done
/bin/brig node | grep fullvm >/dev/null && echo "BRIG-L1-FULLVM offered"
# brig-bench fullvm (brig.l1=fullvm-bench brig.bench.count=N): boots and measures, then stops.
if grep -q brig.l1=fullvm-bench /proc/cmdline; then
    count=$(sed -n 's/.*brig\.bench\.count=\([0-9]*\).*/\1/p' /proc/cmdline)
    /bin/sh /fullvm-measure.sh /bin/brig /tmp/brig "${count:-2}" 20
    reboot -f
fi
id=$(/bin/brig create --tier fullvm --egress web)
echo "BRIG-L1-FULLVM created id=$id"
/bin/brig exec "$id" -- sh -c 'echo "BRIG-L1-FULLVM booted init=$(cat /proc/1/comm) state=$(systemctl is-system-running --wait) cpus=$(nproc) root=$(findmnt -no SOURCE /)"'
# Egress: the allowed service answers; the same server's other port does not.
web='exec 3<>/dev/tcp/10.77.0.2/8080 && printf "GET /hello.txt HTTP/1.0\r\n\r\n" >&3 && tail -1 <&3'
/bin/brig exec "$id" -- bash -c "echo \"BRIG-L1-FULLVM egress allowed=\$($web)\""
/bin/brig exec "$id" -- bash -c 'timeout 5 bash -c "exec 3<>/dev/tcp/10.77.0.2/8081" 2>/dev/null && echo "BRIG-L1-FULLVM egress reached 8081"; echo "BRIG-L1-FULLVM egress denied-done"'
sleep 2
echo "BRIG-L1-FULLVM audit denied=$(/bin/brig audit "$id" | grep -c 'egress DENIED tcp 10.77.0.2:8081')"
# A service: PostgreSQL starts under systemd and answers a client inside the VM, over TCP.
/bin/brig exec "$id" -- sh -c 'systemctl start postgresql && pg_isready -q -t 120 -h 127.0.0.1 && echo "BRIG-L1-FULLVM postgres answer=$(su postgres -c "psql -h /var/run/postgresql -tAc \"select 40 + 2\"")"'
/bin/brig exec "$id" -- sh -c 'echo kept-across-pause > /root/mark'
/bin/brig pause "$id" >/dev/null && echo "BRIG-L1-FULLVM paused"
/bin/brig exec "$id" -- sh -c 'echo "BRIG-L1-FULLVM resumed mark=$(cat /root/mark) postgres=$(pg_isready -t 30 -h 127.0.0.1 >/dev/null && echo up)"'
/bin/brig exec "$id" -- bash -c "echo \"BRIG-L1-FULLVM resumed egress=\$($web)\""
child=$(/bin/brig fork "$id" -n 1)
/bin/brig exec "$child" -- sh -c 'echo child-only > /root/child; echo "BRIG-L1-FULLVM fork mark=$(cat /root/mark) postgres=$(pg_isready -t 30 -h 127.0.0.1 >/dev/null && echo up) host=$(hostname)"'
/bin/brig exec "$child" -- bash -c "echo \"BRIG-L1-FULLVM fork egress=\$($web)\""
/bin/brig exec "$id" -- sh -c 'echo "BRIG-L1-FULLVM parent sees-child-file=$(test -e /root/child && echo yes || echo no) host=$(hostname)"'
/bin/brig rm "$id" "$child" >/dev/null && echo "BRIG-L1-FULLVM removed"
left=$(ls /tmp/brig/fullvm 2>/dev/null | grep -c -e '\.disk$' -e '\.sock$')
echo "BRIG-L1-FULLVM leftovers=$left netns=$(/bin/ip netns list | grep -c '^brig-')"
reboot -f
FULLVM
cat > "$l1/chost.sh" <<'CHOST'
# Containers in a container-host VM: brigd places container sandboxes in a VM it boots from
# the guest kernel and initramfs (brig.role=container-host) with the layer images as disks.
# The CLI here creates one; the test outside drives others with the SDK through QEMU's UDP
# forward, then asks (a sandbox labelled phase=kill-host) for the VM to be killed, and ends
# with phase=done.
for m in virtio_ring virtio virtio_mmio failover net_failover virtio_net; do insmod /mod/$m.ko; done
mount -t cgroup2 cgroup2 /sys/fs/cgroup && echo "+memory +pids +cpu" > /sys/fs/cgroup/cgroup.subtree_control
ip link set lo up; ip addr add 10.0.2.15/24 dev eth0; ip link set eth0 up
printf 'max_guest_read_mib = 16\n[container]\nimages_dir = "/l2"\n[container_host]\nkernel = "/l2/vmlinuz"\ninitrd = "/l2/initrd.gz"\nvmm = "/bin/brig-vmm"\nmem_mib = 768\nvcpus = 1\nplacement = "vm"\nboot_limit_s = 420\n' > /etc/brigd.toml
export BRIG_STATE_DIR=/tmp/brig
/bin/brigd --config /etc/brigd.toml --listen 10.0.2.15:7070 --metrics off --on-exit destroy --log warn &
n=0; until [ -e /tmp/brig/endpoint.json ] || [ $n -ge 300 ]; do sleep 0.2; n=$((n + 1)); done
/bin/brig node | grep -q container && echo "BRIG-L1-CHOST offered"
id=$(/bin/brig create --tier container --image busybox)
echo "BRIG-L1-CHOST created id=$id"
echo "BRIG-L1-CHOST status $(/bin/brig status "$id" | grep 'runs on' | tr -s ' ')"
/bin/brig exec "$id" -- sh -c 'echo "BRIG-L1-CHOST exec host=$(hostname) busybox=$(test -x /bin/busybox && echo yes)"'
/bin/brig rm "$id" >/dev/null && echo "BRIG-L1-CHOST removed"
pin=$(sed -n 's/.*"cert_sha256": *"\([0-9a-f]*\)".*/\1/p' /tmp/brig/endpoint.json)
echo "BRIG-L1-ENDPOINT pin=$pin token=$(cat /tmp/brig/access-token)"
wait_label() { i=0; until /bin/brig ls --label "phase=$1" 2>/dev/null | grep -q sb- || [ $i -ge 2400 ]; do sleep 0.2; i=$((i + 1)); done; }
wait_label kill-host
pid=$(cat /tmp/brig/container-host/chost-0.pid 2>/dev/null)
[ -n "$pid" ] && kill -9 "$pid" && echo "BRIG-L1-CHOST killed chost-0 pid=$pid"
wait_label done
echo "BRIG-L1-OUTSIDE-DONE"
reboot -f
CHOST
(cd "$l1" && find . | cpio -o -H newc --quiet | gzip -1 > "$out/l1-initrd.gz")
echo "microVM test guests in $out"
