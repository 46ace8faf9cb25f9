//! The connection-holding client.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use brig_proto::{
    CallRequest, CallResult, ControlOp, ListRequest, Reply, Request, SandboxInfo, SandboxOp,
    ToolInfo, ToolOp,
};
use brig_transport::{CertPin, ClientConnection};
use bytes::Bytes;
use tokio::sync::RwLock;

use crate::cluster::{CallHops, ClusterState};
use crate::{Error, Sandbox, SandboxOptions};

/// How the client trusts the server's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    /// SHA-256 fingerprint, hex (colons allowed).
    Sha256(String),
    /// The server's certificate file (`tls/cert.der` or `tls/cert.pem` in its state directory).
    CertFile(PathBuf),
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub addr: SocketAddr,
    pub pin: Pin,
    pub token: String,
    /// Other control-plane replicas, tried in turn when the current one fails.
    pub replicas: Vec<(SocketAddr, Pin)>,
    /// With replicas: a control-plane request unanswered this long moves to the next replica.
    pub failover_after: Duration,
    /// In a cluster, send one-shot calls straight to nodes on leased routes (default); when
    /// off, every call goes through the control plane (one more hop, its quotas apply).
    pub direct_calls: bool,
}

/// Default for [`ConnectOptions::failover_after`].
pub const FAILOVER_AFTER: Duration = Duration::from_secs(10);

impl ConnectOptions {
    pub fn new(addr: SocketAddr, pin: Pin, token: impl Into<String>) -> ConnectOptions {
        ConnectOptions {
            addr,
            pin,
            token: token.into(),
            replicas: Vec::new(),
            failover_after: FAILOVER_AFTER,
            direct_calls: true,
        }
    }

    /// Adds a control-plane replica to fail over to.
    pub fn replica(mut self, addr: SocketAddr, pin: Pin) -> ConnectOptions {
        self.replicas.push((addr, pin));
        self
    }
}

#[derive(serde::Deserialize)]
struct EndpointFile {
    addr: SocketAddr,
    cert_sha256: String,
}

impl ConnectOptions {
    /// Reads a running daemon's `endpoint.json` and `access-token` from its state directory.
    pub fn from_state_dir(dir: &Path) -> Result<ConnectOptions, Error> {
        let endpoint_path = dir.join("endpoint.json");
        let text = std::fs::read_to_string(&endpoint_path).map_err(|e| {
            Error::Config(format!("{}: {e} (is brigd running?)", endpoint_path.display()))
        })?;
        let endpoint: EndpointFile = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", endpoint_path.display())))?;
        let token = read_token(&dir.join("access-token"))?;
        Ok(ConnectOptions::new(endpoint.addr, Pin::Sha256(endpoint.cert_sha256), token))
    }

    /// [`ConnectOptions::from_state_dir`] on the default state directory: `$BRIG_STATE_DIR`, else
    /// `<user data dir>/brig`, as brigd uses.
    pub fn local() -> Result<ConnectOptions, Error> {
        let dir = match std::env::var_os("BRIG_STATE_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => dirs::data_dir()
                .ok_or_else(|| Error::Config("no user data directory; set BRIG_STATE_DIR".into()))?
                .join("brig"),
        };
        Self::from_state_dir(&dir)
    }
}

/// Reads the first token line of a token file.
pub fn read_token(path: &Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .ok_or_else(|| Error::Config(format!("{} holds no token", path.display())))
}

/// A Brig client. Cheap to clone; all clones share one connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    opts: ConnectOptions,
    /// The server and its replicas, with their pins; `current` is the one in use.
    servers: Vec<(SocketAddr, CertPin)>,
    current: AtomicUsize,
    conn: RwLock<ClientConnection>,
    /// Set when the server is a control-plane replica.
    cluster: Option<ClusterState>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let current = self.inner.current.load(Ordering::Relaxed);
        f.debug_struct("Client")
            .field("server", &self.inner.servers[current].0)
            .field("cluster", &self.inner.cluster.is_some())
            .finish()
    }
}

fn pin_of(pin: &Pin) -> Result<CertPin, Error> {
    match pin {
        Pin::Sha256(hex) => CertPin::from_hex(hex),
        Pin::CertFile(path) => CertPin::from_cert_file(path),
    }
    .map_err(|e| Error::Config(e.to_string()))
}

