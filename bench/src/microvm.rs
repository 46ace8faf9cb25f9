//! `microvm`: the VMM's snapshot restore, natively, with the purpose-built test guest (this
//! machine's KVM is PVM, which cannot boot Linux; Linux-guest boot and first-exec figures are
//! reported only from hardware KVM, and this benchmark does not produce them).
//!
//! One snapshot (64 MiB guest, 16 MiB of it written at boot) is restored:
//! - into a fresh `brig-vmm` process, timed from spawn to the guest's first answer;
//! - into a pre-created VM in a waiting `brig-vmm pool` process, timed from the restore command
//!   to the first answer.
//!
//! Then 100 restored VMs are kept alive at once, each with all of its guest memory faulted in
//! (as if the guest had read every page), and their memory is read from /proc: the VMM's own
//! RSS (everything but guest memory) and the PSS per VM (guest pages are shared through the
//! snapshot file's page cache; a page a guest writes becomes its own).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use brig_vmm::Virtualization;
use serde_json::json;

use crate::stats::{round3, Latencies};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Restores timed per kind.
    #[arg(long, default_value_t = 50)]
    restores: usize,
    /// VMs alive at once for the memory figures.
    #[arg(long, default_value_t = 100)]
    vms: usize,
    #[arg(long, default_value_t = 64)]
    mem_mib: usize,
    #[arg(long, default_value_t = 16)]
    touch_mib: u64,
}

