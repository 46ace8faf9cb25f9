//! `brig-vmtier-check KERNEL INITRD CMDLINE DIR`: drives the microVM tier end to end where
//! Linux guests run (the emulated host in the tests): two VMs from one snapshot, commands in
//! each, isolation between them, exit statuses, destroy and cleanup. Prints `BRIG-VMTIER-OK`
//! lines, or an error and exit status 1.

use std::time::Duration;

use brig_vmtier::{VmTier, VmTierConfig};

/// Whether `dir` holds a file of VM `id`.
fn dir_has(dir: &str, id: &str) -> bool {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten().any(|e| e.file_name().to_string_lossy().starts_with(&format!("{id}.")))
        })
        .unwrap_or(false)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 5, "usage: brig-vmtier-check KERNEL INITRD CMDLINE DIR");
    let vmm = std::env::current_exe()?.with_file_name("brig-vmm");
    let cfg = VmTierConfig {
        vmm,
        kernel: args[1].clone().into(),
        initrd: args[2].clone().into(),
        cmdline: args[3].clone(),
        mem_mib: 256,
        dir: args[4].clone().into(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let tier = VmTier::open(cfg)?;
        println!("BRIG-VMTIER-OK tier open on {}", tier.virtualization().as_str());
        let t = std::time::Instant::now();
        let a = tier.create("vm-a", None).await?;
        println!(
            "BRIG-VMTIER-OK created vm-a (snapshot made) in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let t = std::time::Instant::now();
        let b = tier.create("vm-b", None).await?;
        println!(
            "BRIG-VMTIER-OK created vm-b from the snapshot in {:.2} s",
            t.elapsed().as_secs_f64()
        );
        let limit = Duration::from_secs(30);
        let out = tier.exec(&a, "echo only-in-a > /tmp/mark; cat /tmp/mark; exit 3", limit).await?;
        anyhow::ensure!(out.stdout == b"only-in-a\n" && out.exit_code == 3, "vm-a: {out:?}");
        let out = tier.exec(&b, "cat /tmp/mark 2>&1; echo err >&2; exit 0", limit).await?;
        anyhow::ensure!(
            String::from_utf8_lossy(&out.stdout).contains("No such file") && out.stderr == b"err\n",
            "vm-b saw vm-a's file or lost stderr: {out:?}"
        );
        println!("BRIG-VMTIER-OK isolated guests, stdout/stderr/exit status through the agent");
        let name_a = tier.exec(&a, "hostname", limit).await?.stdout;
        let name_b = tier.exec(&b, "hostname", limit).await?.stdout;
        anyhow::ensure!(
            name_a != name_b && name_a.starts_with(b"brig-"),
            "identities: {name_a:?} {name_b:?}"
        );
        let uuid = "cat /proc/sys/kernel/random/uuid";
        let (ua, ub) =
            (tier.exec(&a, uuid, limit).await?.stdout, tier.exec(&b, uuid, limit).await?.stdout);
        anyhow::ensure!(ua != ub, "both VMs drew the same random uuid");
        println!("BRIG-VMTIER-OK each VM has its own hostname and random stream");
        // A command past its timeout is stopped, and the VM keeps serving.
        let slow = tier.exec(&a, "sleep 30", Duration::from_secs(2)).await;
        anyhow::ensure!(matches!(slow, Err(brig_vmtier::VmTierError::ExecTimeout(_))), "{slow:?}");
        let procs =
            tier.exec(&a, "sleep 1; ps 2>/dev/null | grep -c '[s]leep 30' || true", limit).await?;
        anyhow::ensure!(
            String::from_utf8_lossy(&procs.stdout).trim() == "0",
            "sleep survived: {procs:?}"
        );
        println!("BRIG-VMTIER-OK a timed-out command is killed in the guest");
        let blob: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        tier.write_file(&a, "/tmp/in/blob.bin", &blob).await?;
        let size = tier.exec(&a, "wc -c < /tmp/in/blob.bin", limit).await?.stdout;
        anyhow::ensure!(
            String::from_utf8_lossy(&size).trim() == "300000",
            "size in guest: {size:?}"
        );
        anyhow::ensure!(
            tier.read_file(&a, "/tmp/in/blob.bin").await? == blob,
            "file changed in transit"
        );
        anyhow::ensure!(tier.read_file(&a, "/nonexistent").await.is_err(), "missing file read");
        println!("BRIG-VMTIER-OK files move in and out of the guest intact");
        let pid = a.pid();
        let uds = a.uds.clone();
        tier.destroy(&a).await;
        let gone = pid.is_none_or(|p| !std::path::Path::new(&format!("/proc/{p}")).exists());
        anyhow::ensure!(gone && !uds.exists(), "vm-a's VMM or socket survived destroy");
        let out = tier.exec(&b, "echo still-here", limit).await?;
        anyhow::ensure!(out.stdout == b"still-here\n", "vm-b after vm-a's destroy: {out:?}");
        tier.destroy(&b).await;
        println!("BRIG-VMTIER-OK destroy reaps the VMM and removes its socket");
        // A daemon that dies without destroying its VMs: the next one stops the strays.
        let stray = tier.create("vm-stray", None).await?;
        let stray_pid = stray.pid().ok_or_else(|| anyhow::anyhow!("no pid"))?;
        std::mem::forget(stray);
        drop(tier);
        anyhow::ensure!(
            std::path::Path::new(&format!("/proc/{stray_pid}")).exists(),
            "stray gone too early"
        );
        let _next = VmTier::open(VmTierConfig {
            vmm: std::env::current_exe()?.with_file_name("brig-vmm"),
            kernel: args[1].clone().into(),
            initrd: args[2].clone().into(),
            cmdline: args[3].clone(),
            mem_mib: 256,
            dir: args[4].clone().into(),
        })?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let status = std::fs::read_to_string(format!("/proc/{stray_pid}/stat")).unwrap_or_default();
        let gone = status.is_empty() || status.contains(") Z ");
        anyhow::ensure!(gone, "the stray VMM {stray_pid} still runs: {status}");
        anyhow::ensure!(!dir_has(&args[4], "vm-stray"), "the stray's files were left behind");
        println!("BRIG-VMTIER-OK a restarted tier stops VMMs its predecessor left");
        anyhow::Ok(())
    })
}