impl Client {
    /// Connects and authenticates.
    pub async fn connect(opts: ConnectOptions) -> Result<Client, Error> {
        let mut servers = vec![(opts.addr, pin_of(&opts.pin)?)];
        for (addr, pin) in &opts.replicas {
            servers.push((*addr, pin_of(pin)?));
        }
        let (index, conn) = dial_any(&servers, 0, &opts.token).await?;
        let cluster =
            conn.server_message().starts_with("brigd control").then(ClusterState::default);
        Ok(Client {
            inner: Arc::new(Inner {
                opts,
                servers,
                current: AtomicUsize::new(index),
                conn: RwLock::new(conn),
                cluster,
            }),
        })
    }

    /// Whether this client talks to a cluster's control plane (rather than one brigd).
    pub fn is_cluster(&self) -> bool {
        self.inner.cluster.is_some()
    }

    /// How one-shot calls travelled so far (cluster mode).
    pub fn call_hops(&self) -> CallHops {
        self.inner.cluster.as_ref().map(ClusterState::hops).unwrap_or_default()
    }

    /// Connects to the local daemon found in the default state directory.
    pub async fn connect_local() -> Result<Client, Error> {
        Self::connect(ConnectOptions::local()?).await
    }

    /// What the server said about itself in the hello.
    pub async fn server_version(&self) -> String {
        self.inner.conn.read().await.server_message().to_string()
    }

    /// The live connection, reconnecting if it was closed.
    async fn connection(&self) -> Result<ClientConnection, Error> {
        {
            let conn = self.inner.conn.read().await;
            if !conn.is_closed() {
                return Ok(conn.clone());
            }
        }
        let mut conn = self.inner.conn.write().await;
        if conn.is_closed() {
            let start = self.inner.current.load(Ordering::Relaxed);
            tracing::debug!(addr = %self.inner.servers[start].0, "reconnecting");
            let (index, fresh) =
                dial_any(&self.inner.servers, start, &self.inner.opts.token).await?;
            self.inner.current.store(index, Ordering::Relaxed);
            *conn = fresh;
        }
        Ok(conn.clone())
    }

    /// Gives up on the current server (it stopped answering) and moves to the next replica.
    async fn fail_over(&self, seen: &ClientConnection) {
        let conn = self.inner.conn.read().await;
        if conn.remote_address() == seen.remote_address() && !conn.is_closed() {
            tracing::warn!(addr = %seen.remote_address(), "control-plane replica not answering; failing over");
            conn.close();
            let next = (self.inner.current.load(Ordering::Relaxed) + 1) % self.inner.servers.len();
            self.inner.current.store(next, Ordering::Relaxed);
        }
    }

    /// Sends a request without upload and returns its reply, turning error replies into `Err`.
    /// In cluster mode a request about a sandbox goes to the sandbox's node.
    pub(crate) async fn request(&self, request: &Request) -> Result<Reply, Error> {
        use tracing::Instrument;
        let span = tracing::debug_span!("brig_request", kind = request.kind());
        async {
            let reply = match self.node_bound(request) {
                Some(sandbox) => self.node_request(sandbox, request).await?,
                None => self.control_request(request).await?,
            };
            match reply {
                Reply::Error(e) => {
                    tracing::debug!(code = e.code.as_str(), "refused");
                    Err(e.into())
                }
                reply => Ok(reply),
            }
        }
        .instrument(span)
        .await
    }

