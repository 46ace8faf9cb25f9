#!/usr/bin/env bash
# Builds what the microVM tests boot, into artifacts/vm/:
#   vmlinuz          Debian's linux-image-cloud-amd64 kernel (guest, and the emulated host's)
#   l2-initrd.gz     the guest's initramfs: busybox, an /init that reports and reboots; with
#                    `brig.role=container-host` on its command line it is a container-host VM
#                    instead: brig-agent runs the container runtime (with brig-shim)
#   l1-initrd.gz     the emulated host's initramfs: busybox, the KVM modules (nested SVM), a
#                    static (musl) brig-vmm, brigd and the CLI, and the guest above
# The init scripts of both are tests/emulated/*.sh: each emulated host sets up its machine and
# serves brigd, and the test outside (tests/tests/{microvm,fullvm,container_host}.rs) drives it
# with the SDK through QEMU's port forward, checking each step where it happens.
# The kernel package is downloaded once (Debian's archive); the rest is rebuilt every run
# (a few seconds), so the emulated host always carries the current brig-vmm.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${BRIG_ARTIFACTS:-$root/artifacts}/vm"
mkdir -p "$out"
work="$(mktemp -d)"
# What the emulated hosts and guests run (their init scripts) lives with the tests.
scenarios="$root/tests/emulated"
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
install -m 0755 "$scenarios/l2-init.sh" "$l2/init"
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
for a in sh mount echo insmod reboot cat sleep [ test ip tr sed grep ls tail; do ln -s busybox "$l1/bin/$a"; done
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
for f in l1-init.sh:init fullvm.sh chost.sh announce.sh stalled.sh; do
    install -m 0755 "$scenarios/${f%%:*}" "$l1/${f#*:}"
done
# brig-bench fullvm's measurement, run in the emulated host when this host cannot boot Linux.
cp "$root/bench/scripts/fullvm-measure.sh" "$l1/fullvm-measure.sh"
(cd "$l1" && find . | cpio -o -H newc --quiet | gzip -1 > "$out/l1-initrd.gz")
echo "microVM test guests in $out"
