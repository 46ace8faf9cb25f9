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
//! while it streams.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;

use crate::gateway::header;
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

/// Middleware on the envd routes: the request goes on holding one place of its sandbox's
/// share (kept by its response body), or answers 429 when the share is used up.
pub(crate) async fn per_sandbox(
    State(gw): State<Gateway>,
    request: Request,
    next: Next,
) -> Response {
    let Some(sandbox) = header(request.headers(), "e2b-sandbox-id").map(str::to_string) else {
        // The handler says what is missing.
        return next.run(request).await;
    };
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
    use super::*;

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
