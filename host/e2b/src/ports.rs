//! A sandbox's own ports through the gateway, as E2B's proxy serves them: a request that
//! names a sandbox and a port other than envd's (the `E2b-Sandbox-Id` and `E2b-Sandbox-Port`
//! headers, or the `<port>-<sandbox id>.<domain>` host `sandbox.get_host(port)` gives) is
//! sent to that port on the sandbox's own loopback through a `ConnectPort` stream
//! (`Sandbox::connect_port`): HTTP/1.1 to the sandbox whatever the client spoke (HTTP/1.1 or
//! HTTP/2), streaming bodies, and WebSocket (or any) upgrades carried both ways after the
//! `101`. Nothing listening there is a `502`, as E2B answers. One sandbox's ports take at
//! most [`MAX_OPEN_PER_SANDBOX`] requests and upgraded connections at once (`429` past it),
//! so one busy sandbox cannot take every stream the gateway has.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use brig_sdk::ErrorCode;
use hyper_util::rt::TokioIo;
use serde_json::json;

use crate::gateway::header;
use crate::Gateway;

/// The sandbox and port a request is for, when it is for a sandbox's own port (not envd's).
pub(crate) fn port_target(headers: &axum::http::HeaderMap, uri: &Uri) -> Option<(String, u16)> {
    if let Some(port) = header(headers, "e2b-sandbox-port") {
        let port: u16 = port.trim().parse().ok()?;
        let id = header(headers, "e2b-sandbox-id")?.trim().to_string();
        return (port != crate::ENVD_PORT && !id.is_empty()).then_some((id, port));
    }
    // `8000-sb-00000000-0123456789abcdef.example.com[:3000]`
    // HTTP/2 carries the host as the `:authority` of the URI.
    let host = header(headers, "host").or_else(|| uri.authority().map(|a| a.as_str()))?;
    let (port, rest) = host.split_once('-')?;
    let port: u16 = port.parse().ok()?;
    let id = rest.split(['.', ':']).next()?;
    (port != crate::ENVD_PORT && !id.is_empty()).then(|| (id.to_string(), port))
}

/// Middleware: port requests go to the sandbox, the rest on to the gateway's routes.
pub(crate) async fn route(State(gw): State<Gateway>, req: Request, next: Next) -> Response {
    match port_target(req.headers(), req.uri()) {
        Some((sandbox, port)) => proxy(&gw, &sandbox, port, req).await,
        None => next.run(req).await,
    }
}

/// Requests (until their response body ends) and upgraded connections open to one sandbox's
/// ports at once.
pub(crate) const MAX_OPEN_PER_SANDBOX: usize = 1024;

/// How many requests and connections are open to each sandbox's ports.
#[derive(Default)]
pub(crate) struct PortLoad {
    open: std::sync::Arc<parking_lot::Mutex<std::collections::HashMap<String, usize>>>,
}

/// One open request or connection to a sandbox's port; its place is given back when dropped.
pub(crate) struct PortSlot {
    open: std::sync::Arc<parking_lot::Mutex<std::collections::HashMap<String, usize>>>,
    sandbox: String,
}

impl PortLoad {
    /// A place for one more request to `sandbox`'s ports, if it has fewer than the most.
    pub(crate) fn enter(&self, sandbox: &str) -> Option<PortSlot> {
        let mut open = self.open.lock();
        let count = open.entry(sandbox.to_string()).or_default();
        if *count >= MAX_OPEN_PER_SANDBOX {
            return None;
        }
        *count += 1;
        Some(PortSlot { open: self.open.clone(), sandbox: sandbox.to_string() })
    }
}

impl Drop for PortSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        if let Some(count) = open.get_mut(&self.sandbox) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.sandbox);
            }
        }
    }
}

/// The made-up domain of pooled connections' URIs: `<sandbox>.<port>.brig-port`.
const POOL_DOMAIN: &str = "brig-port";
/// Idle connections kept to one sandbox port.
const IDLE_PER_PORT: usize = 32;