    /// The sandbox whose node serves `request`, in cluster mode.
    fn node_bound<'r>(&self, request: &'r Request) -> Option<&'r str> {
        self.inner.cluster.as_ref()?;
        match request {
            Request::Control(ControlOp::Route { .. }) => None,
            // A volume named by id is on the node its id names.
            Request::Volume(op) => op.volume().filter(|v| v.starts_with("vol-")),
            other => other.sandbox(),
        }
    }

    /// A request to the server (or, with replicas, to whichever answers).
    async fn control_request(&self, request: &Request) -> Result<Reply, Error> {
        let attempts = self.inner.servers.len();
        let mut last = None;
        for _ in 0..attempts {
            let conn = self.connection().await?;
            if attempts == 1 {
                return Ok(conn.request(request).await?);
            }
            match tokio::time::timeout(self.inner.opts.failover_after, conn.request(request)).await
            {
                Ok(Ok(reply)) => return Ok(reply),
                Ok(Err(e)) if !e.is_connection_lost() => return Err(e.into()),
                Ok(Err(e)) => last = Some(Error::from(e)),
                Err(_) => {
                    last = Some(Error::Config(format!(
                        "no reply from {} within {:?}",
                        conn.remote_address(),
                        self.inner.opts.failover_after
                    )))
                }
            }
            self.fail_over(&conn).await;
        }
        Err(last.unwrap_or_else(|| Error::Config("no control-plane replica answered".into())))
    }

    /// The route to `sandbox`'s node, from the control plane.
    async fn fetch_route(&self, sandbox: &str) -> Result<brig_proto::NodeRoute, Error> {
        match self
            .control_request(&Request::Control(ControlOp::Route { sandbox: sandbox.to_string() }))
            .await?
        {
            Reply::Route(route) => Ok(route),
            Reply::Error(e) => Err(e.into()),
            other => Err(unexpected("route", &other)),
        }
    }

    async fn node_connection(&self, sandbox: &str) -> Result<ClientConnection, Error> {
        let cluster =
            self.inner.cluster.as_ref().ok_or_else(|| Error::Config("not a cluster".into()))?;
        cluster.node_connection(sandbox, || self.fetch_route(sandbox)).await
    }

    async fn node_request(&self, sandbox: &str, request: &Request) -> Result<Reply, Error> {
        match self.node_connection(sandbox).await {
            Ok(conn) => match conn.request(request).await {
                Err(e) if e.is_connection_lost() => {}
                other => return Ok(other?),
            },
            Err(e) if e.retryable() => {}
            Err(e) => return Err(e),
        }
        // The node did not answer: ask the control plane again (it knows if the node is down).
        if let Some(cluster) = &self.inner.cluster {
            cluster.forget(sandbox).await;
        }
        let conn = self.node_connection(sandbox).await?;
        Ok(conn.request(request).await?)
    }

    /// Opens a request stream for uploads and downloads.
    pub(crate) async fn open(
        &self,
        request: &Request,
    ) -> Result<brig_transport::ClientExchange, Error> {
        let conn = match self.node_bound(request) {
            Some(sandbox) => self.node_connection(sandbox).await?,
            None => self.connection().await?,
        };
        tracing::debug!(kind = request.kind(), "opening a request stream");
        Ok(conn.open(request).await?)
    }

    /// One-shot call of a `brig:tool` component: create, run, destroy in one request.
    pub async fn call(&self, tool: &str, input: &str) -> Result<CallResult, Error> {
        self.call_with(CallRequest::new(tool, input)).await
    }

    /// One-shot call with args, env, stdin and limits (for `wasi:cli/run` commands too).
    ///
    /// In cluster mode the call goes straight to a node on a route the control plane leased
    /// (refreshed in the background), and through the control plane while no route is known.
    pub async fn call_with(&self, call: CallRequest) -> Result<CallResult, Error> {
        let request = Request::Tool(ToolOp::Call(call));
        if let Some(cluster) = self.inner.cluster.as_ref().filter(|_| self.inner.opts.direct_calls)
        {
            let (route, stale) = cluster.call_route();
            if stale && cluster.begin_refresh() {
                let client = self.clone();
                tokio::spawn(async move {
                    let routes = client.control_request(&crate::cluster::routes_request()).await;
                    if let Some(c) = &client.inner.cluster {
                        c.set_call_routes(routes.ok().and_then(crate::cluster::routes_from));
                    }
                });
            }
            if let Some(route) = route {
                let direct = async {
                    let conn = cluster.call_connection(&route).await?;
                    Ok::<_, Error>(conn.request(&request).await?)
                };
                match direct.await {
                    Ok(Reply::Called(result)) => {
                        cluster.count(true);
                        return Ok(result);
                    }
                    Ok(Reply::Error(e)) if !e.code.retryable() => return Err(e.into()),
                    // Refused for capacity or unreachable: the control plane places it.
                    _ => cluster.drop_call_route(route.node),
                }
            }
        }
        if let Some(cluster) = &self.inner.cluster {
            cluster.count(false);
        }
        match self.request(&request).await? {
            Reply::Called(result) => Ok(result),
            other => Err(unexpected("call", &other)),
        }
    }

    /// Creates a sandbox.
    pub async fn create(&self, options: SandboxOptions) -> Result<Sandbox, Error> {
        match self
            .request(&Request::Sandbox(SandboxOp::Create(Box::new(options.into_request()))))
            .await?
        {
            Reply::Sandbox(info) => Ok(Sandbox::new(self.clone(), info.id)),
            Reply::Placed { sandbox, route } => {
                if let Some(cluster) = &self.inner.cluster {
                    cluster.remember(route).await;
                }
                Ok(Sandbox::new(self.clone(), sandbox.id))
            }
            other => Err(unexpected("create", &other)),
        }
    }

    /// Creates a sandbox as [`Client::create`] does; when the node pulls its image first
    /// (`oci:REF` it has not seen), `on_progress` hears how the pull goes. Through a cluster's
    /// control plane the create says nothing of a pull.
    pub async fn create_with_progress(
        &self,
        options: SandboxOptions,
        mut on_progress: impl FnMut(&brig_proto::PullProgress),
    ) -> Result<Sandbox, Error> {
        if self.inner.cluster.is_some() {
            return self.create(options).await;
        }
        let mut request = options.into_request();
        request.pull_progress = true;
        let mut exchange =
            self.open(&Request::Sandbox(SandboxOp::Create(Box::new(request)))).await?;
        exchange.finish_upload()?;
        loop {
            match exchange.reply().await? {
                Reply::PullProgress(progress) => on_progress(&progress),
                Reply::Sandbox(info) => return Ok(Sandbox::new(self.clone(), info.id)),
                Reply::Error(e) => return Err(e.into()),
                other => return Err(unexpected("create", &other)),
            }
        }
    }

    /// A handle to an existing sandbox by id (e.g. after the rollout worker restarted).
    /// Nothing is checked until it is used; [`Sandbox::status`] checks it exists.
    pub fn sandbox(&self, id: &str) -> Sandbox {
        Sandbox::new(self.clone(), id.to_string())
    }

    /// Sandboxes whose labels include every `selector` pair (all when empty).
    pub async fn list(&self, selector: &[(&str, &str)]) -> Result<Vec<SandboxInfo>, Error> {
        let labels = selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        match self
            .request(&Request::Sandbox(SandboxOp::List(ListRequest { labels, project: None })))
            .await?
        {
            Reply::Sandboxes(list) => Ok(list),
            other => Err(unexpected("list", &other)),
        }
    }

    /// Registers a tool component under `name` (replacing an earlier one of that name).
    pub async fn add_tool(
        &self,
        name: &str,
        component: impl Into<Bytes>,
    ) -> Result<ToolInfo, Error> {
        let mut exchange =
            self.open(&Request::Tool(ToolOp::Add { name: name.to_string() })).await?;
        exchange.send_raw(component.into()).await?;
        exchange.finish_upload()?;
        match exchange.reply().await? {
            Reply::Tool(info) => Ok(info),
            Reply::Error(e) => Err(e.into()),
            other => Err(unexpected("tool_add", &other)),
        }
    }

    /// Registered tools.
    pub async fn tools(&self) -> Result<Vec<ToolInfo>, Error> {
        match self.request(&Request::Tool(ToolOp::List)).await? {
            Reply::Tools(tools) => Ok(tools),
            other => Err(unexpected("tool_list", &other)),
        }
    }

    pub async fn remove_tool(&self, name: &str) -> Result<(), Error> {
        expect_done(
            "tool_remove",
            self.request(&Request::Tool(ToolOp::Remove { name: name.to_string() })).await?,
        )
    }

    /// Closes the connection; clones of this client reconnect on their next request.
    pub async fn close(&self) {
        self.inner.conn.read().await.close();
    }
}