pub(crate) struct VmProcess {
    pub(crate) child: Child,
    pub(crate) stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl VmProcess {
    pub(crate) fn spawn(args: &[&str]) -> anyhow::Result<VmProcess> {
        let mut child = Command::new(brig_tests::binary("brig-vmm"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow::anyhow!("no stdin"))?;
        let stdout =
            BufReader::new(child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?);
        Ok(VmProcess { child, stdin, stdout })
    }

    pub(crate) fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        anyhow::ensure!(!line.is_empty(), "brig-vmm exited early");
        Ok(line)
    }

    /// The first answer line, checked.
    pub(crate) fn first_answer(&mut self) -> anyhow::Result<()> {
        let line = self.line()?;
        let v: serde_json::Value = serde_json::from_str(&line)?;
        anyhow::ensure!(v["reply"] == 1002, "restored guest answered {line}");
        Ok(())
    }

    pub(crate) fn finish(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

/// (Rss, Pss) in KiB of `pid`: all mappings, and those of the snapshot memory file.
pub(crate) fn memory_kib(pid: u32) -> anyhow::Result<((u64, u64), (u64, u64))> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let (mut all, mut guest) = ((0, 0), (0, 0));
    let mut in_guest = false;
    for line in smaps.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or("");
        if first.contains('-') && first.chars().next().is_some_and(|c| c.is_ascii_hexdigit()) {
            in_guest = line.ends_with("/vm.mem");
            continue;
        }
        let kib: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        let slot = match first {
            "Rss:" => 0,
            "Pss:" => 1,
            _ => continue,
        };
        for (cond, target) in [(true, &mut all), (in_guest, &mut guest)] {
            if cond {
                if slot == 0 {
                    target.0 += kib;
                } else {
                    target.1 += kib;
                }
            }
        }
    }
    Ok((all, guest))
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    let (virtualization, _dir, snap_text) = snapshot(opts.mem_mib, opts.touch_mib)?;

    let mut fresh = Latencies::default();
    for _ in 0..opts.restores {
        let started = Instant::now();
        let mut vm = VmProcess::spawn(&["restore", "--snapshot", &snap_text])?;
        vm.first_answer()?;
        fresh.record(started.elapsed());
        vm.finish();
    }
    let mut prewarmed = Latencies::default();
    for _ in 0..opts.restores {
        let mut vm = VmProcess::spawn(&["pool", "--mem-mib", &opts.mem_mib.to_string()])?;
        anyhow::ensure!(vm.line()?.trim() == "ready", "pool did not get ready");
        let started = Instant::now();
        writeln!(vm.stdin, "restore {snap_text}")?;
        vm.stdin.flush()?;
        vm.first_answer()?;
        prewarmed.record(started.elapsed());
        vm.finish();
    }

    // Many VMs from one snapshot, alive together.
    let mut alive = Vec::new();
    for _ in 0..opts.vms {
        let mut vm = VmProcess::spawn(&["restore", "--snapshot", &snap_text, "--touch-all"])?;
        vm.first_answer()?;
        alive.push(vm);
    }
    let (mut rss_total, mut pss_total, mut guest_pss_total, mut vmm_rss) = (0u64, 0u64, 0u64, 0u64);
    for (i, vm) in alive.iter().enumerate() {
        let ((rss, pss), (guest_rss, guest_pss)) = memory_kib(vm.child.id())?;
        rss_total += rss;
        pss_total += pss;
        guest_pss_total += guest_pss;
        if i == 0 {
            vmm_rss = rss - guest_rss;
        }
    }
    // Each still answers.
    for vm in &mut alive {
        writeln!(vm.stdin, "1")?;
        vm.stdin.flush()?;
        vm.line()?;
    }
    for vm in alive {
        vm.finish();
    }
    let n = opts.vms.max(1) as f64;
    let mib = |kib: u64| kib as f64 / 1024.0;
    let (fresh_p50, pre_p50) = (fresh.quantile_ms(0.5), prewarmed.quantile_ms(0.5));
    println!(
        "microvm on {} (purpose-built guest; no Linux boot figures here)",
        virtualization.as_str()
    );
    println!(
        "  restore → first answer, fresh process   p50 {fresh_p50:.3} ms  p99 {:.3} ms",
        fresh.quantile_ms(0.99)
    );
    println!(
        "  restore → first answer, pre-created VM  p50 {pre_p50:.3} ms  p99 {:.3} ms",
        prewarmed.quantile_ms(0.99)
    );
    println!("  VMM RSS without guest memory            {:.2} MiB", mib(vmm_rss));
    println!(
        "  {} VMs from one snapshot: PSS per VM {:.2} MiB (guest memory {:.2} MiB of it; RSS per VM {:.2} MiB)",
        opts.vms,
        mib(pss_total) / n,
        mib(guest_pss_total) / n,
        mib(rss_total) / n
    );
    Ok(json!({
        "bench": "microvm",
        "virtualization": virtualization.as_str(),
        "guest": "purpose-built",
        "restore_fresh_p50_ms": round3(fresh_p50),
        "restore_fresh_p99_ms": round3(fresh.quantile_ms(0.99)),
        "restore_prewarmed_p50_ms": round3(pre_p50),
        "restore_prewarmed_p99_ms": round3(prewarmed.quantile_ms(0.99)),
        "vmm_rss_mib": round3(mib(vmm_rss)),
        "pss_per_vm_mib": round3(mib(pss_total) / n),
        "guest_pss_per_vm_mib": round3(mib(guest_pss_total) / n),
        "vms": opts.vms,
        "guest_mib": opts.mem_mib,
        "guest_written_mib": opts.touch_mib,
    }))
}

/// `density --tier microvm`: brig-vmm processes restored from one snapshot of the
/// purpose-built guest, started until `max` are alive or the host's available memory drops
/// under `min_free_mib`; random ones must keep answering within `deadline_ms`. These are
/// started directly: brigd does not serve the microvm tier yet.
pub fn density(
    max: usize,
    sample: usize,
    deadline_ms: u64,
    min_free_mib: u64,
) -> anyhow::Result<serde_json::Value> {
    let (virtualization, _dir, snap_text) = snapshot(64, 16)?;
    let avail0 = crate::meminfo_kib("MemAvailable:");
    let started = Instant::now();
    let mut alive: Vec<VmProcess> = Vec::new();
    let mut samples = Latencies::default();
    let (mut slow, mut stopped_by) = (0usize, format!("limit of {max}"));
    'fill: while alive.len() < max {
        for _ in 0..100.min(max - alive.len()) {
            if crate::meminfo_kib("MemAvailable:") < min_free_mib * 1024 {
                stopped_by = format!("host memory below {min_free_mib} MiB free");
                break 'fill;
            }
            let mut vm = match VmProcess::spawn(&["restore", "--snapshot", &snap_text]) {
                Ok(vm) => vm,
                Err(e) => {
                    stopped_by = format!("spawn failed: {e}");
                    break 'fill;
                }
            };
            if let Err(e) = vm.first_answer() {
                stopped_by = format!("a restore failed: {e}");
                break 'fill;
            }
            alive.push(vm);
        }
        for i in 0..sample.min(alive.len()) {
            let n = alive.len();
            let vm = &mut alive[(i * 7919 + n * 31) % n];
            let t = Instant::now();
            writeln!(vm.stdin, "{i}")?;
            vm.stdin.flush()?;
            vm.line()?;
            let took = t.elapsed();
            samples.record(took);
            slow += usize::from(took > std::time::Duration::from_millis(deadline_ms));
        }
        println!(
            "  {} VMs after {:.1} s; sample p99 {:.2} ms",
            alive.len(),
            started.elapsed().as_secs_f64(),
            samples.quantile_ms(0.99)
        );
    }
    let n = alive.len().max(1) as f64;
    let pss: u64 =
        alive.iter().map(|vm| memory_kib(vm.child.id()).map_or(0, |((_, p), _)| p)).sum();
    let host_mib = avail0.saturating_sub(crate::meminfo_kib("MemAvailable:")) as f64 / 1024.0 / n;
    let live = alive.len();
    let elapsed = started.elapsed().as_secs_f64();
    for vm in alive {
        vm.finish();
    }
    let pss_mib = pss as f64 / 1024.0 / n;
    let (p50, p99) = (samples.quantile_ms(0.5), samples.quantile_ms(0.99));
    println!(
        "density (microvm tier: brig-vmm processes from one snapshot, {})",
        virtualization.as_str()
    );
    println!(
        "  live at once {live}; PSS per VM {pss_mib:.3} MiB; host memory per VM {host_mib:.3} MiB"
    );
    println!("  sampled answer p50 {p50:.2} ms, p99 {p99:.2} ms ({slow} over {deadline_ms} ms); {:.0} VMs/s", live as f64 / elapsed);
    println!("  stopped by: {stopped_by}");
    Ok(json!({
        "bench": "density",
        "tier": "microvm",
        "virtualization": virtualization.as_str(),
        "guest": "purpose-built",
        "live": live,
        "pss_per_sandbox_mib": round3(pss_mib),
        "host_mem_per_sandbox_mib": round3(host_mib),
        "stopped_by": stopped_by,
        "sample_p50_ms": round3(p50),
        "sample_p99_ms": round3(p99),
        "slow_samples": slow,
        "fill_seconds": round3(elapsed),
    }))
}

