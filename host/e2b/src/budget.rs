//! Each sandbox's share of the gateway's requests to the node. Every envd request of every
//! sandbox travels over the gateway's one QUIC connection to brigd, which takes a bounded
//! number of requests at once (the node's `limits.streams_per_connection`). Without a share,
//! one sandbox's stalled uploads or streams would fill that connection and every other
//! sandbox's commands would be refused. A sandbox has at most [`PER_SANDBOX`] envd requests
//! open at once; past it that sandbox alone hears 429, everyone else carries on.
//!
//! Uploads (`POST /files`) also take a place of a smaller share, [`UPLOADS_PER_SANDBOX`]: each
//! holds a transfer's buffers on both sides of that connection while its client sends.
//!
//! A request counts as open until its response body is dropped, so a stream holds its place
//! while it streams. Only a request carrying its sandbox's access token takes a place: a
//! stranger who knows the id is refused first, and cannot use up the share.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;

use crate::envd;
use crate::Gateway;

/// Envd requests one sandbox has open at once (a 32nd of the node's default 8,192 per
/// connection, so 32 stalled sandboxes are needed to fill it).
pub const PER_SANDBOX: usize = 256;
/// Uploads one sandbox has open at once.
pub const UPLOADS_PER_SANDBOX: usize = 16;
/// Sandboxes whose shares are remembered before idle ones are forgotten.
const REMEMBERED: usize = 1 << 16;

/// The shares of the sandboxes with requests open (or lately so).
#[derive(Default)]
pub(crate) struct SandboxBudgets(parking_lot::Mutex<HashMap<String, Share>>);

/// One sandbox's share: requests, and of those, uploads.
#[derive(Clone)]
struct Share {
    requests: Arc<Semaphore>,
    uploads: Arc<Semaphore>,
}

impl SandboxBudgets {
    fn share(&self, sandbox: &str) -> Share {
        let mut shares = self.0.lock();
        if shares.len() >= REMEMBERED && !shares.contains_key(sandbox) {
            shares.retain(|_, s| s.requests.available_permits() < PER_SANDBOX);
        }
        shares
            .entry(sandbox.to_string())
            .or_insert_with(|| Share {
                requests: Arc::new(Semaphore::new(PER_SANDBOX)),
                uploads: Arc::new(Semaphore::new(UPLOADS_PER_SANDBOX)),
            })
            .clone()
    }
}

