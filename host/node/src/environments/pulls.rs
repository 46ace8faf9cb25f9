//! Registry pulls (`brig_registry::pull`): the node's pulls in flight (a few at once; creates
//! of one unseen image share one pull), and their progress streamed to the client that asked
//! (`PullProgress` replies before the final one).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use brig_images::LayerStore;
use brig_proto::Reply;
use brig_registry::{LayerState, Progress, PullStatus};
use brig_transport::Exchange;
use tokio::sync::watch;

use crate::NodeError;

/// Registry pulls of the node at once; more wait their turn.
const PULLS_AT_ONCE: usize = 4;
/// How often a client asking for progress hears of it (only when something changed).
const PROGRESS_EVERY: Duration = Duration::from_millis(200);
/// How long one progress reply may take to send; a client slower than that hears no more
/// progress (the pull goes on, and its final reply is still sent).
const PROGRESS_SEND_DEADLINE: Duration = Duration::from_secs(2);

/// The prefix of a create's image that names a registry image (`oci:python:3.12-slim`).
pub(crate) const REGISTRY_PREFIX: &str = "oci:";

/// One reference's pull that creates wait on: its turn, and its progress.
struct SharedPull {
    turn: tokio::sync::Mutex<()>,
    progress: Progress,
}

impl Default for SharedPull {
    fn default() -> Self {
        SharedPull { turn: Default::default(), progress: Progress::watched().0 }
    }
}

/// The node's registry pulls: how many run at once, and the ones creates wait on, by
/// reference.
pub(crate) struct PullsInFlight {
    at_once: tokio::sync::Semaphore,
    by_reference: parking_lot::Mutex<HashMap<String, Arc<SharedPull>>>,
}

impl Default for PullsInFlight {
    fn default() -> Self {
        PullsInFlight {
            at_once: tokio::sync::Semaphore::new(PULLS_AT_ONCE),
            by_reference: Default::default(),
        }
    }
}

impl PullsInFlight {
    /// Runs one pull in its turn.
    async fn run(
        &self,
        store: &LayerStore,
        config: &brig_registry::PullConfig,
        reference: &str,
        name: Option<&str>,
        progress: &Progress,
    ) -> Result<brig_registry::Pulled, NodeError> {
        let closed = |_| NodeError::Io {
            what: "registry pull queue".into(),
            source: std::io::Error::other("closed"),
        };
        let _turn = self.at_once.acquire().await.map_err(closed)?;
        Ok(brig_registry::pull(store, config, reference, name, progress).await?)
    }

    /// The progress of the pull creates of `reference` share, while there is one.
    pub(crate) fn watch(&self, reference: &str) -> Option<watch::Receiver<PullStatus>> {
        self.by_reference.lock().get(reference).and_then(|p| p.progress.subscribe())
    }
}

/// The environment of registry image `reference` (`env:pulled/…`), pulled first if the store
/// does not have it; concurrent calls for one reference share the pull.
pub(crate) async fn registry_image(
    store: &LayerStore,
    config: &brig_registry::PullConfig,
    pulls: &PullsInFlight,
    reference: &str,
) -> Result<String, NodeError> {
    let name = brig_registry::default_name(reference);
    let spec = format!("env:{name}");
    if store.expand(&spec).is_ok() {
        return Ok(spec);
    }
    let shared = pulls.by_reference.lock().entry(reference.to_string()).or_default().clone();
    let result = async {
        let _turn = shared.turn.lock().await;
        // A create that waited finds what the first one pulled.
        if store.expand(&spec).is_err() {
            tracing::info!(%reference, "pulling an image a create asked for");
            pulls.run(store, config, reference, Some(&name), &shared.progress).await?;
        }
        Ok::<_, NodeError>(spec)
    }
    .await;
    let mut pulls = pulls.by_reference.lock();
    if pulls.get(reference).is_some_and(|p| Arc::ptr_eq(p, &shared) && Arc::strong_count(p) <= 2) {
        pulls.remove(reference);
    }
    result
}