/// The HTTP client of port routes: connections to sandbox ports, kept for the next request.
pub(crate) type PortClient = hyper_util::client::legacy::Client<PortConnector, Body>;

fn pooled_client(admin: brig_sdk::Client) -> PortClient {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(IDLE_PER_PORT)
        .pool_idle_timeout(std::time::Duration::from_secs(30))
        .build(PortConnector { admin })
}

/// Connects to the sandbox port a pooled URI names (`Sandbox::connect_port`).
#[derive(Clone)]
pub(crate) struct PortConnector {
    admin: brig_sdk::Client,
}

/// A connection to a sandbox port, as hyper's client takes it.
pub(crate) struct PortStream(tokio::io::DuplexStream);

impl hyper_util::client::legacy::connect::Connection for PortStream {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

impl tokio::io::AsyncRead for PortStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for PortStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl tower_service::Service<Uri> for PortConnector {
    type Response = TokioIo<PortStream>;
    type Error = brig_sdk::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let admin = self.admin.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or_default();
            let mut parts = host.rsplitn(3, '.');
            let (_, port, sandbox) = (parts.next(), parts.next(), parts.next());
            let port = port.and_then(|p| p.parse::<u16>().ok()).unwrap_or(0);
            let sandbox = sandbox.unwrap_or_default();
            let stream = admin.sandbox(sandbox).connect_port(port).await?;
            Ok(TokioIo::new(PortStream(stream)))
        })
    }
}

fn answer(status: StatusCode, sandbox: &str, port: u16, message: String) -> Response {
    let body =
        json!({ "sandboxId": sandbox, "port": port, "message": message, "code": status.as_u16() });
    (status, Json(body)).into_response()
}

