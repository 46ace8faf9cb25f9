//! Container-host VMs: a Linux guest booted with the node's layer images as read-only disks,
//! whose agent runs the container runtime on the guest's kernel (`brig-agent`'s container
//! service). Containers placed there are steered with `CONTAINER` requests
//! (`brig_vmm_api::container`) over the same vsock link as any agent request, so a kernel bug
//! a container triggers takes down this VM, never the node.
//!
//! ```text
//! node ── VmTier::boot_container_host(layers) ──▶ brig-vmm (vda, vdb, … = layers, read-only)
//!      ── HostedContainer::{create, exec, session, put, get, …} ══vsock══▶ agent ──▶ containers
//! ```

use std::path::{Path, PathBuf};

use brig_container::session::{session_env, Session, SessionKeep, DRIVER};
use brig_vmm_api::agent::KeepExec;
use brig_vmm_api::container::{
    ContainerRequest, ContainerUsage, CreateSpec, Failure, FileEntry, ProcessSpec,
};

use brig_vmm_api::agent::AgentRequest;

use crate::agent_link::{collect, request_with_body, ReplyLimits};
use crate::{Disks, ExecStream, GuestStdin, MicroVm, VmTier, VmTierError};

impl VmTier {
    /// Boots a container-host VM named `id` with `layers` (EROFS images) as its read-only
    /// disks, in order (`/dev/vda`, `/dev/vdb`, …): the tier's kernel, initramfs and command
    /// line, whose init starts the agent's container service.
    pub async fn boot_container_host(
        &self,
        id: &str,
        layers: &[PathBuf],
    ) -> Result<MicroVm, VmTierError> {
        if layers.len() > crate::MAX_LAYERS {
            return Err(VmTierError::Agent(format!("more than {} layers", crate::MAX_LAYERS)));
        }
        let disks = Disks { layers: layers.to_vec(), writable: None, cow_base: None };
        let vm = MicroVm::new(&self.cfg.dir, id, Some(disks), PathBuf::new());
        let started = std::time::Instant::now();
        if let Err(e) = self.spawn_vmm(&vm).await {
            self.destroy(&vm).await;
            return Err(e);
        }
        tracing::info!(
            vm = id,
            layers = layers.len(),
            secs = started.elapsed().as_secs_f64(),
            "container-host VM booted"
        );
        Ok(vm)
    }
}

/// The guest's name for the `index`th disk of a VM (`/dev/vda`, `/dev/vdb`, …).
pub fn guest_disk(index: usize) -> Option<String> {
    let letter = u8::try_from(index).ok().filter(|i| *i < 26)?;
    Some(format!("/dev/vd{}", char::from(b'a' + letter)))
}

/// One container in a container-host VM: the VM's agent socket and the container's name.
#[derive(Debug, Clone, Copy)]
pub struct HostedContainer<'a> {
    pub uds: &'a Path,
    pub name: &'a str,
}

impl<'a> HostedContainer<'a> {
    pub fn new(vm: &'a MicroVm, name: &'a str) -> Self {
        HostedContainer { uds: &vm.uds, name }
    }

    async fn send(&self, req: &ContainerRequest, extra: &[u8]) -> Result<ExecStream, VmTierError> {
        let request = AgentRequest::Container { request: req.clone() };
        request_with_body(self.uds, &request, extra).await
    }

