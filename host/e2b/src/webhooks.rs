//! E2B's lifecycle webhooks: registered per project (`/events/webhooks`: create, list, get,
//! change, delete; kept in the gateway's state directory, `e2b-webhooks.json`), and delivered
//! from the node's lifecycle journal as E2B delivers them: a POST of the event (`SandboxEvent`
//! v2, camelCase) with `e2b-webhook-id`, `e2b-delivery-id`, `e2b-signature-version: v1` and
//! `e2b-signature` = base64url (unpadded) of SHA-256 over the secret and the body.
//!
//! The journal is followed from where the gateway left it (`e2b-webhooks-cursor`, saved at
//! most once a second, after the events before it were queued), so events that happened while
//! the gateway was down are delivered when it is back, as far back as the node's journal holds
//! (the events of the last second before a stop may be delivered twice: receivers tell them by
//! the event's id; a delivery queued but not yet sent when the gateway stopped is not sent).
//!
//! Deliveries never hold up a sandbox operation: one task follows the journal and puts each
//! delivery in a bounded queue ([`QUEUE`]; when it is full the delivery is dropped and
//! counted); [`SENDERS`] of them are sent at once, each with a deadline ([`SEND_DEADLINE`])
//! and retried with backoff ([`RETRIES`]) on failure, so a receiver that is down or slow
//! costs only its own deliveries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::api::{caller, parse, rfc3339, unix_ms, ApiError, ApiResult};
use crate::Gateway;

/// Deliveries waiting at most.
pub const QUEUE: usize = 10_000;
/// Deliveries sent at once at most.
pub const SENDERS: usize = 32;
/// How long one attempt may take.
pub const SEND_DEADLINE: Duration = Duration::from_secs(10);
/// Attempts after the first, with doubling waits from [`FIRST_BACKOFF`].
pub const RETRIES: u32 = 3;
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// How often the dispatcher's place in the journal is saved, at most.
const CURSOR_EVERY: Duration = Duration::from_secs(1);
/// Webhooks one project may have.
pub const MAX_PER_PROJECT: usize = 100;

/// One registered webhook.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Webhook {
    pub id: String,
    /// The project whose token made it (`None`: an admin's, which sees every sandbox).
    pub project: Option<String>,
    pub name: String,
    pub url: String,
    pub events: Vec<String>,
    pub enabled: bool,
    pub secret: String,
    pub created_unix_ms: u64,
}

/// The gateway's webhooks, saved whole on each change.
pub(crate) struct Webhooks {
    path: PathBuf,
    /// The last journal event the dispatcher handled.
    cursor_path: PathBuf,
    by_id: parking_lot::Mutex<BTreeMap<String, Webhook>>,
    /// Deliveries dropped because the queue was full.
    pub(crate) dropped: AtomicU64,
    /// Deliveries that failed every attempt.
    pub(crate) failed: AtomicU64,
    pub(crate) delivered: AtomicU64,
}

impl Webhooks {
    pub(crate) fn open(state_dir: &Path) -> Webhooks {
        let path = state_dir.join("e2b-webhooks.json");
        let by_id = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Webhooks {
            cursor_path: state_dir.join("e2b-webhooks-cursor"),
            path,
            by_id: parking_lot::Mutex::new(by_id),
            dropped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
        }
    }

    fn change<T>(&self, f: impl FnOnce(&mut BTreeMap<String, Webhook>) -> T) -> T {
        let mut all = self.by_id.lock();
        let out = f(&mut all);
        let bytes = serde_json::to_vec_pretty(&*all).unwrap_or_default();
        let tmp = self.path.with_extension("json.tmp");
        if let Err(e) = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, &self.path))
        {
            tracing::warn!(error = %e, path = %self.path.display(), "cannot save the E2B webhooks");
        }
        out
    }

    /// The last journal event handled before, if the gateway ran before.
    fn saved_cursor(&self) -> Option<u64> {
        std::fs::read_to_string(&self.cursor_path).ok()?.trim().parse().ok()
    }

    fn save_cursor(&self, seq: u64) {
        let tmp = self.cursor_path.with_extension("tmp");
        let saved = std::fs::write(&tmp, seq.to_string())
            .and_then(|()| std::fs::rename(&tmp, &self.cursor_path));
        if let Err(e) = saved {
            tracing::warn!(error = %e, "cannot save the webhook dispatcher's place");
        }
    }

    /// The enabled webhooks an event of `project` of E2B type `kind` goes to.
    fn targets(&self, project: Option<&str>, kind: &str) -> Vec<Webhook> {
        if self.by_id.lock().is_empty() {
            return Vec::new();
        }
        let sees = |w: &Webhook| match (&w.project, project) {
            (None, _) => true,
            (Some(p), Some(e)) => e == p || e.starts_with(&format!("{p}/")),
            (Some(_), None) => false,
        };
        self.by_id
            .lock()
            .values()
            .filter(|w| w.enabled && sees(w) && w.events.iter().any(|e| e == kind))
            .cloned()
            .collect()
    }
}

