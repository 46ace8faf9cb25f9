# The emulated host's part of the container-host test (tests/tests/container_host.rs): brigd
# places container sandboxes in a VM it boots from the guest kernel and initramfs
# (brig.role=container-host) with the layer images as disks. The test drives it with the SDK
# through QEMU's UDP forward; it asks (a sandbox labelled phase=restart) for brigd to be
# killed (kill -9) and started again, which adopts the VM with its containers, then (phase=
# kill-host) for the VM to be killed, which only this side can do, and ends with phase=done.
for m in virtio_ring virtio virtio_mmio failover net_failover virtio_net; do insmod /mod/$m.ko; done
mount -t cgroup2 cgroup2 /sys/fs/cgroup && echo "+memory +pids +cpu" > /sys/fs/cgroup/cgroup.subtree_control
ip link set lo up; ip addr add 10.0.2.15/24 dev eth0; ip link set eth0 up
printf 'max_guest_read_mib = 16\n[container]\nimages_dir = "/l2"\n[container_host]\nkernel = "/l2/vmlinuz"\ninitrd = "/l2/initrd.gz"\nvmm = "/bin/brig-vmm"\nmem_mib = 768\nvcpus = 1\nplacement = "vm"\nboot_limit_s = 420\n' > /etc/brigd.toml
export BRIG_STATE_DIR=/tmp/brig
brigd_flags="--config /etc/brigd.toml --listen 10.0.2.15:7070 --metrics off --on-exit destroy --log warn"
/bin/brigd $brigd_flags &
brigd=$!
n=0; until [ -e /tmp/brig/endpoint.json ] || [ $n -ge 300 ]; do sleep 0.2; n=$((n + 1)); done
. /announce.sh
wait_label restart 2400
# The sandbox labelled role=unrecorded loses its record while brigd is down, as one made just
# before a crash would: the restarted brigd must destroy its container in the VM.
unrecorded=$(/bin/brig ls --label role=unrecorded | grep -o 'sb-[0-9a-z-]*' | head -1)
kill -9 $brigd
echo "BRIG-L1-BRIGD-KILLED"
[ -n "$unrecorded" ] && rm -f "/tmp/brig/sandboxes/$unrecorded.json" && echo "BRIG-L1-UNRECORDED $unrecorded"
/bin/brigd $brigd_flags &
n=0; until /bin/brig ls >/dev/null 2>&1 || [ $n -ge 900 ]; do sleep 0.2; n=$((n + 1)); done
/bin/brig rm --label phase=restart >/dev/null
echo "BRIG-L1-BRIGD-RESTARTED"
wait_label kill-host 2400
# The pid file holds the pid and its start time.
pid=$(cut -d" " -f1 /tmp/brig/container-host/chost-0.pid 2>/dev/null)
[ -n "$pid" ] && kill -9 "$pid" && echo "BRIG-L1-CHOST killed chost-0 pid=$pid"
wait_label done 2400
echo "BRIG-L1-OUTSIDE-DONE"
reboot -f
