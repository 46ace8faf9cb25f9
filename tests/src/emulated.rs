//! The software-emulated host Linux-guest tests run in (GUEST.md section 2): QEMU TCG with an
//! emulated AMD-V CPU, booting Debian's cloud kernel with the test initramfs
//! `scripts/build-vm-guests.sh` makes; its init loads KVM with nested SVM and runs brig-vmm
//! and brigd. Emulated timings are for correctness only.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A file `scripts/build-vm-guests.sh` made (`artifacts/vm/<name>`).
pub fn vm_artifact(name: &str) -> PathBuf {
    let path = crate::artifacts().join("vm").join(name);
    assert!(path.exists(), "{} is missing: run scripts/build-vm-guests.sh", path.display());
    path
}

/// The host's TSC in kHz, which the emulated host needs to skip its (flaky under TCG)
/// calibration.
pub fn tsc_khz() -> u64 {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    cpuinfo
        .lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(2_000_000, |mhz| (mhz * 1000.0) as u64)
}

/// A free UDP port on the host's loopback (for QEMU's forward to brigd in the emulated host).
pub fn free_udp_port() -> u16 {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    socket.local_addr().expect("addr").port()
}

/// The emulated host's QEMU command: one vCPU, 4 GiB, console on stdout, a user-mode network
/// whose UDP `forward` port (if any) reaches brigd at 10.0.2.15:7070, `disk` (if any) as a
/// virtio-blk disk whose writes are thrown away, and `append` added to the kernel's command
/// line (the init reads `brig.l1=…` there).
pub fn qemu(forward: Option<u16>, disk: Option<&Path>, append: &str) -> Command {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-accel", "tcg,thread=multi"])
        .args(["-M", "microvm,x-option-roms=off,isa-serial=on,rtc=on", "-cpu", "max", "-smp", "1"])
        .args(["-m", "4G", "-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio"])
        .arg("-no-reboot")
        .arg("-netdev");
    match forward {
        Some(port) => cmd.arg(format!("user,id=n0,hostfwd=udp:127.0.0.1:{port}-10.0.2.15:7070")),
        None => cmd.arg("user,id=n0"),
    };
    cmd.args(["-device", "virtio-net-device,netdev=n0"]);
    if let Some(disk) = disk {
        cmd.arg("-drive")
            .arg(format!("file={},if=none,id=d0,format=raw,snapshot=on", disk.display()))
            .args(["-device", "virtio-blk-device,drive=d0"]);
    }
    cmd.arg("-kernel")
        .arg(vm_artifact("vmlinuz"))
        .arg("-initrd")
        .arg(vm_artifact("l1-initrd.gz"))
        .arg("-append")
        .arg(format!("console=ttyS0 reboot=t panic=-1 quiet tsc_early_khz={} {append}", tsc_khz()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Kills process `pid` if it still runs after `limit` (an emulated run that hangs fails its
/// test with its log instead of holding CI); the thread ends when the process does.
pub fn watchdog(pid: u32, limit: Duration) -> std::thread::JoinHandle<()> {
    let started = Instant::now();
    std::thread::spawn(move || {
        while started.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(500));
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
        }
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    })
}

/// Keeps an emulated run's console as `artifacts/reports/<name>`.
pub fn keep_report(name: &str, log: &str) {
    let reports = crate::artifacts().join("reports");
    let _ = std::fs::create_dir_all(&reports);
    let _ = std::fs::write(reports.join(name), log);
}
