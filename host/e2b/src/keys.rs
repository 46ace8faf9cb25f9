//! Which `X-API-Key`s the gateway serves, and the Brig client each one uses.
//!
//! A key is checked before anything is made for it. The daemon's own token, and every token of
//! its token file when the daemon admits nothing else ([`KeyCheck::TokenFile`], the all-in-one
//! daemon), is served by the gateway's one admin connection: the same rights, no client of its
//! own. Any other key is refused there and then (401) without a connection. Only where brigd
//! may admit keys the gateway cannot know ([`KeyCheck::AskDaemon`], a control plane's project
//! tokens) is an unknown key tried with one connection: a few at a time, a refusal remembered
//! for a while (a bounded negative cache), an admitted key's client kept in a bounded cache
//! that drops the least recently used and those idle too long.
//!
//! Keys are held as their SHA-256 digests, never as text.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use brig_sdk::{Client, ConnectOptions, ErrorCode};

/// Most keys whose clients are kept at once.
pub const MAX_CLIENTS: usize = 256;
/// A kept client unused this long is dropped (its connection closes).
pub const CLIENT_IDLE: Duration = Duration::from_secs(600);
/// Most refused keys remembered, and for how long.
pub const MAX_REFUSED: usize = 4096;
pub const REFUSED_FOR: Duration = Duration::from_secs(60);
/// Unknown keys tried against brigd at once, and how long a key waits for its turn.
pub const VERIFY_AT_ONCE: usize = 4;
pub const VERIFY_WAIT: Duration = Duration::from_secs(5);
/// How often the token file is looked at again (a changed file is re-read).
const TOKEN_FILE_EVERY: Duration = Duration::from_secs(1);
/// Largest token file read.
const TOKEN_FILE_BYTES: u64 = 1 << 20;

/// How the gateway tells a key brigd admits from one it refuses.
#[derive(Debug, Clone)]
pub enum KeyCheck {
    /// brigd admits exactly the tokens of this file (one a line), each with the rights of the
    /// gateway's own token: keys are checked against the file alone.
    TokenFile(PathBuf),
    /// brigd may admit keys the gateway cannot check itself: an unknown key is tried once.
    AskDaemon,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the API key is not a valid Brig access token")]
    Refused,
    #[error("too many unknown API keys are being checked; try again")]
    Busy,
    #[error("brigd: {0}")]
    Unavailable(String),
}

/// What a key is served with.
pub(crate) enum Served {
    /// The gateway's own connection (the key has its rights).
    Admin,
    /// A connection made with the key.
    Own(Client),
}

type Digest = [u8; 32];

/// The digest of a key's secret (`e2b_<hex>` and `<hex>` are one key).
fn digest(text: &str) -> Digest {
    let secret = brig_sdk::token_secret(text);
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref());
    out
}

/// The token file's tokens, read again when the file changes.
struct FileTokens {
    path: PathBuf,
    tokens: Vec<Digest>,
    stamp: Option<(SystemTime, u64)>,
    looked: Option<Instant>,
}

impl FileTokens {
    fn contains(&mut self, key: &Digest) -> bool {
        if self.looked.is_none_or(|at| at.elapsed() >= TOKEN_FILE_EVERY) {
            self.looked = Some(Instant::now());
            self.refresh();
        }
        self.tokens.contains(key)
    }

    fn refresh(&mut self) {
        use std::io::Read as _;
        let stamp =
            std::fs::metadata(&self.path).ok().and_then(|m| Some((m.modified().ok()?, m.len())));
        if stamp.is_some() && stamp == self.stamp {
            return;
        }
        let mut text = String::new();
        let read = std::fs::File::open(&self.path)
            .and_then(|f| f.take(TOKEN_FILE_BYTES).read_to_string(&mut text));
        match read {
            Ok(_) => {
                self.tokens = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(digest)
                    .collect();
                self.stamp = stamp;
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "reading the token file");
                self.tokens.clear();
                self.stamp = None;
            }
        }
    }
}

struct Kept {
    client: Client,
    used: Instant,
}

/// The gateway's keys: the check, the clients of admitted keys, the refused ones.
pub(crate) struct Keys {
    own: Digest,
    file: Option<parking_lot::Mutex<FileTokens>>,
    clients: parking_lot::Mutex<HashMap<Digest, Kept>>,
    refused: parking_lot::Mutex<HashMap<Digest, Instant>>,
    verifying: tokio::sync::Semaphore,
}

impl Keys {
    pub(crate) fn new(check: KeyCheck, own_token: &str) -> Keys {
        let file = match check {
            KeyCheck::TokenFile(path) => Some(parking_lot::Mutex::new(FileTokens {
                path,
                tokens: Vec::new(),
                stamp: None,
                looked: None,
            })),
            KeyCheck::AskDaemon => None,
        };
        Keys {
            own: digest(own_token),
            file,
            clients: Default::default(),
            refused: Default::default(),
            verifying: tokio::sync::Semaphore::new(VERIFY_AT_ONCE),
        }
    }

