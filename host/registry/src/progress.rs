//! What a pull has done so far, layer by layer: a snapshot that watchers (the node streaming
//! progress to a client, a create waiting on the pull) read whenever they like. A snapshot,
//! not a stream of events, so a slow watcher skips states instead of piling them up.

use std::sync::Arc;

use tokio::sync::watch;

/// A pull's state: its reference and one entry per image layer, bottom first (empty until
/// the manifest is read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullStatus {
    pub reference: String,
    pub layers: Vec<LayerStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerStatus {
    /// The layer blob's digest.
    pub digest: String,
    /// Its compressed size, as the manifest says.
    pub size: u64,
    /// Bytes of it downloaded so far.
    pub downloaded: u64,
    pub state: LayerState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerState {
    /// Waiting for its turn to download.
    Waiting,
    Downloading,
    /// Downloaded and checked; being turned into a Brig layer.
    Converting,
    /// The store had it already: nothing downloaded.
    Reused,
    Done,
}

impl PullStatus {
    /// Compressed bytes downloaded so far and to download in all (reused layers left out).
    pub fn bytes(&self) -> (u64, u64) {
        let fetched = self.layers.iter().filter(|l| l.state != LayerState::Reused);
        fetched.fold((0, 0), |(done, all), l| (done + l.downloaded, all + l.size))
    }
}

/// Where a pull reports its progress; [`Progress::none`] for a pull nobody watches.
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<watch::Sender<PullStatus>>>);

impl Progress {
    pub fn none() -> Progress {
        Progress(None)
    }

    /// A progress and the receiver that watches it.
    pub fn watched() -> (Progress, watch::Receiver<PullStatus>) {
        let (tx, rx) = watch::channel(PullStatus::default());
        (Progress(Some(Arc::new(tx))), rx)
    }

    /// Another receiver of the same progress (`None` for an unwatched one).
    pub fn subscribe(&self) -> Option<watch::Receiver<PullStatus>> {
        self.0.as_ref().map(|tx| tx.subscribe())
    }

    fn modify(&self, f: impl FnOnce(&mut PullStatus)) {
        if let Some(tx) = &self.0 {
            tx.send_modify(f);
        }
    }

    /// The manifest is read: its layers (blob digest, compressed size), all waiting.
    pub(crate) fn start(&self, reference: &str, layers: impl Iterator<Item = (String, u64)>) {
        let layers: Vec<LayerStatus> = layers
            .map(|(digest, size)| LayerStatus {
                digest,
                size,
                downloaded: 0,
                state: LayerState::Waiting,
            })
            .collect();
        self.modify(|s| *s = PullStatus { reference: reference.to_string(), layers });
    }

    pub(crate) fn set_state(&self, layer: usize, state: LayerState) {
        self.modify(|s| {
            if let Some(l) = s.layers.get_mut(layer) {
                l.state = state;
            }
        });
    }

    /// `bytes` of layer `layer` are downloaded (a download that starts over reports 0 again).
    pub(crate) fn downloaded(&self, layer: usize, bytes: u64) {
        self.modify(|s| {
            if let Some(l) = s.layers.get_mut(layer) {
                l.downloaded = bytes;
                l.state = LayerState::Downloading;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_sees_the_latest_state_of_each_layer() {
        let (progress, rx) = Progress::watched();
        let layers = [("sha256:a".to_string(), 10), ("sha256:b".to_string(), 20)];
        progress.start("r", layers.into_iter());
        progress.set_state(0, LayerState::Reused);
        progress.downloaded(1, 5);
        progress.downloaded(1, 20);
        progress.set_state(1, LayerState::Done);
        progress.set_state(7, LayerState::Done);
        let status = rx.borrow().clone();
        assert_eq!(status.reference, "r");
        assert_eq!(status.layers[0].state, LayerState::Reused);
        assert_eq!((status.layers[1].downloaded, status.layers[1].state), (20, LayerState::Done));
        assert_eq!(status.bytes(), (20, 20), "a reused layer is not counted");
        Progress::none().downloaded(0, 1);
    }
}
