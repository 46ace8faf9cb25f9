//! `ksm`: what kernel same-page merging gives and costs for microVM memory, natively with the
//! purpose-built guest (see `microvm`).
//!
//! `vms` VMs are restored from one snapshot; each then writes `dirty_mib` of its memory with
//! contents every VM shares (as VMs running the same workload do: the same programs loaded,
//! the same buffers zeroed). Those pages are each VM's private copy, which copy-on-write
//! restore cannot share. Measured in one run, same VMs and same writes:
//! - KSM off: PSS per VM;
//! - KSM on (the VMMs `madvise(MADV_MERGEABLE)` their guest memory, ksmd scans
//!   `pages_to_scan` pages every `sleep_ms`): how long ksmd takes to settle, the CPU time its
//!   thread burns meanwhile and then per second while it keeps scanning, the memory merged,
//!   and PSS per VM after.
//!
//! KSM's settings are put back as they were at the end.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::microvm::{memory_kib, snapshot, VmProcess};
use crate::stats::round3;

#[derive(clap::Args, Debug)]
pub struct Options {
    #[arg(long, default_value_t = 50)]
    vms: usize,
    #[arg(long, default_value_t = 64)]
    mem_mib: usize,
    /// Memory each VM writes with contents all VMs share.
    #[arg(long, default_value_t = 32)]
    dirty_mib: usize,
    /// ksmd's pages per scan round, and its sleep between rounds.
    #[arg(long, default_value_t = 4000)]
    pages_to_scan: u64,
    #[arg(long, default_value_t = 20)]
    sleep_ms: u64,
}

const KSM: &str = "/sys/kernel/mm/ksm";

fn ksm_read(name: &str) -> anyhow::Result<u64> {
    let path = Path::new(KSM).join(name);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("{}: {e} (is KSM built into this kernel?)", path.display()))?;
    Ok(text.trim().parse()?)
}

fn ksm_write(name: &str, value: u64) -> anyhow::Result<()> {
    std::fs::write(Path::new(KSM).join(name), value.to_string())
        .map_err(|e| anyhow::anyhow!("{KSM}/{name}: {e}"))
}

/// ksmd's CPU time so far (user + system), in seconds.
fn ksmd_cpu_s() -> anyhow::Result<f64> {
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim() == "ksmd" {
            let stat = std::fs::read_to_string(entry.path().join("stat"))?;
            let fields: Vec<&str> =
                stat.rsplit_once(')').map_or("", |(_, r)| r).split_whitespace().collect();
            // After the command: state is field 0, utime 11, stime 12 (clock ticks).
            let ticks: u64 = fields
                .get(11..13)
                .into_iter()
                .flatten()
                .filter_map(|v| v.parse::<u64>().ok())
                .sum();
            // /proc counts in USER_HZ, which is 100 on every Linux ABI we run on.
            return Ok(ticks as f64 / 100.0);
        }
    }
    anyhow::bail!("no ksmd thread found")
}

/// Starts `n` VMs and has each write its shared-content pages; returns them once all have.
fn start_vms(snap: &str, n: usize, dirty_mib: usize, ksm: bool) -> anyhow::Result<Vec<VmProcess>> {
    let dirty = dirty_mib.to_string();
    let mut args = vec!["restore", "--snapshot", snap, "--dirty-mib", &dirty];
    if ksm {
        args.push("--ksm");
    }
    let mut vms = Vec::with_capacity(n);
    for _ in 0..n {
        let mut vm = VmProcess::spawn(&args)?;
        vm.first_answer()?;
        vms.push(vm);
    }
    // A request answered after the writes: every VM has made its copies.
    for vm in &mut vms {
        writeln!(vm.stdin, "7")?;
        vm.stdin.flush()?;
        vm.line()?;
    }
    Ok(vms)
}