    /// Runs a request to its end, within `limits`: its STDOUT bytes, or the failure the agent
    /// reported.
    async fn call_within(
        &self,
        req: &ContainerRequest,
        extra: &[u8],
        limits: ReplyLimits,
    ) -> Result<Vec<u8>, VmTierError> {
        let out = collect(&mut self.send(req, extra).await?, limits).await?;
        if out.exit_code != 0 {
            return Err(VmTierError::Container {
                failure: Failure::from_code(out.exit_code),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(out.stdout)
    }

    /// A control request (create, destroy, stat, …): a short answer.
    async fn call(&self, req: &ContainerRequest, extra: &[u8]) -> Result<Vec<u8>, VmTierError> {
        self.call_within(req, extra, ReplyLimits::CONTROL).await
    }

    async fn call_json<T: serde::de::DeserializeOwned>(
        &self,
        req: &ContainerRequest,
    ) -> Result<T, VmTierError> {
        let bytes = self.call(req, &[]).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| VmTierError::Agent(format!("malformed answer from the agent: {e}")))
    }

    /// Creates the container (`spec.name` must be this handle's name).
    pub async fn create(&self, spec: CreateSpec) -> Result<(), VmTierError> {
        self.call(&ContainerRequest::Create(spec), &[]).await.map(drop)
    }

    pub async fn destroy(&self) -> Result<(), VmTierError> {
        self.call(&ContainerRequest::Destroy { name: self.name.into() }, &[]).await.map(drop)
    }

    fn process(
        &self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: &str,
        user: Option<String>,
    ) -> ProcessSpec {
        ProcessSpec { name: self.name.into(), argv, env, cwd: cwd.into(), user }
    }

    /// Starts a process; with `stdin`, its input is streamed through the returned writer.
    /// Dropping the stream (and the writer) hangs up, which kills the process tree, unless
    /// the agent keeps it (`keep`: then it takes a kill request, `agent_link::kill_kept`).
    pub async fn exec(
        &self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: &str,
        user: Option<String>,
        stdin: bool,
        keep: Option<KeepExec>,
    ) -> Result<(ExecStream, Option<GuestStdin>), VmTierError> {
        let process = self.process(argv, env, cwd, user);
        let req = ContainerRequest::Exec { process, stdin, keep };
        let stream = self.send(&req, &[]).await?;
        if !stdin {
            return Ok((stream, None));
        }
        let (reader, write) = stream.into_parts();
        let write = write.ok_or_else(|| VmTierError::Agent("no connection to write to".into()))?;
        Ok((ExecStream { reader, write: None, pending: None }, Some(GuestStdin { write })))
    }

    /// Opens a shell session (the container tier's session engine) running `shell`. With
    /// `keep`, the session outlives this node: the agent keeps it under the container's name
    /// and `keep.session_id`, and it is recorded in `keep.dir`.
    pub async fn open_session(
        &self,
        shell: &str,
        env: Vec<(String, String)>,
        cwd: &str,
        user: Option<String>,
        keep: Option<SessionKeep>,
    ) -> Result<Session, VmTierError> {
        let argv = vec![shell.to_string(), "-c".to_string(), DRIVER.to_string()];
        let process = self.process(argv, session_env(env), cwd, user);
        let req = ContainerRequest::Session {
            process,
            keep: keep.as_ref().map(|k| k.session_id.clone()),
        };
        let request = AgentRequest::Container { request: req };
        let stream = request_with_body(self.uds, &request, &[]).await?;
        Ok(match keep {
            Some(keep) => Session::recorded(
                crate::session::parts_over_agent(stream, true)?,
                keep,
                0,
                String::new(),
            ),
            None => crate::session::over_agent(stream)?,
        })
    }

    /// Writes `data` to `path` in the container (parents created, owned by container root).
    pub async fn put(
        &self,
        path: &str,
        data: &[u8],
        append: bool,
        mode: Option<u32>,
    ) -> Result<(), VmTierError> {
        let req = ContainerRequest::Put {
            name: self.name.into(),
            path: path.into(),
            len: data.len() as u64,
            append,
            mode,
        };
        self.call(&req, data).await.map(drop)
    }

    /// The bytes of `path`, at most `max_bytes` (see [`ReplyLimits::file`]).
    pub async fn get(&self, path: &str, max_bytes: usize) -> Result<Vec<u8>, VmTierError> {
        let req = ContainerRequest::Get { name: self.name.into(), path: path.into() };
        self.call_within(&req, &[], ReplyLimits::file(max_bytes)).await
    }

    pub async fn stat(&self, path: &str) -> Result<FileEntry, VmTierError> {
        self.call_json(&ContainerRequest::Stat { name: self.name.into(), path: path.into() }).await
    }

    pub async fn list(&self, path: &str) -> Result<Vec<FileEntry>, VmTierError> {
        self.call_json(&ContainerRequest::List { name: self.name.into(), path: path.into() }).await
    }

    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<(), VmTierError> {
        let req = ContainerRequest::Mkdir { name: self.name.into(), path: path.into(), parents };
        self.call(&req, &[]).await.map(drop)
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> Result<(), VmTierError> {
        let req = ContainerRequest::Remove { name: self.name.into(), path: path.into(), recursive };
        self.call(&req, &[]).await.map(drop)
    }

    /// Freezes (`true`) or thaws every process of the container.
    pub async fn set_frozen(&self, frozen: bool) -> Result<(), VmTierError> {
        let req = ContainerRequest::Freeze { name: self.name.into(), frozen };
        self.call(&req, &[]).await.map(drop)
    }

    pub async fn usage(&self) -> Result<ContainerUsage, VmTierError> {
        self.call_json(&ContainerRequest::Usage { name: self.name.into() }).await
    }

    /// The names of every container `vm`'s service runs.
    pub async fn names(vm: &MicroVm) -> Result<Vec<String>, VmTierError> {
        HostedContainer::new(vm, "").call_json(&ContainerRequest::Names {}).await
    }
}
