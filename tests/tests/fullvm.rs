//! The full-VM tier end to end. This machine's KVM cannot boot Linux, so it runs inside an
//! emulated host (QEMU TCG with nested SVM, see `brig_tests::emulated`) whose first disk is the
//! Debian image `scripts/build-fullvm-image.sh` builds: systemd as init, its own kernel and
//! initramfs, PostgreSQL, brig-agent as a service. brigd there offers `--tier fullvm`, and the
//! brig CLI (the SDK over QUIC) creates a sandbox, which boots the image on brig-vmm with a
//! copy-on-write overlay of its own; runs commands in it; starts PostgreSQL and queries it from
//! inside; pauses it and resumes it implicitly with its files and running service intact;
//! forks it (the child carries the running database, the parent does not see the child's
//! files); and removes both, leaving no disks, sockets or network namespaces behind. The
//! sandbox has egress rules: its virtio-net is a tap in a network namespace of its own, and
//! it reaches the one service they allow (a web server in another namespace of the emulated
//! host) but not that server's other port, which the audit trail records as denied; after the
//! resume and in the fork's child (a network of its own) the service still answers.
//! Emulated timings prove nothing about speed and are not asserted.

use std::time::Duration;

use brig_tests::artifacts;
use brig_tests::emulated;

#[test]
fn a_debian_vm_boots_systemd_serves_postgres_and_forks_inside_an_emulated_host() {
    let image = artifacts().join("fullvm").join("rootfs.ext4");
    assert!(image.exists(), "{} is missing: run scripts/build-fullvm-image.sh", image.display());
    let qemu = emulated::qemu(None, Some(&image), "brig.l1=fullvm");
    let (log, status) = emulated::run(qemu, Duration::from_secs(900), "fullvm-boot.log");
    let has = |marker: &str| log.contains(marker);
    assert!(has("BRIG-L1-UP kvm=yes"), "the emulated host has no KVM (status {status}):\n{log}");
    assert!(has("BRIG-L1-FULLVM offered"), "brigd does not offer fullvm:\n{log}");
    assert!(has("BRIG-L1-FULLVM created id=sb-"), "no fullvm sandbox:\n{log}");
    // The image's own init ran the system to the end, on two vCPUs, from the virtio-blk root.
    assert!(
        has("BRIG-L1-FULLVM booted init=systemd state=running cpus=2 root=/dev/vda"),
        "the image did not boot under systemd:\n{log}"
    );
    assert!(!has("BRIG-L1-FULLVM no remote service"), "no web service to reach:\n{log}");
    let web = "hello from the allowed service";
    assert!(has(&format!("BRIG-L1-FULLVM egress allowed={web}")), "no egress:\n{log}");
    assert!(has("BRIG-L1-FULLVM egress denied-done"), "{log}");
    assert!(!has("BRIG-L1-FULLVM egress reached"), "a denied port answered:\n{log}");
    let denied: u32 = log
        .lines()
        .find_map(|l| l.split("BRIG-L1-FULLVM audit denied=").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(denied >= 1, "the denied connection is not in the audit trail:\n{log}");
    assert!(has("BRIG-L1-FULLVM postgres answer=42"), "PostgreSQL did not answer:\n{log}");
    assert!(has("BRIG-L1-FULLVM paused"), "pause failed:\n{log}");
    assert!(
        has("BRIG-L1-FULLVM resumed mark=kept-across-pause postgres=up"),
        "the resumed VM lost its files or its service:\n{log}"
    );
    assert!(has(&format!("BRIG-L1-FULLVM resumed egress={web}")), "no egress after resume:\n{log}");
    assert!(
        has("BRIG-L1-FULLVM fork mark=kept-across-pause postgres=up host=brig-"),
        "the fork did not carry the parent's state:\n{log}"
    );
    assert!(has(&format!("BRIG-L1-FULLVM fork egress={web}")), "the child has no egress:\n{log}");
    assert!(has("BRIG-L1-FULLVM parent sees-child-file=no"), "fork children share disks:\n{log}");
    let hosts: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("BRIG-L1-FULLVM fork") || l.contains("BRIG-L1-FULLVM parent"))
        .filter_map(|l| l.split("host=").nth(1))
        .collect();
    assert!(
        hosts.len() == 2 && hosts[0] != hosts[1],
        "parent and child share a hostname: {hosts:?}"
    );
    assert!(has("BRIG-L1-FULLVM removed") && has("BRIG-L1-FULLVM leftovers=0 netns=0"), "{log}");
}
