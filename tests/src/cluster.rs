//! A whole cluster on loopback: etcd, control-plane replicas and nodes, each a real process.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use brig_sdk::{Client, ConnectOptions, Pin};

use crate::Daemon;

/// A one-member etcd with its data in a temporary directory; killed on drop.
pub struct Etcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    ports: (u16, u16),
    pub endpoint: String,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Etcd {
    pub fn start() -> anyhow::Result<Etcd> {
        let dir = tempfile::Builder::new().prefix("etcd-test-").tempdir()?;
        let ports = (free_port()?, free_port()?);
        let endpoint = format!("http://127.0.0.1:{}", ports.0);
        let mut etcd = Etcd { child: None, dir, ports, endpoint };
        etcd.start_again()?;
        Ok(etcd)
    }

    /// Starts it (again) on its ports and data; returns once it listens.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        let (client, peer) = self.ports;
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))?;
        let child = Command::new("etcd")
            .arg("--name=test")
            .arg(format!("--data-dir={}", self.dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=test={peer_url}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("spawning etcd (Debian package etcd-server; scripts/install-deps.sh)")?;
        self.child = Some(child);
        // Generous: on a loaded machine (the emulated-host tests run beside it) etcd's first
        // start, which syncs its new WAL, has taken over 30 s.
        let deadline = Instant::now() + Duration::from_secs(90);
        let addr: SocketAddr = ([127, 0, 0, 1], client).into();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            // One that exited (its port taken since `free_port` found it free) says why.
            let exited = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                bail!("etcd exited ({status}) before it listened: {}", self.log_tail());
            }
            if Instant::now() > deadline {
                bail!("etcd did not listen within 90 s: {}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The end of etcd's log, for an error.
    fn log_tail(&self) -> String {
        let log = std::fs::read(self.dir.path().join("etcd.log")).unwrap_or_default();
        String::from_utf8_lossy(&log[log.len().saturating_sub(2000)..]).into_owned()
    }

    /// Kills it (its data stays for [`Etcd::start_again`]).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// etcd, control-plane replicas and nodes.
/// Fields drop in order: nodes first (a crashed one starts again to clean up, and it reads
/// its join token from a control plane's state directory), etcd last.
pub struct Cluster {
    pub nodes: Vec<Daemon>,
    pub controls: Vec<Daemon>,
    pub etcd: Etcd,
}

impl Cluster {
    /// Starts `controls` replicas on one etcd and `nodes` nodes (ids 1..=nodes) reporting to
    /// all of them; `node_args` go to every node.
    pub fn start(controls: usize, nodes: usize, node_args: &[&str]) -> anyhow::Result<Cluster> {
        let etcd = Etcd::start()?;
        let mut control_daemons = Vec::new();
        for _ in 0..controls {
            control_daemons.push(Daemon::start_with(&["control", "--etcd", &etcd.endpoint])?);
        }
        let mut cluster = Cluster { etcd, controls: control_daemons, nodes: Vec::new() };
        for id in 1..=nodes {
            cluster.add_node(id as u32, node_args)?;
        }
        Ok(cluster)
    }

    /// `--control ADDR=PIN` for every replica.
    fn control_args(&self) -> anyhow::Result<Vec<String>> {
        let mut args = Vec::new();
        for c in &self.controls {
            let opts = c.connect_options()?;
            let Pin::Sha256(pin) = opts.pin else { bail!("control pin is not a fingerprint") };
            args.extend(["--control".to_string(), format!("{}={pin}", opts.addr)]);
        }
        Ok(args)
    }

    pub fn add_node(&mut self, id: u32, node_args: &[&str]) -> anyhow::Result<()> {
        let token = self.controls[0].state_dir().join("access-token");
        let mut args: Vec<String> = node_args.iter().map(|s| s.to_string()).collect();
        args.extend(["node".into(), "--node-id".into(), id.to_string()]);
        args.extend(["--join-token-file".into(), token.display().to_string()]);
        args.extend(self.control_args()?);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.nodes.push(Daemon::start_with(&refs)?);
        Ok(())
    }

    /// Connect options for the first replica, with the others to fail over to.
    pub fn connect_options(&self) -> anyhow::Result<ConnectOptions> {
        let mut opts = self.controls[0].connect_options()?;
        for c in &self.controls[1..] {
            let other = c.connect_options()?;
            opts = opts.replica(other.addr, other.pin);
        }
        Ok(opts)
    }

    /// An admin client of the control plane.
    pub async fn admin(&self) -> anyhow::Result<Client> {
        Ok(Client::connect(self.connect_options()?).await?)
    }

    /// A client of the control plane with `token`.
    pub async fn client_with_token(&self, token: &str) -> anyhow::Result<Client> {
        let mut opts = self.connect_options()?;
        opts.token = token.to_string();
        Ok(Client::connect(opts).await?)
    }

    /// Waits until every replica sees `healthy` healthy nodes.
    pub async fn wait_healthy(&self, healthy: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        for c in &self.controls {
            let client = c.client().await?;
            loop {
                let up = client.cluster_status().await?.iter().filter(|n| n.healthy).count();
                if up == healthy {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("replica sees {up} healthy nodes, expected {healthy}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}

/// The node id a sandbox id carries.
pub fn node_of(sandbox: &str) -> u32 {
    sandbox
        .strip_prefix("sb-")
        .and_then(|s| s.get(..8))
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .unwrap_or(u32::MAX)
}