/// Builds brig-vmm, checks for KVM, and snapshots the purpose-built guest (`mem_mib` of memory,
/// `touch_mib` of it written) into a temporary directory, read once so restores measure the
/// page cache. Returns the virtualization, the directory (kept alive) and the snapshot path.
pub(crate) fn snapshot(
    mem_mib: usize,
    touch_mib: u64,
) -> anyhow::Result<(Virtualization, tempfile::TempDir, String)> {
    crate::build_daemon()?;
    let virtualization = Virtualization::detect();
    anyhow::ensure!(virtualization != Virtualization::None, "no /dev/kvm here");
    let dir = tempfile::tempdir()?;
    let snap = dir.path().join("snap");
    let snap_text = snap.to_str().ok_or_else(|| anyhow::anyhow!("path"))?.to_string();
    let out = Command::new(brig_tests::binary("brig-vmm"))
        .args(["snapshot", "--out", &snap_text])
        .args(["--mem-mib", &mem_mib.to_string(), "--touch-mib", &touch_mib.to_string()])
        .output()?;
    anyhow::ensure!(out.status.success(), "snapshot: {}", String::from_utf8_lossy(&out.stderr));
    warm(&snap)?;
    Ok((virtualization, dir, snap_text))
}

/// Reads the snapshot files once so restores measure the page cache, not the disk.
fn warm(snap: &Path) -> anyhow::Result<()> {
    for name in ["vm.state", "vm.mem"] {
        std::io::copy(&mut std::fs::File::open(snap.join(name))?, &mut std::io::sink())?;
    }
    Ok(())
}
