//! Creating a container: its rootfs and cgroups, then its shim, told what to build.

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::rootfs::Rootfs;
use crate::runtime::{
    io_err, process_start_time, upper_link, Container, ContainerSpec, Runtime, RuntimeError,
    Serving, ID_COUNT, MASKED_PATHS, READONLY_PATHS, SHIM_SOCKET, START_TIMEOUT,
};
use crate::shim_conn::ShimConn;
use crate::shim_proto::{FromShim, ShimConfig, ToShim};
use brig_hostkit::cgroup::ContainerCgroup;

impl Runtime {
    /// Creates and starts a container. On failure everything made so far is removed.
    pub async fn create(&self, spec: &ContainerSpec) -> Result<Container, RuntimeError> {
        let began = std::time::Instant::now();
        let mut layer_points = Vec::with_capacity(spec.layers.len());
        for layer in &spec.layers {
            layer_points.push(self.layers.mount(layer)?);
        }
        let dir = self.config.run_dir.join("c").join(&spec.name);
        // Off the async workers: a fork's seed copy takes milliseconds per MiB, and forks of
        // many children assemble in parallel.
        let disk_bytes = match &self.store {
            Some(_) => spec.disk_bytes,
            None => memory_layer_bytes(spec.disk_bytes, spec.limits.memory_bytes),
        };
        let upper = crate::rootfs::Upper { disk_bytes, store: self.store.clone() };
        let owner = self.config.id_base;
        let (hostname, seed) = (spec.hostname.clone(), spec.seed.clone());
        let protect = spec.protect.clone();
        let rootfs = tokio::task::spawn_blocking(move || {
            let seed = seed.as_deref();
            Rootfs::assemble(&dir, &layer_points, &upper, owner, &hostname, seed, &protect)
        })
        .await
        .map_err(|e| RuntimeError::Setup(format!("assembling the rootfs: {e}")))??;
        let cgroup = match self.cgroups.create(&spec.name, &spec.limits, self.config.id_base) {
            Ok(cg) => cg,
            Err(e) => {
                let _ = tokio::task::spawn_blocking(rootfs.remover()).await;
                return Err(e.into());
            }
        };
        match tokio::time::timeout(START_TIMEOUT, self.start(spec, &rootfs, &cgroup, began)).await {
            Ok(Ok(Started { serving, upper_fd })) => {
                rootfs.detach();
                let rootfs = rootfs.with_upper_link(upper_link(serving.shim_pid, upper_fd));
                Ok(self.container(&spec.name, rootfs, cgroup, serving, 1, Some(Default::default())))
            }
            failed => {
                cgroup.kill_all();
                let _ = cgroup.remove();
                let _ = tokio::task::spawn_blocking(rootfs.remover()).await;
                match failed {
                    Ok(Err(e)) => Err(e),
                    _ => Err(RuntimeError::StartTimeout(START_TIMEOUT)),
                }
            }
        }
    }

