//! A VM's own files beyond whole-file reads and writes: stat, list, mkdir and remove through
//! its agent (`AgentRequest::Files`, `brig_vmm_api::guest_files`), each answer read within a
//! byte cap and a deadline, each failure typed by the agent's status.

use std::time::Duration;

use brig_vmm_api::agent::{self, AgentRequest};
use brig_vmm_api::guest_files::{
    parse_listing, Failure, FileEntry, GuestFileRequest, MAX_GUEST_LIST_BYTES,
};

use crate::agent_link::{collect, request_stream, ReplyLimits};
use crate::{ExecOutput, MicroVm, VmTier, VmTierError};

/// How long a file request may take in the guest (a recursive remove of a large tree).
const FILE_REQUEST_DEADLINE: Duration = Duration::from_secs(120);

impl VmTier {
    pub async fn stat_file(&self, vm: &MicroVm, path: &str) -> Result<FileEntry, VmTierError> {
        let out = files_request(vm, GuestFileRequest::Stat { path: path.into() }, 64 << 10).await?;
        serde_json::from_slice(&out.stdout)
            .map_err(|e| VmTierError::Agent(format!("a stat answer that does not parse: {e}")))
    }

    pub async fn list_dir(&self, vm: &MicroVm, path: &str) -> Result<Vec<FileEntry>, VmTierError> {
        let request = GuestFileRequest::List { path: path.into() };
        let out = files_request(vm, request, MAX_GUEST_LIST_BYTES).await?;
        parse_listing(&out.stdout)
            .map_err(|e| VmTierError::Agent(format!("a listing that does not parse: {e}")))
    }

    pub async fn make_dir(
        &self,
        vm: &MicroVm,
        path: &str,
        parents: bool,
    ) -> Result<(), VmTierError> {
        files_request(vm, GuestFileRequest::Mkdir { path: path.into(), parents }, 64 << 10).await?;
        Ok(())
    }

    pub async fn remove_path(
        &self,
        vm: &MicroVm,
        path: &str,
        recursive: bool,
    ) -> Result<(), VmTierError> {
        let request = GuestFileRequest::Remove { path: path.into(), recursive };
        files_request(vm, request, 64 << 10).await?;
        Ok(())
    }
}

/// Sends one file request and reads its answer within `max_bytes` and the deadline.
async fn files_request(
    vm: &MicroVm,
    request: GuestFileRequest,
    max_bytes: usize,
) -> Result<ExecOutput, VmTierError> {
    if vm.is_paused() {
        return Err(VmTierError::Paused);
    }
    let request = AgentRequest::Files { request };
    let limits = ReplyLimits { max_bytes, deadline: FILE_REQUEST_DEADLINE };
    let mut stream = tokio::time::timeout(limits.deadline, request_stream(&vm.uds, &request))
        .await
        .map_err(|_| VmTierError::ReplyTimeout(limits.deadline))??;
    let out = collect(&mut stream, limits).await?;
    if out.exit_code != 0 {
        return Err(file_failure(&out));
    }
    Ok(out)
}

/// What a failed file request's answer says: a path that is no regular file, a failure typed
/// by its status (a missing file is `NotFound`), or, from an agent before protocol 3, its words.
pub(crate) fn file_failure(out: &ExecOutput) -> VmTierError {
    let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if out.exit_code == agent::EXIT_NOT_REGULAR {
        return VmTierError::NotRegular(message);
    }
    if out.exit_code == agent::EXIT_BAD_REQUEST {
        return VmTierError::Unsupported("file requests the VM's agent predates (protocol 3)");
    }
    match Failure::from_code(out.exit_code) {
        Failure::Other | Failure::Runtime | Failure::NoSuchContainer => VmTierError::Agent(message),
        failure => VmTierError::GuestFile { failure, message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(exit_code: i32, stderr: &str) -> ExecOutput {
        ExecOutput { exit_code, stderr: stderr.as_bytes().to_vec(), ..ExecOutput::default() }
    }

    #[test]
    fn failures_keep_their_kind() {
        let missing = file_failure(&answer(Failure::NotFound.code(), "no such file\n"));
        assert!(matches!(missing, VmTierError::GuestFile { failure: Failure::NotFound, .. }));
        let fifo = file_failure(&answer(agent::EXIT_NOT_REGULAR, "/x is a FIFO"));
        assert!(matches!(fifo, VmTierError::NotRegular(t) if t == "/x is a FIFO"));
        // An agent before protocol 3 said 1 for everything, 2 for a request it cannot read.
        assert!(matches!(file_failure(&answer(1, "boom")), VmTierError::Agent(t) if t == "boom"));
        let old = file_failure(&answer(agent::EXIT_BAD_REQUEST, "unknown variant"));
        assert!(matches!(old, VmTierError::Unsupported(_)));
    }
}