async fn proxy(gw: &Gateway, sandbox: &str, port: u16, mut req: Request) -> Response {
    let admin = match gw.admin().await {
        Ok(admin) => admin,
        Err(e) => return answer(StatusCode::SERVICE_UNAVAILABLE, sandbox, port, e.to_string()),
    };
    // A request with an API key is its holder's: another project's sandbox is not there.
    if header(req.headers(), "x-api-key").is_some() {
        let client = match crate::api::caller(gw, req.headers()).await {
            Ok(client) => client,
            Err(e) => return e.into_response(),
        };
        if let Err(e) = client.sandbox(sandbox).status().await {
            let status = match e.code() {
                Some(ErrorCode::NotFound | ErrorCode::BadRequest | ErrorCode::PermissionDenied) => {
                    StatusCode::NOT_FOUND
                }
                _ => StatusCode::BAD_GATEWAY,
            };
            let message = format!("the sandbox {sandbox} was not found");
            return answer(status, sandbox, port, message);
        }
    }
    let sb = admin.sandbox(sandbox);
    crate::auto_resume::before_port_request(gw, &sb).await;
    // A private sandbox's ports take its traffic access token.
    if gw.inner.facts.of(&sb).await.is_some_and(|f| f.private) {
        let token = header(req.headers(), "e2b-traffic-access-token").unwrap_or_default();
        if !gw.envd_token_ok(&format!("traffic/{sandbox}"), token) {
            let message = "this sandbox's ports need its traffic access token".to_string();
            return answer(StatusCode::FORBIDDEN, sandbox, port, message);
        }
    }
    let Some(slot) = gw.inner.port_load.enter(sandbox) else {
        let message = format!(
            "{MAX_OPEN_PER_SANDBOX} requests and connections are open to this sandbox's ports"
        );
        return answer(StatusCode::TOO_MANY_REQUESTS, sandbox, port, message);
    };
    let client = gw.inner.port_client.get_or_init(|| async { pooled_client(admin) }).await;
    // HTTP/1.1 to the sandbox, on a pooled connection to its port (`PortConnector`); the
    // client's Host header is kept (an HTTP/2 request has it as its :authority).
    if let Some(authority) = req.uri().authority().cloned() {
        if !req.headers().contains_key(header::HOST) {
            if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
                req.headers_mut().insert(header::HOST, host);
            }
        }
    }
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    let target = format!("http://{sandbox}.{port}.{POOL_DOMAIN}{path}");
    let Ok(uri) = target.parse::<Uri>() else {
        return answer(StatusCode::BAD_REQUEST, sandbox, port, format!("a bad path {path:?}"));
    };
    *req.uri_mut() = uri;
    *req.version_mut() = axum::http::Version::HTTP_11;
    let upgrading = req.headers().contains_key(header::UPGRADE);
    let client_side = upgrading.then(|| hyper::upgrade::on(&mut req));
    let mut response = match client.request(req).await {
        Ok(response) => response,
        Err(e) => {
            // The connector's own error says whether the sandbox or its port is missing.
            let brig = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<brig_sdk::Error>())
                .and_then(brig_sdk::Error::code);
            let (status, message) = match brig {
                Some(ErrorCode::NotFound | ErrorCode::BadRequest | ErrorCode::Expired) => {
                    (StatusCode::NOT_FOUND, format!("the sandbox {sandbox} was not found"))
                }
                Some(ErrorCode::Unavailable) => (
                    StatusCode::BAD_GATEWAY,
                    format!("the sandbox is running but port {port} is not open"),
                ),
                _ => (StatusCode::BAD_GATEWAY, format!("port {port}: {e}")),
            };
            return answer(status, sandbox, port, message);
        }
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let sandbox_side = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                // The connection holds the sandbox's place while it is open.
                let _slot = slot;
                let (Ok(client), Ok(inner)) = tokio::join!(client_side, sandbox_side) else {
                    return;
                };
                let (mut client, mut inner) = (TokioIo::new(client), TokioIo::new(inner));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut inner).await;
            });
        }
        return response.map(Body::new);
    }
    // The request holds its place until its response body ends (or is dropped).
    use http_body_util::BodyExt;
    response.map(|body| {
        Body::new(body.map_frame(move |frame| {
            let _held = &slot;
            frame
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sandboxs_ports_take_at_most_so_many_at_once() {
        let load = PortLoad::default();
        let held: Vec<PortSlot> =
            (0..MAX_OPEN_PER_SANDBOX).map(|_| load.enter("sb-a").expect("room")).collect();
        assert!(load.enter("sb-a").is_none(), "one past the most");
        assert!(load.enter("sb-b").is_some(), "another sandbox has its own");
        drop(held);
        assert!(load.open.lock().get("sb-a").is_none(), "given back, forgotten");
        assert!(load.enter("sb-a").is_some());
    }

    #[test]
    fn port_requests_are_told_from_envd_ones() {
        let mut h = axum::http::HeaderMap::new();
        h.insert("host", "8000-sb-00000000-0123456789abcdef.e2b.local:3000".parse().expect("h"));
        assert_eq!(
            port_target(&h, &Uri::default()),
            Some(("sb-00000000-0123456789abcdef".into(), 8000))
        );
        h.insert("host", "49983-sb-1.e2b.local".parse().expect("h"));
        assert_eq!(port_target(&h, &Uri::default()), None, "envd's port is envd");
        h.insert("host", "127.0.0.1:3000".parse().expect("h"));
        assert_eq!(port_target(&h, &Uri::default()), None);
        h.insert("e2b-sandbox-id", "sb-2".parse().expect("h"));
        h.insert("e2b-sandbox-port", "49999".parse().expect("h"));
        assert_eq!(port_target(&h, &Uri::default()), Some(("sb-2".into(), 49999)));
        h.insert("e2b-sandbox-port", "49983".parse().expect("h"));
        assert_eq!(port_target(&h, &Uri::default()), None);
    }
}