/// E2B's signature of a delivery: base64url, unpadded, of SHA-256 over secret and body.
pub fn signature(secret: &str, body: &[u8]) -> String {
    use base64::Engine;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(secret.as_bytes());
    ctx.update(body);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(ctx.finish().as_ref())
}

struct Delivery {
    webhook: Webhook,
    body: Bytes,
}

/// Follows the node's journal and delivers to the webhooks, until the process ends.
pub(crate) fn spawn_dispatcher(gw: Gateway) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (tx, rx) = tokio::sync::mpsc::channel::<Delivery>(QUEUE);
        tokio::spawn(send_all(gw.clone(), rx));
        let mut after: Option<u64> = None;
        loop {
            if let Err(e) = follow(&gw, &tx, &mut after).await {
                tracing::debug!(error = %e, "webhook dispatcher: following the journal again");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// Reads the journal from `after` (when `None`: from where the gateway left it before, or
/// from the newest event if it never ran) and queues each delivery.
async fn follow(
    gw: &Gateway,
    tx: &tokio::sync::mpsc::Sender<Delivery>,
    after: &mut Option<u64>,
) -> Result<(), brig_sdk::Error> {
    let admin = gw.admin().await.map_err(|e| brig_sdk::Error::LocalIo {
        path: "the gateway's client".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    if admin.is_cluster() {
        // A node's journal is followed on the node: a replica's gateway delivers nothing
        // (and does not ask every node each second).
        tracing::info!("webhooks are delivered by the gateway of a node, not of a control replica");
        std::future::pending::<()>().await;
    }
    let start = match *after {
        Some(seq) => seq,
        None => {
            let newest =
                brig_sdk::EventsRequest { limit: 1, newest_first: true, ..Default::default() };
            let newest = admin.events(newest).await?.last().map_or(0, |e| e.seq);
            // A cursor past the journal's end is from a journal that was started over.
            gw.inner.webhooks.saved_cursor().filter(|&seq| seq <= newest).unwrap_or(newest)
        }
    };
    *after = Some(start);
    let node = admin.server_version().await;
    let mut stream = admin.follow_events(start).await?;
    let mut saved = (start, std::time::Instant::now());
    while let Some(batch) = stream.next_batch().await? {
        let last = batch.last().map(|e| e.seq);
        for event in batch {
            *after = Some(event.seq);
            // Most events go nowhere: nothing is built for them.
            let Some((kind, _)) = crate::events::e2b_type(&event.event) else { continue };
            let targets = gw.inner.webhooks.targets(event.project.as_deref(), kind);
            if targets.is_empty() {
                continue;
            }
            let Some(body) = crate::events::event_json(gw, &node, &event) else { continue };
            let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
            for webhook in targets {
                let delivery = Delivery { webhook, body: body.clone() };
                if tx.try_send(delivery).is_err() {
                    let n = gw.inner.webhooks.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                    tracing::warn!(dropped = n, "webhook queue full; a delivery was dropped");
                }
            }
        }
        // Saved once the batch is queued (at most once a second): after a restart the events
        // since the last save are delivered again, none is skipped.
        if let Some(last) = last {
            if last != saved.0 && saved.1.elapsed() >= CURSOR_EVERY {
                gw.inner.webhooks.save_cursor(last);
                saved = (last, std::time::Instant::now());
            }
        }
    }
    Ok(())
}

async fn send_all(gw: Gateway, mut rx: tokio::sync::mpsc::Receiver<Delivery>) {
    // Only where `[e2b] webhook_targets` allows, checked as each host name resolves.
    let client = match gw.config().webhook_targets.client(SEND_DEADLINE) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "no HTTP client for webhooks; none will be delivered");
            return;
        }
    };
    let senders = Arc::new(tokio::sync::Semaphore::new(SENDERS));
    while let Some(delivery) = rx.recv().await {
        let Ok(permit) = senders.clone().acquire_owned().await else { return };
        let (client, gw) = (client.clone(), gw.clone());
        tokio::spawn(async move {
            let _permit = permit;
            send(&gw, &client, delivery).await;
        });
    }
}

async fn send(gw: &Gateway, client: &reqwest::Client, d: Delivery) {
    let mut wait = FIRST_BACKOFF;
    for attempt in 0..=RETRIES {
        let delivery_id = uuid_v4();
        let sent = client
            .post(&d.webhook.url)
            .header("content-type", "application/json")
            .header("e2b-webhook-id", &d.webhook.id)
            .header("e2b-delivery-id", &delivery_id)
            .header("e2b-signature-version", "v1")
            .header("e2b-signature", signature(&d.webhook.secret, &d.body))
            .body(d.body.clone())
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {
                gw.inner.webhooks.delivered.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(r) => {
                tracing::debug!(webhook = %d.webhook.id, status = %r.status(), attempt, "webhook refused")
            }
            Err(e) => {
                tracing::debug!(webhook = %d.webhook.id, error = %e, attempt, "webhook unreachable")
            }
        }
        if attempt < RETRIES {
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
    }
    gw.inner.webhooks.failed.fetch_add(1, Ordering::Relaxed);
    tracing::info!(webhook = %d.webhook.id, url = %d.webhook.url, "a webhook delivery failed every attempt");
}

fn uuid_v4() -> String {
    let b: [u8; 16] = rand::random();
    let h = hex::encode(b);
    format!("{}-{}-4{}-{}-{}", &h[..8], &h[8..12], &h[13..16], &h[16..20], &h[20..32])
}

/// E2B's lifecycle event types a webhook may ask for.
const TYPES: [&str; 6] = [
    "sandbox.lifecycle.created",
    "sandbox.lifecycle.killed",
    "sandbox.lifecycle.paused",
    "sandbox.lifecycle.resumed",
    "sandbox.lifecycle.updated",
    "sandbox.lifecycle.checkpointed",
];

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct WebhookBody {
    name: Option<String>,
    url: Option<String>,
    events: Option<Vec<String>>,
    signature_secret: Option<String>,
    enabled: Option<bool>,
}

fn check(w: &Webhook) -> Result<(), ApiError> {
    let url = w.url.to_ascii_lowercase();
    if !(url.starts_with("http://") || url.starts_with("https://")) || w.url.len() > 2048 {
        return Err(ApiError::bad("url must be an http(s) URL of at most 2,048 bytes"));
    }
    if w.name.is_empty() || w.name.len() > 256 {
        return Err(ApiError::bad("name must be 1-256 bytes"));
    }
    if w.secret.is_empty() || w.secret.len() > 1024 {
        return Err(ApiError::bad("signatureSecret must be 1-1,024 bytes"));
    }
    if w.events.is_empty() || w.events.iter().any(|e| !TYPES.contains(&e.as_str())) {
        return Err(ApiError::bad(format!("events must name some of {}", TYPES.join(", "))));
    }
    Ok(())
}

/// Refuses a URL whose host `[e2b] webhook_targets` does not allow (checked again at each
/// delivery).
async fn check_target(gw: &Gateway, url: &str) -> Result<(), ApiError> {
    gw.config().webhook_targets.check_url(url).await.map_err(ApiError::bad)
}

fn detail(w: &Webhook) -> Value {
    json!({
        "id": w.id,
        "teamId": crate::events::team_id(w.project.as_deref()),
        "name": w.name,
        "createdAt": rfc3339(w.created_unix_ms),
        "url": w.url,
        "enabled": w.enabled,
        "events": w.events,
    })
}

/// The caller's project (`None`: an admin).
async fn project_of(gw: &Gateway, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let client = caller(gw, headers).await?;
    Ok(client.whoami().await.map_err(ApiError::from_brig)?.project)
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("webhook {id} not found"))
}

/// `POST /events/webhooks`.
pub async fn create(State(gw): State<Gateway>, headers: HeaderMap, body: Bytes) -> ApiResult {
    let project = project_of(&gw, &headers).await?;
    let b: WebhookBody = parse(&body)?;
    let w = Webhook {
        id: uuid_v4(),
        project,
        name: b.name.unwrap_or_default(),
        url: b.url.unwrap_or_default(),
        events: b.events.unwrap_or_default(),
        enabled: b.enabled.unwrap_or(true),
        secret: b.signature_secret.unwrap_or_default(),
        created_unix_ms: unix_ms(),
    };
    check(&w)?;
    check_target(&gw, &w.url).await?;
    let made = gw.inner.webhooks.change(|all| {
        if all.values().filter(|o| o.project == w.project).count() >= MAX_PER_PROJECT {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("at most {MAX_PER_PROJECT} webhooks per project"),
            ));
        }
        all.insert(w.id.clone(), w.clone());
        Ok(detail(&w))
    })?;
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

