//! The VMM's control socket: how the host (brig-vmtier) steers a running Linux VM, in the typed
//! messages of `brig_vmm_api::control` (one JSON object per line each way). Every connection is
//! served on its own thread; a malformed or oversized line gets an error reply and never stops
//! the VMM. A `pause` that succeeded ends the process once its reply is written.
#![allow(unsafe_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use brig_vmm_api::control::{
    decode_line, encode_line, BalloonStats, ControlReply, ControlRequest, MAX_LINE,
};

pub use crate::machine::{Answer, ControlHandles, VcpuRequest, VcpuRequests};

/// Serves the control socket at `path` on its own thread (for the life of the process).
pub fn serve(path: &Path, handles: ControlHandles) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let handles = handles.clone();
            std::thread::spawn(move || connection(stream, &handles));
        }
    });
    Ok(())
}

fn connection(stream: UnixStream, handles: &ControlHandles) {
    let Ok(mut out) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        // One byte past the cap tells an oversized line from one that just fits.
        let read = (&mut reader).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line);
        match read {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let too_long = line.len() > MAX_LINE;
        let request = if too_long {
            Err(format!("a request line is at most {MAX_LINE} bytes"))
        } else {
            std::str::from_utf8(&line)
                .map_err(|_| "a request line is UTF-8 JSON".to_string())
                .and_then(|l| decode_line::<ControlRequest>(l).map_err(|e| describe(&e)))
        };
        let reply = match &request {
            Ok(request) => answer(request, handles),
            Err(message) => ControlReply::Error { message: message.clone() },
        };
        if out.write_all(encode_line(&reply).as_bytes()).is_err() {
            return;
        }
        if matches!(request, Ok(ControlRequest::Pause { .. }))
            && matches!(reply, ControlReply::Saved { .. })
        {
            // The VM is saved and its vCPU parked for good: the sandbox lives on in the
            // snapshot, this process ends.
            let _ = out.flush();
            std::process::exit(0);
        }
        if too_long {
            // The rest of an oversized line cannot be told from the next request.
            return;
        }
    }
}

/// A decoding error with its cause (the wire carries one message).
fn describe(e: &brig_vmm_api::control::ControlCodecError) -> String {
    match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

fn answer(request: &ControlRequest, handles: &ControlHandles) -> ControlReply {
    match request {
        ControlRequest::Stats {} => stats(handles),
        ControlRequest::Balloon { target_mib } => {
            let Some((index, shared)) = &handles.balloon else {
                return ControlReply::Error { message: "this VM has no balloon device".into() };
            };
            shared.set_target_mib(*target_mib);
            let mut devices =
                handles.devices.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((transport, irq)) = devices.get_mut(*index) {
                if transport.config_changed() {
                    let _ = irq.write(1);
                }
            }
            ControlReply::Done
        }
        ControlRequest::Snapshot { dir } | ControlRequest::Pause { dir } => {
            if !dir.is_absolute() {
                return ControlReply::Error { message: "a snapshot directory is absolute".into() };
            }
            let request = match request {
                ControlRequest::Pause { .. } => VcpuRequest::Pause(dir.clone()),
                _ => VcpuRequest::Snapshot(dir.clone()),
            };
            let started = std::time::Instant::now();
            match handles.requests.submit(request, Duration::from_secs(30)) {
                Ok(()) => ControlReply::Saved {
                    micros: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
                },
                Err(message) => ControlReply::Error { message },
            }
        }
    }
}

/// Resident memory of this process in KiB (from /proc/self/statm).
pub fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    pages * 4
}

fn stats(handles: &ControlHandles) -> ControlReply {
    let balloon = handles.balloon.as_ref().map(|(_, b)| BalloonStats {
        target_mib: b.target_mib(),
        actual_mib: b.actual_mib(),
        reported_mib: b.reported_bytes.load(Ordering::Relaxed) >> 20,
        reports: b.reports.load(Ordering::Relaxed),
        inflated_mib: b.inflated_bytes.load(Ordering::Relaxed) >> 20,
    });
    ControlReply::Stats { rss_kib: rss_kib(), balloon }
}

/// Runs the VM's vCPU on this thread until the guest ends, serving control requests on the way:
/// a snapshot saves the VM and copies its writable disks (`disk-N` in the snapshot directory,
/// in attach order among the writable ones) while the vCPU is stopped, so memory and disks
/// match; a pause saves the VM and never runs the guest again (its disks stay as they are; the
/// control thread exits the process once its answer is written).
pub fn run(
    vm: &mut crate::linux::LinuxVm,
    limit: Duration,
    writable_disks: &[PathBuf],
) -> crate::linux::Ending {
    use crate::linux::Ending;
    vm.requests.register_vcpu_thread();
    let started = std::time::Instant::now();
    loop {
        match vm.run(limit.saturating_sub(started.elapsed())) {
            Ending::ControlRequest => {
                let Some((request, answer)) = vm.requests.take() else { continue };
                let (dir, pause) = match request {
                    VcpuRequest::Snapshot(dir) => (dir, false),
                    VcpuRequest::Pause(dir) => (dir, true),
                };
                // A paused VM never runs again, so its disks stay as they are; a snapshot's
                // VM runs on and changes them, so they are copied while it stands still.
                let disks = if pause { &[][..] } else { writable_disks };
                let result = save_with_disks(vm, &dir, disks);
                let saved = result.is_ok();
                let _ = answer.send(result);
                if pause && saved {
                    loop {
                        std::thread::park();
                    }
                }
            }
            other => return other,
        }
    }
}

fn save_with_disks(
    vm: &mut crate::linux::LinuxVm,
    dir: &Path,
    writable_disks: &[PathBuf],
) -> Result<(), String> {
    // Devices stay still from reading their state to the last disk copy: a backend thread
    // delivering vsock or net data would otherwise change guest memory mid-dump.
    let devices = vm.devices.clone();
    let held = crate::linux::lock_devices(&devices);
    crate::linux_snapshot::save_quiesced(vm, &held, dir).map_err(|e| e.to_string())?;
    for (i, disk) in writable_disks.iter().enumerate() {
        let to = dir.join(format!("disk-{i}"));
        crate::sparse::copy_sparse(disk, &to)
            .map_err(|e| format!("copying {}: {e}", disk.display()))?;
    }
    Ok(())
}
