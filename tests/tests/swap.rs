//! The node's own compressed swap (`[swap] zram_mib`): pausing a container pushes its
//! anonymous and tmpfs memory into it, so a paused sandbox gives most of its RAM back on a
//! machine with no swap; resuming brings it all back.

use brig_sdk::SandboxOptions;
use brig_tests::Daemon;

/// Gives the zram device back to the kernel however the test ends (the node keeps it).
struct ZramGuard(Option<String>);

impl Drop for ZramGuard {
    fn drop(&mut self) {
        if let Some(device) = self.0.take() {
            let _ = std::process::Command::new("swapoff").arg(format!("/dev/{device}")).status();
            let _ = std::fs::write(format!("/sys/block/{device}/reset"), "1");
        }
    }
}

/// Makes `sb` hold 32 MiB in a file at `file` and 32 MiB held by a shell variable (anonymous
/// memory), in a process that runs on.
async fn hold_64_mib(sb: &brig_sdk::Sandbox, file: &str) {
    let out = sb
        .exec_with(brig_sdk::Cmd::shell(&format!(
            "dd if=/dev/zero of={file} bs=1M count=32 2>/dev/null; \
             (x=$(dd if=/dev/zero bs=1M count=32 2>/dev/null | tr '\\0' a); \
              echo ready > /tmp/ready; while :; do sleep 1; done) > /dev/null 2>&1 & \
             while [ ! -e /tmp/ready ]; do sleep 0.05; done"
        )))
        .await
        .expect("workload");
    assert!(out.success(), "{}", out.stderr_text());
}

#[tokio::test]
async fn with_its_own_zram_swap_a_paused_container_gives_most_of_its_memory_back() {
    let daemon = Daemon::start_with_config("[swap]\nzram_mib = 512\n", &[]).expect("brigd");
    let mut guard = ZramGuard(None);
    let client = daemon.client().await.expect("client");
    let swap = client.node_status().await.expect("status").swap.expect("the node reports swap");
    guard.0 = Some(swap.device.clone());
    assert_eq!(swap.size_bytes, 512 << 20);
    assert!(
        std::fs::read_to_string("/proc/swaps").expect("swaps").contains(&swap.device),
        "the device is swap"
    );

    let sb =
        client.create(SandboxOptions::container("busybox").memory_mib(256)).await.expect("create");
    // 32 MiB in /dev/shm (tmpfs) and 32 MiB held by a shell variable (anonymous memory).
    hold_64_mib(&sb, "/dev/shm/blob").await;
    let charged = |info: brig_sdk::SandboxInfo| info.usage.map_or(0, |u| u.memory_bytes);
    let before = charged(sb.status().await.expect("status"));
    assert!(before >= 64 << 20, "the workload is charged: {before}");

    sb.pause().await.expect("pause");
    let after = charged(sb.status().await.expect("status"));
    let freed = before.saturating_sub(after);
    assert!(freed * 10 >= before * 8, "pause freed {} of {} MiB", freed >> 20, before >> 20);
    let swap = client.node_status().await.expect("status").swap.expect("swap");
    assert!(swap.stored_bytes >= 48 << 20, "swapped out: {swap:?}");
    assert!(swap.ram_used_bytes < swap.stored_bytes / 4, "it compresses: {swap:?}");

    // Everything comes back.
    sb.resume().await.expect("resume");
    let out = sb.exec(["sh", "-c", "cat /tmp/ready; wc -c < /dev/shm/blob"]).await.expect("exec");
    assert_eq!(out.stdout_text(), format!("ready\n{}\n", 32 << 20));
    sb.destroy().await.expect("destroy");
}

/// A filesystem-only pause (E2B's `pause(mode="filesystem")`): every process ends and the
/// container's memory goes back with no swap at all; the files stay, also across a restart of
/// brigd, and the resume starts the sandbox with nothing running.
#[tokio::test]
async fn a_files_only_pause_gives_the_memory_back_and_resumes_with_nothing_running() {
    // Writable layers on disk: a sandbox's files are the disk's page cache, which the kernel
    // can drop (files in a tmpfs layer are memory, and stay).
    let config = "[container]\nwritable_layer = \"disk\"\n";
    let mut daemon = Daemon::start_with_config(config, &["--on-exit", "keep"]).expect("brigd");
    let client = daemon.client().await.expect("client");
    let options = SandboxOptions::container("busybox").memory_mib(256).disk_mib(128);
    let sb = client.create(options).await.expect("create");
    // 32 MiB held by a shell variable (anonymous memory) and a 32 MiB file.
    hold_64_mib(&sb, "/tmp/file").await;
    let charged = |info: &brig_sdk::SandboxInfo| info.usage.map_or(0, |u| u.memory_bytes);
    let before = charged(&sb.status().await.expect("status"));
    assert!(before >= 48 << 20, "the workload is charged: {before}");

    sb.pause_files_only().await.expect("pause keeping files only");
    let paused = sb.status().await.expect("status");
    assert_eq!(paused.state, brig_sdk::SandboxState::Paused);
    assert!(paused.paused_files_only, "{paused:?}");
    let after = charged(&paused);
    assert!(after < 8 << 20, "{} MiB still charged of {} MiB", after >> 20, before >> 20);

    // brigd restarts (keeping its containers): the sandbox is still paused keeping its
    // files only.
    daemon.restart().expect("restart");
    let client = daemon.client().await.expect("client again");
    let sb = client.sandbox(sb.id());
    assert!(sb.status().await.expect("status").paused_files_only);

    // The next request resumes it: files there, nothing running, and it runs commands.
    let out = sb
        .exec(["sh", "-c", "wc -c < /tmp/file; cat /tmp/ready; ps -o comm= | grep -c sleep"])
        .await;
    let out = out.expect("exec");
    assert_eq!(out.stdout_text(), format!("{}\nready\n0\n", 32 << 20));
    let running = sb.status().await.expect("status");
    assert_eq!(running.state, brig_sdk::SandboxState::Running);
    assert!(!running.paused_files_only);
    sb.destroy().await.expect("destroy");
}
