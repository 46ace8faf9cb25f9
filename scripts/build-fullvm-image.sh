#!/usr/bin/env bash
# Builds the full-VM tier's operating system image into artifacts/fullvm/:
#   rootfs.ext4      Debian 12 with systemd as init, its own kernel and modules (the cloud
#                    kernel), PostgreSQL (installed, not started at boot) and brig-agent as a
#                    systemd service; the VM boots it from a virtio-blk disk
#   vmlinuz          the image's kernel and initramfs, copied out of its /boot (the VMM loads
#   initrd.img       them; the initramfs finds the root disk over virtio-mmio)
# The debootstrap tree is kept (artifacts/fullvm/tree) and rebuilt only when the package list
# or its set-up below changes; brig-agent and the ext4 image are refreshed on every run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${BRIG_ARTIFACTS:-$root/artifacts}/fullvm"
tree="$out/tree"
mirror="${BRIG_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
packages=systemd,systemd-sysv,udev,kmod,iproute2,procps,initramfs-tools,linux-image-cloud-amd64,postgresql,ca-certificates
mkdir -p "$out"

# The tree's recipe: the package list and the set-up function below.
set_up_tree() {
    local t=$1
    echo brig-fullvm > "$t/etc/hostname"
    printf '127.0.0.1 localhost\n127.0.1.1 brig-fullvm\n' > "$t/etc/hosts"
    printf '/dev/vda / ext4 rw,relatime 0 1\n' > "$t/etc/fstab"
    # The initramfs must find the root disk: virtio-mmio devices described in ACPI.
    printf 'virtio_mmio\nvirtio_blk\next4\n' >> "$t/etc/initramfs-tools/modules"
    printf 'vsock\nvmw_vsock_virtio_transport\nvirtio_rng\nvirtio_balloon\nvirtio_net\n' \
        > "$t/etc/modules-load.d/brig.conf"
    cat > "$t/etc/systemd/system/brig-agent.service" <<'UNIT'
[Unit]
Description=Brig agent: serves the host over virtio-vsock
After=systemd-modules-load.service
Wants=systemd-modules-load.service

[Service]
ExecStart=/usr/local/bin/brig-agent
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
UNIT
    chroot "$t" systemctl enable brig-agent.service
    # A sandbox starts its services itself; nothing waits for a login or a timer at boot.
    chroot "$t" systemctl disable postgresql.service
    chroot "$t" systemctl mask serial-getty@ttyS0.service getty@tty1.service \
        apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
        systemd-timesyncd.service 2>/dev/null || true
    chroot "$t" update-initramfs -u -k all
    rm -rf "$t/var/cache/apt/archives/"*.deb "$t/var/lib/apt/lists/"*
}
recipe=$( (echo "$packages"; declare -f set_up_tree) | sha256sum | cut -c1-16)

if [[ ! -f "$tree/.brig-recipe" || "$(cat "$tree/.brig-recipe")" != "$recipe" ]]; then
    echo "[fullvm] debootstrap ($mirror): $packages"
    rm -rf "$tree" "$tree.tmp"
    debootstrap --variant=minbase --include="$packages" bookworm "$tree.tmp" "$mirror" \
        > "$out/debootstrap.log" 2>&1 || { tail -30 "$out/debootstrap.log" >&2; exit 1; }
    set_up_tree "$tree.tmp" >> "$out/debootstrap.log" 2>&1 \
        || { tail -30 "$out/debootstrap.log" >&2; exit 1; }
    echo "$recipe" > "$tree.tmp/.brig-recipe"
    mv "$tree.tmp" "$tree"
fi

# brig-agent, static, in the image; then the ext4 root disk and the boot files.
target_dir="${CARGO_TARGET_DIR:-$root/target}"
cargo build --quiet --release --target x86_64-unknown-linux-musl -p brig-agent \
    --manifest-path "$root/Cargo.toml"
install -m 0755 "$target_dir/x86_64-unknown-linux-musl/release/brig-agent" \
    "$tree/usr/local/bin/brig-agent"
used_mib=$(du -sm --exclude=./.brig-recipe "$tree" | cut -f1)
size_mib=$((used_mib + used_mib / 4 + 256))
rm -f "$out/rootfs.ext4.tmp"
mke2fs -q -t ext4 -L brigroot -d "$tree" "$out/rootfs.ext4.tmp" "${size_mib}M"
mv "$out/rootfs.ext4.tmp" "$out/rootfs.ext4"
cp "$(ls "$tree"/boot/vmlinuz-* | head -1)" "$out/vmlinuz"
cp "$(ls "$tree"/boot/initrd.img-* | head -1)" "$out/initrd.img"
echo "full-VM image in $out: rootfs.ext4 ($size_mib MiB, $used_mib MiB used), vmlinuz, initrd.img"