/// Pulls an image from its registry into the store; with `req.progress`, its progress goes
/// to the client on `exchange` while it runs.
pub(crate) async fn pull(
    store: &LayerStore,
    config: &brig_registry::PullConfig,
    pulls: &PullsInFlight,
    req: brig_proto::ImagePullRequest,
    exchange: &mut Exchange,
) -> Result<Reply, NodeError> {
    let (progress, rx) = match req.progress {
        true => {
            let (progress, rx) = Progress::watched();
            (progress, Some(rx))
        }
        false => (Progress::none(), None),
    };
    let name = req.name.as_deref();
    let work = pulls.run(store, config, &req.reference, name, &progress);
    let pulled = reporting_progress(exchange, || rx.clone(), work).await?;
    let layers = pulled
        .layers
        .into_iter()
        .map(|l| brig_proto::PulledLayer {
            layer: l.layer,
            diff_id: l.diff_id,
            reused: l.reused,
            downloaded_bytes: l.downloaded_bytes,
        })
        .collect();
    let c = pulled.config;
    Ok(Reply::Pulled(brig_proto::PulledImage {
        name: pulled.name,
        manifest_digest: pulled.manifest_digest,
        layers,
        downloaded_bytes: pulled.downloaded_bytes,
        env: c.env.unwrap_or_default(),
        cmd: c.cmd.unwrap_or_default(),
        entrypoint: c.entrypoint.unwrap_or_default(),
        working_dir: c.working_dir.filter(|w| !w.is_empty()),
        user: c.user.filter(|u| !u.is_empty()),
    }))
}

/// Runs `work`, sending the state of the pull `watch` finds (it may find none yet, or ever)
/// on `exchange` as `PullProgress` replies: at most every [`PROGRESS_EVERY`], only when it
/// changed, and once more at the end if it changed since. A client too slow to take a
/// progress reply hears no more of them; the work goes on either way.
pub(crate) async fn reporting_progress<T>(
    exchange: &mut Exchange,
    watch: impl Fn() -> Option<watch::Receiver<PullStatus>>,
    work: impl Future<Output = T>,
) -> T {
    tokio::pin!(work);
    let mut rx: Option<watch::Receiver<PullStatus>> = None;
    let (mut sent, mut listening) = (PullStatus::default(), true);
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let result = loop {
        tokio::select! {
            biased;
            out = &mut work => break out,
            _ = tick.tick(), if listening => {
                if rx.is_none() {
                    rx = watch();
                }
                if let Some(rx) = &rx {
                    listening = send_if_changed(exchange, rx, &mut sent).await;
                }
            }
        }
    };
    // The last state, also when the pull (and its sender) is gone by now.
    if let (Some(rx), true) = (&rx, listening) {
        send_if_changed(exchange, rx, &mut sent).await;
    }
    result
}

/// Sends the pull's state if it differs from what was `sent`; false once the client cannot
/// take it.
async fn send_if_changed(
    exchange: &mut Exchange,
    rx: &watch::Receiver<PullStatus>,
    sent: &mut PullStatus,
) -> bool {
    let status = rx.borrow().clone();
    if status.layers.is_empty() || status == *sent {
        return true;
    }
    let reply = Reply::PullProgress(to_wire(&status));
    *sent = status;
    matches!(tokio::time::timeout(PROGRESS_SEND_DEADLINE, exchange.reply(&reply)).await, Ok(Ok(())))
}

fn to_wire(status: &PullStatus) -> brig_proto::PullProgress {
    use brig_proto::PullLayerState as W;
    let layers = status.layers.iter().map(|l| brig_proto::PullLayerProgress {
        digest: l.digest.clone(),
        size: l.size,
        downloaded: l.downloaded,
        state: match l.state {
            LayerState::Waiting => W::Waiting,
            LayerState::Downloading => W::Downloading,
            LayerState::Converting => W::Converting,
            LayerState::Reused => W::Reused,
            LayerState::Done => W::Done,
        },
    });
    brig_proto::PullProgress { reference: status.reference.clone(), layers: layers.collect() }
}