/// `GET /events/webhooks`.
pub async fn list(State(gw): State<Gateway>, headers: HeaderMap) -> ApiResult {
    let project = project_of(&gw, &headers).await?;
    let all = gw.inner.webhooks.by_id.lock();
    let mine: Vec<Value> = all.values().filter(|w| w.project == project).map(detail).collect();
    Ok(Json(mine).into_response())
}

/// `GET /events/webhooks/{id}`.
pub async fn get_one(
    State(gw): State<Gateway>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
) -> ApiResult {
    let project = project_of(&gw, &headers).await?;
    let all = gw.inner.webhooks.by_id.lock();
    let w = all.get(&id).filter(|w| w.project == project).ok_or_else(|| not_found(&id))?;
    Ok(Json(detail(w)).into_response())
}

/// `PATCH /events/webhooks/{id}`: any of name, url, events, signatureSecret, enabled.
pub async fn update(
    State(gw): State<Gateway>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let project = project_of(&gw, &headers).await?;
    let b: WebhookBody = parse(&body)?;
    if let Some(url) = &b.url {
        check_target(&gw, url).await?;
    }
    let changed = gw.inner.webhooks.change(|all| {
        let w = all.get_mut(&id).filter(|w| w.project == project).ok_or_else(|| not_found(&id))?;
        let mut next = w.clone();
        next.name = b.name.unwrap_or(next.name);
        next.url = b.url.unwrap_or(next.url);
        next.events = b.events.unwrap_or(next.events);
        next.secret = b.signature_secret.unwrap_or(next.secret);
        next.enabled = b.enabled.unwrap_or(next.enabled);
        check(&next)?;
        *w = next;
        Ok::<_, ApiError>(detail(w))
    })?;
    Ok(Json(changed).into_response())
}