    /// What `key` is served with, or why it is not; `connect` names where brigd is.
    pub(crate) async fn serve(
        &self,
        key: &str,
        connect: &ConnectOptions,
    ) -> Result<Served, KeyError> {
        let key_digest = digest(key);
        if key_digest == self.own {
            return Ok(Served::Admin);
        }
        if let Some(file) = &self.file {
            return if file.lock().contains(&key_digest) {
                Ok(Served::Admin)
            } else {
                Err(KeyError::Refused)
            };
        }
        if let Some(client) = self.kept(&key_digest) {
            return Ok(Served::Own(client));
        }
        if self.was_refused(&key_digest) {
            return Err(KeyError::Refused);
        }
        let _permit = tokio::time::timeout(VERIFY_WAIT, self.verifying.acquire())
            .await
            .map_err(|_| KeyError::Busy)?
            .map_err(|_| KeyError::Busy)?;
        // Another request may have settled this key while this one waited.
        if let Some(client) = self.kept(&key_digest) {
            return Ok(Served::Own(client));
        }
        if self.was_refused(&key_digest) {
            return Err(KeyError::Refused);
        }
        let mut options = connect.clone();
        options.token = key.trim().to_string();
        match Client::connect(options).await {
            Ok(client) => {
                self.keep(key_digest, client.clone());
                Ok(Served::Own(client))
            }
            Err(e) if e.code() == Some(ErrorCode::Unauthenticated) => {
                self.refuse(key_digest);
                Err(KeyError::Refused)
            }
            Err(e) => Err(KeyError::Unavailable(e.to_string())),
        }
    }

    fn kept(&self, key: &Digest) -> Option<Client> {
        let mut clients = self.clients.lock();
        let kept = clients.get_mut(key)?;
        kept.used = Instant::now();
        Some(kept.client.clone())
    }

    fn keep(&self, key: Digest, client: Client) {
        let mut clients = self.clients.lock();
        clients.retain(|_, k| k.used.elapsed() < CLIENT_IDLE);
        while clients.len() >= MAX_CLIENTS {
            let Some(oldest) = clients.iter().min_by_key(|(_, k)| k.used).map(|(d, _)| *d) else {
                break;
            };
            clients.remove(&oldest);
        }
        clients.insert(key, Kept { client, used: Instant::now() });
    }

    fn was_refused(&self, key: &Digest) -> bool {
        self.refused.lock().get(key).is_some_and(|at| at.elapsed() < REFUSED_FOR)
    }

    fn refuse(&self, key: Digest) {
        let mut refused = self.refused.lock();
        if refused.len() >= MAX_REFUSED {
            refused.retain(|_, at| at.elapsed() < REFUSED_FOR);
            while refused.len() >= MAX_REFUSED {
                let Some(oldest) = refused.iter().min_by_key(|(_, at)| **at).map(|(d, _)| *d)
                else {
                    break;
                };
                refused.remove(&oldest);
            }
        }
        refused.insert(key, Instant::now());
    }

    /// How many clients are kept (for tests).
    #[cfg(test)]
    fn kept_count(&self) -> usize {
        self.clients.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> ConnectOptions {
        // Nothing listens there: a key that got as far as a connection would fail Unavailable.
        ConnectOptions::new(
            "127.0.0.1:9".parse().expect("addr"),
            brig_sdk::Pin::Sha256("00".repeat(32)),
            "own-token",
        )
    }

    #[tokio::test]
    async fn a_token_file_admits_its_tokens_and_refuses_others_without_connecting() {
        let dir = std::env::temp_dir().join(format!("brig-e2b-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("access-token");
        std::fs::write(&path, "own-token\nsecond\n").expect("write");
        let keys = Keys::new(KeyCheck::TokenFile(path.clone()), "own-token");
        let opts = options();
        assert!(matches!(keys.serve("own-token", &opts).await, Ok(Served::Admin)));
        assert!(matches!(keys.serve(" second ", &opts).await, Ok(Served::Admin)));
        for i in 0..1000 {
            let got = keys.serve(&format!("stranger-{i}"), &opts).await;
            assert!(matches!(got, Err(KeyError::Refused)), "key {i}");
        }
        assert_eq!(keys.kept_count(), 0);
        assert!(keys.refused.lock().is_empty(), "a token file needs no negative cache");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn refused_keys_and_kept_clients_stay_bounded() {
        let keys = Keys::new(KeyCheck::AskDaemon, "own");
        for i in 0..(MAX_REFUSED + 100) {
            keys.refuse(digest(&format!("k{i}")));
        }
        assert_eq!(keys.refused.lock().len(), MAX_REFUSED);
        assert!(keys.was_refused(&digest(&format!("k{}", MAX_REFUSED + 99))));
    }
}