/// Connects to the first server that answers, starting at `start`.
async fn dial_any(
    servers: &[(SocketAddr, CertPin)],
    start: usize,
    token: &str,
) -> Result<(usize, ClientConnection), Error> {
    let mut last = None;
    for k in 0..servers.len() {
        let index = (start + k) % servers.len();
        let (addr, pin) = &servers[index];
        match ClientConnection::connect_current(*addr, pin, token).await {
            Ok(conn) => return Ok((index, conn)),
            // A refused hello is an answer: do not try to get around it elsewhere.
            Err(source @ brig_transport::TransportError::HelloRefused { .. }) => {
                return Err(Error::Connect { addr: addr.to_string(), source })
            }
            Err(source) => last = Some(Error::Connect { addr: addr.to_string(), source }),
        }
    }
    Err(last.unwrap_or_else(|| Error::Config("no server to connect to".into())))
}

pub(crate) fn unexpected(request: &'static str, reply: &Reply) -> Error {
    let mut text = format!("{reply:?}");
    text.truncate(200);
    Error::UnexpectedReply { request, reply: text }
}

pub(crate) fn expect_done(request: &'static str, reply: Reply) -> Result<(), Error> {
    match reply {
        Reply::Done => Ok(()),
        other => Err(unexpected(request, &other)),
    }
}