    /// Starts the shim (through the node's spawner) and waits for the container's init. The
    /// debug log gives when each step ended, from `began` (the create's start).
    async fn start(
        &self,
        spec: &ContainerSpec,
        rootfs: &Rootfs,
        cgroup: &ContainerCgroup,
        began: std::time::Instant,
    ) -> Result<Started, RuntimeError> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let assembled = began.elapsed();
        let (ours, theirs) =
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .map_err(|e| io_err("control socketpair")(e.into()))?;
        let (stderr, stderr_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| io_err("shim stderr pipe")(e.into()))?;
        let spawner = self.spawner.clone();
        // Our copies of the shim's ends drop with the task, or we would never see EOF.
        let pid = tokio::task::spawn_blocking(move || spawner.spawn(&theirs, &stderr_w))
            .await
            .map_err(|e| RuntimeError::Setup(format!("spawn task: {e}")))??;
        let spawned = began.elapsed();
        let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(stderr)
            .map_err(io_err("shim stderr pipe"))?;
        let errors = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut collected = String::new();
            while let Ok(Some(line)) = lines.next_line().await {
                if collected.len() < 4096 {
                    collected.push_str(&line);
                    collected.push('\n');
                }
            }
            collected
        });
        let config = ShimConfig {
            socket: rootfs.dir().join(SHIM_SOCKET),
            upper: rootfs.dir().join("upper/upper"),
            survive_node: self.config.survive_node,
            rootfs: rootfs.path(),
            hostname: spec.hostname.clone(),
            join_cgroups: cgroup.join_files(),
            id_base: self.config.id_base,
            masked_paths: MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
            dev_dir: rootfs.dev_dir(),
            empty_dir: rootfs.empty_dir(),
            shared_sys: self.shared_sys.as_ref().map(|s| s.path.clone()),
            readonly_paths: READONLY_PATHS.iter().map(|s| s.to_string()).collect(),
        };
        let shim_failed = |errors: tokio::task::JoinHandle<String>| async move {
            let text = errors.await.unwrap_or_default();
            RuntimeError::Setup(format!("shim failed: {}", text.trim()))
        };
        let shim = ShimConn::new(ours)?;
        shim.send(&ToShim::Configure(config)).await?;
        match shim.recv().await {
            Ok(FromShim::UserNamespace) => {}
            Ok(other) => {
                return Err(RuntimeError::Setup(format!("unexpected shim message {other:?}")))
            }
            Err(_) => return Err(shim_failed(errors).await),
        }
        let namespaced = began.elapsed();
        let map = format!("0 {} {ID_COUNT}\n", self.config.id_base);
        for file in ["uid_map", "gid_map"] {
            let path = format!("/proc/{pid}/{file}");
            std::fs::write(&path, &map).map_err(io_err(path))?;
        }
        shim.send(&ToShim::IdsMapped).await?;
        let (init_pid, upper_fd) = match shim.recv().await {
            Ok(FromShim::Ready { init_pid, upper_fd }) => (init_pid, upper_fd),
            Ok(other) => {
                return Err(RuntimeError::Setup(format!("unexpected shim message {other:?}")))
            }
            Err(_) => return Err(shim_failed(errors).await),
        };
        tokio::spawn(async move {
            let text = errors.await.unwrap_or_default();
            if !text.is_empty() {
                tracing::warn!(stderr = %text.trim(), "container shim wrote to stderr");
            }
        });
        let init_start = process_start_time(init_pid)
            .ok_or_else(|| RuntimeError::Setup(format!("container init {init_pid} is gone")))?;
        // The process the spawner started has exited by now: the shim goes on as pid 1.
        let (shim_pid, shim_start) = (init_pid, init_start);
        // The container lives as long as its pid 1: when its memory runs out (a full tmpfs
        // writable layer, an upload), the OOM killer picks one of its processes, not the
        // shim: their scores are raised ([`crate::runtime::PROCESS_OOM_SCORE_ADJ`]), and the
        // shim is exempt where the node may lower a score (CAP_SYS_RESOURCE).
        let adj = format!("/proc/{shim_pid}/oom_score_adj");
        if let Err(e) = std::fs::write(&adj, "-1000") {
            tracing::debug!(error = %e, "the shim stays an ordinary OOM candidate");
        }
        let ready = began.elapsed();
        // Only now: setting up the namespaces and mounts is the node's work, not the container's.
        if let Some(millis) = spec.limits.cpu_millis {
            cgroup.limit_cpu(millis, self.config.cpu_min_quota_us)?;
        }
        let (name, done) = (&spec.name, began.elapsed());
        tracing::debug!(container = %name, ?assembled, ?spawned, ?namespaced, ?ready, ?done, "started");
        let serving = Serving { shim, shim_pid, shim_start, init_pid, init_start };
        Ok(Started { serving, upper_fd })
    }
}

/// A shim that has built its container.
struct Started {
    serving: Serving,
    /// The shim's descriptor number of the writable upper directory.
    upper_fd: i32,
}

/// Memory a container keeps for its processes (and its shim) when its writable layer is in
/// memory (a tmpfs charged to it): the layer is that much smaller than the memory limit, so a
/// full layer is ENOSPC for the writer, never an OOM with nothing left to kill but pid 1.
pub const MEMORY_LAYER_RESERVE: u64 = 32 << 20;

/// The size of a writable layer in memory: the disk asked for, within the memory limit less
/// [`MEMORY_LAYER_RESERVE`] (half the limit at least, for tiny limits).
pub fn memory_layer_bytes(disk_bytes: u64, memory_bytes: Option<u64>) -> u64 {
    memory_bytes.map_or(disk_bytes, |memory| {
        disk_bytes.min(memory.saturating_sub(MEMORY_LAYER_RESERVE).max(memory / 2))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_in_memory_leaves_room_for_the_processes() {
        let mib = |n: u64| n << 20;
        assert_eq!(memory_layer_bytes(mib(1024), Some(mib(192))), mib(160));
        assert_eq!(memory_layer_bytes(mib(64), Some(mib(192))), mib(64));
        assert_eq!(memory_layer_bytes(mib(1024), Some(mib(40))), mib(20));
        assert_eq!(memory_layer_bytes(mib(1024), None), mib(1024));
    }
}
