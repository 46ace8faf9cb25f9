//! `fullvm`: boot-to-agent time and memory per VM of the full-VM tier (the Debian image with
//! systemd, `scripts/build-fullvm-image.sh`), booted through brigd one after another.
//!
//! The measurement is one script, `bench/scripts/fullvm-measure.sh`, run where Linux guests
//! boot: on this host when it has hardware virtualization (a release brigd serves the tier),
//! otherwise inside the emulated host the tests use (QEMU TCG with nested SVM), whose
//! initramfs carries the script. The result says which: emulated timings are not
//! performance figures and are labelled so.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::stats::round3;

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Full VMs booted, one after another.
    #[arg(long, default_value_t = 2)]
    vms: u32,
    /// Seconds the VMs run idle before their memory is read again.
    #[arg(long, default_value_t = 20)]
    settle_s: u32,
}

/// One VM's figures, from the script's lines.
#[derive(Debug, Default, Clone, Copy)]
struct Measured {
    boot_ms: f64,
    rss_kib: f64,
    pss_kib: f64,
    guest_used_mib: f64,
    settled_pss_kib: f64,
    settled_rss_kib: f64,
}

/// The middle of sorted `xs` (the mean of the two middle ones for an even count).
fn median(xs: &[f64]) -> f64 {
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn field(line: &str, key: &str) -> Option<f64> {
    line.split_whitespace().find_map(|kv| kv.strip_prefix(&format!("{key}="))?.parse().ok())
}

/// The figures in the script's output.
fn parse(lines: &[String]) -> anyhow::Result<Vec<Measured>> {
    if let Some(err) = lines.iter().find(|l| l.contains("BRIG-FULLVM-BENCH error")) {
        anyhow::bail!("the measurement failed: {err}");
    }
    let mut vms: Vec<Measured> = lines
        .iter()
        .filter(|l| l.contains("BRIG-FULLVM-BENCH boot "))
        .map(|l| Measured {
            boot_ms: field(l, "boot_ms").unwrap_or(f64::NAN),
            rss_kib: field(l, "rss_kib").unwrap_or(f64::NAN),
            pss_kib: field(l, "pss_kib").unwrap_or(f64::NAN),
            guest_used_mib: field(l, "guest_used_mib").unwrap_or(f64::NAN),
            ..Default::default()
        })
        .collect();
    for (vm, line) in
        vms.iter_mut().zip(lines.iter().filter(|l| l.contains("BRIG-FULLVM-BENCH settled ")))
    {
        vm.settled_pss_kib = field(line, "pss_kib").unwrap_or(f64::NAN);
        vm.settled_rss_kib = field(line, "rss_kib").unwrap_or(f64::NAN);
    }
    anyhow::ensure!(!vms.is_empty(), "no VM was measured:\n{}", lines.join("\n"));
    anyhow::ensure!(lines.iter().any(|l| l.contains("BRIG-FULLVM-BENCH done")), "unfinished run");
    Ok(vms)
}

/// Runs the script inside the emulated host; its console lines.
fn run_emulated(opts: &Options) -> anyhow::Result<Vec<String>> {
    let image = brig_tests::artifacts().join("fullvm").join("rootfs.ext4");
    anyhow::ensure!(
        image.exists(),
        "{} is missing: run scripts/build-fullvm-image.sh",
        image.display()
    );
    let append = format!("brig.l1=fullvm-bench brig.bench.count={}", opts.vms);
    let qemu = brig_tests::emulated::qemu(None, Some(&image), &append);
    let limit = Duration::from_secs(300 + 240 * u64::from(opts.vms));
    let (log, _status) = brig_tests::emulated::run(qemu, limit, "fullvm-bench.log");
    let lines: Vec<String> = log.lines().map(str::to_string).collect();
    Ok(lines)
}

/// Runs the script here, against a release brigd serving the full-VM tier.
fn run_native(opts: &Options) -> anyhow::Result<Vec<String>> {
    crate::build_daemon()?;
    let art = brig_tests::artifacts().join("fullvm");
    let (image, kernel, initrd) =
        (art.join("rootfs.ext4"), art.join("vmlinuz"), art.join("initrd.img"));
    for path in [&image, &kernel, &initrd] {
        anyhow::ensure!(
            path.exists(),
            "{} is missing: run scripts/build-fullvm-image.sh",
            path.display()
        );
    }
    let config = format!(
        "[fullvm]\nimage = \"{}\"\nkernel = \"{}\"\ninitrd = \"{}\"\n",
        image.display(),
        kernel.display(),
        initrd.display()
    );
    let daemon = brig_tests::Daemon::start_with_config(&config, &[])?;
    let script = brig_tests::repo_root().join("bench/scripts/fullvm-measure.sh");
    let brig: PathBuf = brig_tests::binary("brig");
    let out = std::process::Command::new("sh")
        .arg(script)
        .arg(&brig)
        .arg(daemon.state_dir())
        .arg(opts.vms.to_string())
        .arg(opts.settle_s.to_string())
        .env("BRIG_STATE_DIR", daemon.state_dir())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().map(str::to_string).collect())
}