fn pss_per_vm_mib(vms: &[VmProcess]) -> anyhow::Result<f64> {
    let mut total = 0u64;
    for vm in vms {
        total += memory_kib(vm.child.id())?.0 .1;
    }
    Ok(total as f64 / 1024.0 / vms.len().max(1) as f64)
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    let (virtualization, _dir, snap) = snapshot(opts.mem_mib, 16)?;
    let saved: Vec<(&str, u64)> = ["run", "pages_to_scan", "sleep_millisecs"]
        .into_iter()
        .map(|k| ksm_read(k).map(|v| (k, v)))
        .collect::<anyhow::Result<_>>()?;
    let result = measure(&opts, &snap);
    for (name, value) in saved {
        let _ = ksm_write(name, value);
    }
    let m = result?;
    println!(
        "ksm on {} ({} VMs, {} MiB each written alike): PSS per VM {:.2} MiB off, {:.2} MiB on; \
         {:.0} MiB merged in {:.1} s for {:.2} s of ksmd CPU; then {:.1}% of a core while it \
         keeps scanning",
        virtualization.as_str(),
        opts.vms,
        opts.dirty_mib,
        m.pss_off,
        m.pss_on,
        m.merged_mib,
        m.settle_s,
        m.settle_cpu_s,
        m.steady_cpu_pct
    );
    Ok(json!({
        "bench": "ksm",
        "virtualization": virtualization.as_str(),
        "vms": opts.vms,
        "dirty_mib_per_vm": opts.dirty_mib,
        "pages_to_scan": opts.pages_to_scan,
        "sleep_ms": opts.sleep_ms,
        "pss_per_vm_mib_ksm_off": round3(m.pss_off),
        "pss_per_vm_mib_ksm_on": round3(m.pss_on),
        "merged_mib": round3(m.merged_mib),
        "settle_s": round3(m.settle_s),
        "ksmd_cpu_s_to_settle": round3(m.settle_cpu_s),
        "ksmd_cpu_s_per_merged_gib": round3(m.settle_cpu_s / (m.merged_mib / 1024.0).max(1e-9)),
        "ksmd_steady_cpu_pct": round3(m.steady_cpu_pct),
    }))
}

struct Measured {
    pss_off: f64,
    pss_on: f64,
    merged_mib: f64,
    settle_s: f64,
    settle_cpu_s: f64,
    steady_cpu_pct: f64,
}

fn measure(opts: &Options, snap: &str) -> anyhow::Result<Measured> {
    // KSM off.
    ksm_write("run", 0)?;
    let vms = start_vms(snap, opts.vms, opts.dirty_mib, false)?;
    let pss_off = pss_per_vm_mib(&vms)?;
    vms.into_iter().for_each(VmProcess::finish);

    // KSM on: ksmd starts from nothing merged.
    ksm_write("run", 2)?; // unmerge anything left from before
    ksm_write("pages_to_scan", opts.pages_to_scan)?;
    ksm_write("sleep_millisecs", opts.sleep_ms)?;
    let vms = start_vms(snap, opts.vms, opts.dirty_mib, true)?;
    let cpu_before = ksmd_cpu_s()?;
    let started = Instant::now();
    ksm_write("run", 1)?;
    let (mut last, mut last_change) = (0u64, Instant::now());
    while last_change.elapsed() < Duration::from_secs(3)
        && started.elapsed() < Duration::from_secs(180)
    {
        std::thread::sleep(Duration::from_millis(250));
        let sharing = ksm_read("pages_sharing")?;
        if sharing != last {
            (last, last_change) = (sharing, Instant::now());
        }
    }
    let settle_s = last_change.duration_since(started).as_secs_f64();
    let settle_cpu_s = ksmd_cpu_s()? - cpu_before;
    let steady_from = (Instant::now(), ksmd_cpu_s()?);
    std::thread::sleep(Duration::from_secs(5));
    let steady_cpu_pct =
        (ksmd_cpu_s()? - steady_from.1) / steady_from.0.elapsed().as_secs_f64() * 100.0;
    let merged_mib = (ksm_read("pages_sharing")? * 4096) as f64 / (1 << 20) as f64;
    let pss_on = pss_per_vm_mib(&vms)?;
    vms.into_iter().for_each(VmProcess::finish);
    ksm_write("run", 2)?;
    Ok(Measured { pss_off, pss_on, merged_mib, settle_s, settle_cpu_s, steady_cpu_pct })
}
