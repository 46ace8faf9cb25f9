//! The connection-holding client.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use brig_proto::{CallRequest, CallResult, ListRequest, Reply, Request, SandboxInfo, ToolInfo};
use brig_transport::{CertPin, ClientConnection};
use bytes::Bytes;
use tokio::sync::RwLock;

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
        Ok(ConnectOptions { addr: endpoint.addr, pin: Pin::Sha256(endpoint.cert_sha256), token })
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
    pin: CertPin,
    conn: RwLock<ClientConnection>,
}

impl Client {
    /// Connects and authenticates.
    pub async fn connect(opts: ConnectOptions) -> Result<Client, Error> {
        let pin = match &opts.pin {
            Pin::Sha256(hex) => CertPin::from_hex(hex),
            Pin::CertFile(path) => CertPin::from_cert_file(path),
        }
        .map_err(|e| Error::Config(e.to_string()))?;
        let conn = dial(&opts, &pin).await?;
        Ok(Client { inner: Arc::new(Inner { opts, pin, conn: RwLock::new(conn) }) })
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
            tracing::debug!(addr = %self.inner.opts.addr, "reconnecting");
            *conn = dial(&self.inner.opts, &self.inner.pin).await?;
        }
        Ok(conn.clone())
    }

    /// Sends a request without upload and returns its reply, turning error replies into `Err`.
    pub(crate) async fn request(&self, request: &Request) -> Result<Reply, Error> {
        use tracing::Instrument;
        let span = tracing::debug_span!("brig_request", kind = request.kind());
        async {
            let conn = self.connection().await?;
            match conn.request(request).await? {
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

    /// Opens a request stream for uploads and downloads.
    pub(crate) async fn open(
        &self,
        request: &Request,
    ) -> Result<brig_transport::ClientExchange, Error> {
        let conn = self.connection().await?;
        tracing::debug!(kind = request.kind(), "opening a request stream");
        Ok(conn.open(request).await?)
    }

    /// One-shot call of a `brig:tool` component: create, run, destroy in one request.
    pub async fn call(&self, tool: &str, input: &str) -> Result<CallResult, Error> {
        self.call_with(CallRequest::new(tool, input)).await
    }

    /// One-shot call with args, env, stdin and limits (for `wasi:cli/run` commands too).
    pub async fn call_with(&self, call: CallRequest) -> Result<CallResult, Error> {
        match self.request(&Request::Call(call)).await? {
            Reply::Called(result) => Ok(result),
            other => Err(unexpected("call", &other)),
        }
    }

    /// Creates a sandbox.
    pub async fn create(&self, options: SandboxOptions) -> Result<Sandbox, Error> {
        match self.request(&Request::Create(options.into_request())).await? {
            Reply::Sandbox(info) => Ok(Sandbox::new(self.clone(), info.id)),
            other => Err(unexpected("create", &other)),
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
        match self.request(&Request::List(ListRequest { labels })).await? {
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
        let mut exchange = self.open(&Request::ToolAdd { name: name.to_string() }).await?;
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
        match self.request(&Request::ToolList).await? {
            Reply::Tools(tools) => Ok(tools),
            other => Err(unexpected("tool_list", &other)),
        }
    }

    pub async fn remove_tool(&self, name: &str) -> Result<(), Error> {
        expect_done(
            "tool_remove",
            self.request(&Request::ToolRemove { name: name.to_string() }).await?,
        )
    }

    /// Closes the connection; clones of this client reconnect on their next request.
    pub async fn close(&self) {
        self.inner.conn.read().await.close();
    }
}

async fn dial(opts: &ConnectOptions, pin: &CertPin) -> Result<ClientConnection, Error> {
    ClientConnection::connect_current(opts.addr, pin, &opts.token)
        .await
        .map_err(|source| Error::Connect { addr: opts.addr.to_string(), source })
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