/// What this host runs Linux guests on, as the result states it.
fn host_virtualization() -> &'static str {
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        return "pvm";
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if std::path::Path::new("/dev/kvm").exists() && hw {
        "hardware"
    } else {
        "none"
    }
}

pub fn run(opts: Options) -> anyhow::Result<Value> {
    let host = host_virtualization();
    let native = host == "hardware";
    let lines = if native { run_native(&opts)? } else { run_emulated(&opts)? };
    let vms = parse(&lines)?;
    let virtualization = if native {
        "hardware KVM on this host".to_string()
    } else {
        format!("emulated: QEMU TCG with nested SVM, on a {host} host (not a performance figure)")
    };
    println!("fullvm: {} VM(s), Debian 12 with systemd, booted through brigd", vms.len());
    println!("virtualization: {virtualization}");
    println!(
        "{:>3} {:>12} {:>10} {:>10} {:>12} {:>14}",
        "vm", "boot→agent", "RSS MiB", "PSS MiB", "guest used", "PSS settled"
    );
    for (i, vm) in vms.iter().enumerate() {
        println!(
            "{:>3} {:>10.0}ms {:>10.1} {:>10.1} {:>10.0}Mi {:>12.1}Mi",
            i,
            vm.boot_ms,
            vm.rss_kib / 1024.0,
            vm.pss_kib / 1024.0,
            vm.guest_used_mib,
            vm.settled_pss_kib / 1024.0
        );
    }
    let mean = |f: fn(&Measured) -> f64| vms.iter().map(f).sum::<f64>() / vms.len() as f64;
    let mut boots: Vec<f64> = vms.iter().map(|v| v.boot_ms).collect();
    boots.sort_by(f64::total_cmp);
    Ok(json!({
        "bench": "fullvm",
        "virtualization": virtualization,
        "performance_figures": native,
        "vms": vms.len(),
        "boot_to_agent_ms_median": round3(median(&boots)),
        "boot_to_agent_ms_max": round3(boots[boots.len() - 1]),
        "rss_mib_per_vm_after_boot": round3(mean(|v| v.rss_kib) / 1024.0),
        "pss_mib_per_vm_after_boot": round3(mean(|v| v.pss_kib) / 1024.0),
        "pss_mib_per_vm_settled": round3(mean(|v| v.settled_pss_kib) / 1024.0),
        "rss_mib_per_vm_settled": round3(mean(|v| v.settled_rss_kib) / 1024.0),
        "guest_used_mib": round3(mean(|v| v.guest_used_mib)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_lines_give_each_vms_figures() {
        let lines: Vec<String> = [
            "noise",
            "BRIG-FULLVM-BENCH boot vm=0 boot_ms=41234 rss_kib=300000 pss_kib=200000 guest_used_mib=90",
            "BRIG-FULLVM-BENCH boot vm=1 boot_ms=40000 rss_kib=310000 pss_kib=150000 guest_used_mib=91",
            "BRIG-FULLVM-BENCH settled rss_kib=200000 pss_kib=100000",
            "BRIG-FULLVM-BENCH settled rss_kib=210000 pss_kib=110000",
            "BRIG-FULLVM-BENCH done",
        ]
        .map(String::from)
        .to_vec();
        let vms = parse(&lines).expect("parse");
        assert_eq!(vms.len(), 2);
        assert_eq!(vms[0].boot_ms, 41234.0);
        assert_eq!(vms[1].settled_pss_kib, 110000.0);
        assert!(parse(&lines[..3]).is_err(), "an unfinished run is an error");
        let failed = vec!["BRIG-FULLVM-BENCH error create failed".to_string()];
        assert!(parse(&failed).is_err());
        assert_eq!(median(&[1.0, 3.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 9.0]), 2.0);
    }
}
