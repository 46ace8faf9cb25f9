# The emulated host's part of the full-VM test (tests/tests/fullvm.rs): it sets up what the
# test cannot from outside and serves brigd; the test drives every step with the SDK through
# QEMU's UDP forward. brigd boots the Debian image (QEMU's first disk) for each fullvm
# sandbox. A fullvm sandbox with egress rules has its virtio-net as a tap in a network
# namespace of its own, whose link to the node lets only the `web` service through: a web
# server in another namespace ("remote") of the emulated host, on port 8080 (8081 is the same
# server on a port the rules deny).
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
brigd_flags="--config /etc/brigd.toml --listen 10.0.2.15:7070 --metrics off --on-exit destroy \
    --log warn --egress-service web=10.77.0.2:8080"
/bin/brigd $brigd_flags &
brigd=$!
n=0; until [ -e /tmp/brig/endpoint.json ] || [ $n -ge 300 ]; do sleep 0.2; n=$((n + 1)); done
# brig-bench fullvm (brig.l1=fullvm-bench brig.bench.count=N): boots and measures, then stops.
if grep -q brig.l1=fullvm-bench /proc/cmdline; then
    count=$(sed -n 's/.*brig\.bench\.count=\([0-9]*\).*/\1/p' /proc/cmdline)
    /bin/sh /fullvm-measure.sh /bin/brig /tmp/brig "${count:-2}" 20
    reboot -f
fi
. /announce.sh
# The test asks for a crash: brigd is killed (kill -9) and started again; the new one adopts
# the running full VM with its network. Removing the phase=restart marker says it is back.
wait_label restart 6000
kill -9 $brigd
echo "BRIG-L1-FULLVM brigd killed"
/bin/brigd $brigd_flags &
n=0; until /bin/brig ls >/dev/null 2>&1 || [ $n -ge 900 ]; do sleep 0.2; n=$((n + 1)); done
/bin/brig rm --label phase=restart >/dev/null && echo "BRIG-L1-FULLVM brigd restarted"
wait_label done 6000
# What the removed sandboxes left: disks, control sockets, network namespaces.
left=$(ls /tmp/brig/fullvm 2>/dev/null | grep -c -e '\.disk$' -e '\.sock$')
echo "BRIG-L1-FULLVM leftovers=$left netns=$(/bin/ip netns list | grep -c '^brig-')"
reboot -f