fn too_many(sandbox: &str, what: &str, max: usize) -> Response {
    let message = format!("sandbox {sandbox} has {max} {what} open; wait for some to end");
    let body = serde_json::json!({ "code": 429, "message": message });
    (StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response()
}

/// Middleware on the envd routes: a request whose caller may touch its sandbox (see
/// [`envd::authorized`]: a short id and its access token) goes on holding one place of that
/// sandbox's share (kept by its response body), or answers 429 when the share is used up.
/// Anyone else is answered at once (401 for a missing or wrong token), before its body is
/// read or a place taken: knowing a sandbox's id is not enough to use up its share, and only
/// ids the gateway signed are remembered.
pub(crate) async fn per_sandbox(
    State(gw): State<Gateway>,
    mut request: Request,
    next: Next,
) -> Response {
    let admitted = match envd::authorized(&gw, request.headers()) {
        Ok(id) => Ok(id.to_string()),
        // A signed file URL (no token: its signature stands for it).
        Err(e)
            if request.uri().path() == "/files"
                && !request.headers().contains_key("x-access-token") =>
        {
            let query: envd::SignedQuery =
                serde_urlencoded::from_str(request.uri().query().unwrap_or_default())
                    .unwrap_or_default();
            let write = request.method() == Method::POST;
            match envd::signed_file_url(&gw, request.headers(), write, &query) {
                Ok(id) => Ok(id.to_string()),
                Err(signed) if query.signature.is_some() => Err(signed),
                Err(_) => Err(e),
            }
        }
        Err(e) => Err(e),
    };
    let sandbox = match admitted {
        Ok(id) => id,
        Err(e) => {
            tracing::debug!(path = request.uri().path(), error = %e, "envd request refused");
            return e.into_response();
        }
    };
    // The handlers find the sandbox and its token in the headers, however it was named.
    for (name, value) in
        [("e2b-sandbox-id", sandbox.clone()), ("x-access-token", gw.envd_token(&sandbox))]
    {
        if let Ok(value) = axum::http::HeaderValue::from_str(&value) {
            request.headers_mut().insert(name, value);
        }
    }
    let share = gw.inner.budgets.share(&sandbox);
    let Ok(place) = share.requests.try_acquire_owned() else {
        return too_many(&sandbox, "requests", PER_SANDBOX);
    };
    let upload = if request.method() == Method::POST && request.uri().path() == "/files" {
        match share.uploads.try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => return too_many(&sandbox, "uploads", UPLOADS_PER_SANDBOX),
        }
    } else {
        None
    };
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    let body = body.map_frame(move |frame| {
        let _held = (&place, &upload);
        frame
    });
    Response::from_parts(parts, Body::new(body))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use brig_sdk::{ConnectOptions, Pin};
    use tower_service::Service as _;

    use super::*;
    use crate::{E2bConfig, KeyCheck};

    fn gateway() -> Gateway {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("brig-e2b-budget-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("state dir");
        // No brigd behind it: the requests here never get past the middleware.
        let connect = ConnectOptions::new(
            "127.0.0.1:9".parse().expect("addr"),
            Pin::Sha256("00".repeat(32)),
            "token",
        );
        let gw = Gateway::new(E2bConfig::default(), connect, KeyCheck::AskDaemon, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        gw.expect("gateway")
    }

    /// A Start request for `id` with `token` whose body never arrives.
    fn stalled_start(id: &str, token: &str) -> Request {
        let never = futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
        Request::post("/process.Process/Start")
            .header("e2b-sandbox-id", id)
            .header("x-access-token", token)
            .header("content-type", "application/connect+json")
            .body(Body::from_stream(never))
            .expect("request")
    }

    #[tokio::test]
    async fn strangers_are_answered_before_a_body_is_read_or_a_place_taken() {
        let gw = gateway();
        let router = gw.router();
        let id = "sb-00000000-0123456789abcdef";
        let other_token = gw.envd_token("sb-00000000-fedcba9876543210");
        let mut answers = Vec::new();
        for token in ["", "00", "not hex", other_token.as_str()] {
            for _ in 0..=PER_SANDBOX {
                let call = router.clone().call(stalled_start(id, token));
                let response = tokio::time::timeout(Duration::from_secs(5), call)
                    .await
                    .expect("answered without the body")
                    .expect("infallible");
                assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "token {token:?}");
                // Held, as a stalled client would hold it.
                answers.push(response);
            }
        }
        let long = format!("sb-{}", "0".repeat(100_000));
        let response = router.clone().call(stalled_start(&long, "")).await.expect("infallible");
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert!(gw.inner.budgets.0.lock().is_empty(), "no share is kept for strangers");
        assert_eq!(gw.inner.budgets.share(id).requests.available_permits(), PER_SANDBOX);
        // The debug layout's sandbox needs no token there, and only there.
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("e2b-sandbox-id", crate::envd::DEBUG_SANDBOX_ID.parse().expect("value"));
        assert!(envd::authorized(&gw, &headers).is_err());
        let debug = Gateway { debug_layout: true, ..gw.clone() };
        assert!(envd::authorized(&debug, &headers).is_ok());
        headers.insert("e2b-sandbox-id", id.parse().expect("value"));
        headers.insert("x-access-token", gw.envd_token(id).parse().expect("value"));
        assert_eq!(envd::authorized(&gw, &headers).ok(), Some(id));
    }

    #[test]
    fn a_sandbox_share_is_its_own_and_idle_shares_are_forgotten() {
        let budgets = SandboxBudgets::default();
        let held: Vec<_> = (0..PER_SANDBOX)
            .map(|_| budgets.share("a").requests.try_acquire_owned().expect("a place"))
            .collect();
        assert!(budgets.share("a").requests.try_acquire_owned().is_err(), "a's share is used up");
        assert!(budgets.share("b").requests.try_acquire_owned().is_ok(), "b is not affected");
        drop(held);
        assert!(budgets.share("a").requests.try_acquire_owned().is_ok(), "places come back");
    }
}
