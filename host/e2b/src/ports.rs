//! A sandbox's own ports through the gateway, as E2B's proxy serves them: a request that
//! names a sandbox and a port other than envd's (the `E2b-Sandbox-Id` and `E2b-Sandbox-Port`
//! headers, or the `<port>-<sandbox id>.<domain>` host `sandbox.get_host(port)` gives) is
//! sent to that port on the sandbox's own loopback through a `ConnectPort` stream
//! (`Sandbox::connect_port`): HTTP/1.1 to the sandbox whatever the client spoke (HTTP/1.1 or
//! HTTP/2), streaming bodies, and WebSocket (or any) upgrades carried both ways after the
//! `101`. Nothing listening there is a `502`, as E2B answers.

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
    // A private sandbox's ports take its traffic access token.
    if gw.inner.facts.of(&sb).await.is_some_and(|f| f.private) {
        let token = header(req.headers(), "e2b-traffic-access-token").unwrap_or_default();
        if !gw.envd_token_ok(&format!("traffic/{sandbox}"), token) {
            let message = "this sandbox's ports need its traffic access token".to_string();
            return answer(StatusCode::FORBIDDEN, sandbox, port, message);
        }
    }
    let stream = match sb.connect_port(port).await {
        Ok(stream) => stream,
        Err(e) => {
            let (status, message) = match e.code() {
                Some(ErrorCode::NotFound | ErrorCode::BadRequest | ErrorCode::Expired) => {
                    (StatusCode::NOT_FOUND, format!("the sandbox {sandbox} was not found"))
                }
                Some(ErrorCode::Unavailable) => (
                    StatusCode::BAD_GATEWAY,
                    format!("the sandbox is running but port {port} is not open"),
                ),
                _ => (StatusCode::BAD_GATEWAY, crate::envd::brig_message(&e)),
            };
            return answer(status, sandbox, port, message);
        }
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => return answer(StatusCode::BAD_GATEWAY, sandbox, port, e.to_string()),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "a proxied port connection ended");
        }
    });
    // HTTP/1.1 to the sandbox: the path only, and a Host (an HTTP/2 request has :authority).
    if let Some(authority) = req.uri().authority().cloned() {
        if !req.headers().contains_key(header::HOST) {
            if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
                req.headers_mut().insert(header::HOST, host);
            }
        }
    }
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    *req.uri_mut() = path.parse::<Uri>().unwrap_or_default();
    *req.version_mut() = axum::http::Version::HTTP_11;
    let upgrading = req.headers().contains_key(header::UPGRADE);
    let client_side = upgrading.then(|| hyper::upgrade::on(&mut req));
    let mut response = match sender.send_request(req).await {
        Ok(response) => response,
        Err(e) => return answer(StatusCode::BAD_GATEWAY, sandbox, port, e.to_string()),
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let sandbox_side = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                let (Ok(client), Ok(inner)) = tokio::join!(client_side, sandbox_side) else {
                    return;
                };
                let (mut client, mut inner) = (TokioIo::new(client), TokioIo::new(inner));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut inner).await;
            });
        }
    }
    response.map(Body::new)
}

#[cfg(test)]
mod tests {
    use super::*;

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
