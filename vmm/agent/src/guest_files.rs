//! The VM's own files for the host's file API (`AgentRequest::Files`): stat, list, mkdir and
//! remove, resolved inside the sandbox's root by the container runtime's checked resolution
//! (`brig_container::files::RootDir`: no link or `..` out of the root, kernel file systems
//! refused), each failure a typed [`Failure`] status, as the container service answers.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Mutex};

use brig_container::files::RootDir;
use brig_vmm_api::agent;
use brig_vmm_api::guest_files::{GuestFileRequest, MAX_GUEST_LIST, MAX_GUEST_LIST_BYTES};

use crate::containers::{entry_to_wire, Refusal};

/// Serves one request: its answer, then EXIT 0 or the failure's status.
pub fn serve(request: GuestFileRequest, out: &Arc<Mutex<File>>) -> std::io::Result<()> {
    match run(request, out) {
        Ok(()) => crate::frame(out, agent::EXIT, &0i32.to_le_bytes()),
        Err(Refusal(failure, message)) => {
            crate::frame(out, agent::STDERR, format!("brig-agent: {message}\n").as_bytes())?;
            crate::frame(out, agent::EXIT, &failure.code().to_le_bytes())
        }
    }
}

fn run(request: GuestFileRequest, out: &Arc<Mutex<File>>) -> Result<(), Refusal> {
    let root = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(crate::root().as_deref().unwrap_or("/"))?;
    // New directories belong to the guest's root, as the sandbox's own would.
    let dir = RootDir::new(root.as_fd(), 0);
    match request {
        GuestFileRequest::Stat { path } => {
            let entry = serde_json::to_vec(&entry_to_wire(dir.stat(&path)?))
                .map_err(|e| Refusal(brig_vmm_api::guest_files::Failure::Other, e.to_string()))?;
            crate::frame(out, agent::STDOUT, &entry)?;
        }
        GuestFileRequest::List { path } => {
            // Lines batched into frames well under the frame cap.
            let mut batch = Vec::new();
            let mut sent = 0usize;
            for entry in dir.list(&path)?.into_iter().take(MAX_GUEST_LIST) {
                let mut line = serde_json::to_vec(&entry_to_wire(entry)).unwrap_or_default();
                line.push(b'\n');
                if sent + batch.len() + line.len() > MAX_GUEST_LIST_BYTES {
                    break;
                }
                batch.write_all(&line)?;
                if batch.len() >= agent::MAX_FRAME / 2 {
                    crate::frame(out, agent::STDOUT, &batch)?;
                    sent += batch.len();
                    batch.clear();
                }
            }
            if !batch.is_empty() {
                crate::frame(out, agent::STDOUT, &batch)?;
            }
        }
        GuestFileRequest::Mkdir { path, parents } => dir.mkdir(&path, parents)?,
        GuestFileRequest::Remove { path, recursive } => dir.remove(&path, recursive)?,
    }
    Ok(())
}