/// `DELETE /events/webhooks/{id}`.
pub async fn delete(
    State(gw): State<Gateway>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
) -> ApiResult {
    let project = project_of(&gw, &headers).await?;
    gw.inner.webhooks.change(|all| match all.get(&id) {
        Some(w) if w.project == project => {
            all.remove(&id);
            Ok(())
        }
        _ => Err(not_found(&id)),
    })?;
    Ok(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_e2bs_documented_one() {
        // sha256("secret" + "{}") in base64url without padding, as E2B's docs compute it.
        use base64::Engine;
        let digest = ring::digest::digest(&ring::digest::SHA256, b"secret{}");
        let standard = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
        let expected =
            standard.replace('+', "-").replace('/', "_").trim_end_matches('=').to_string();
        assert_eq!(signature("secret", b"{}"), expected);
        assert!(!signature("secret", b"{}").contains('='));
    }

    #[test]
    fn the_dispatchers_place_outlives_the_gateway() {
        let dir = tempfile::tempdir().expect("dir");
        let hooks = Webhooks::open(dir.path());
        assert_eq!(hooks.saved_cursor(), None, "a gateway that never ran starts at the newest");
        hooks.save_cursor(42);
        assert_eq!(Webhooks::open(dir.path()).saved_cursor(), Some(42));
        std::fs::write(dir.path().join("e2b-webhooks-cursor"), "garbage").expect("write");
        assert_eq!(Webhooks::open(dir.path()).saved_cursor(), None);
    }
}
