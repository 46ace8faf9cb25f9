//! Access tokens: 256-bit random secrets, stored hex-encoded one per line in a mode-0600 file,
//! written as E2B API keys (`e2b_<hex>`; with or without the prefix they are one token).
//!
//! On first start the file is created with one token; operators may add lines to admit more
//! clients and remove lines to revoke them (re-read on [`AccessTokens::reload`]). Comparison is
//! constant-time so a client cannot learn a token byte by byte from response timing.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use brig_proto::hello::token_secret;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read or write token file {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("token file {0} holds no token")]
    Empty(PathBuf),
}

/// The set of tokens that admit clients.
#[derive(Debug)]
pub struct AccessTokens {
    path: PathBuf,
    tokens: RwLock<Vec<String>>,
}

impl AccessTokens {
    /// Loads the token file, creating it with one fresh token if it does not exist.
    pub fn load_or_create(path: &Path) -> Result<AccessTokens, TokenError> {
        let io = |source| TokenError::Io { path: path.to_owned(), source };
        if !path.exists() {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io)?;
            }
            let token = brig_proto::hello::e2b_key(&hex::encode(rand::random::<[u8; 32]>()));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(io)?;
            writeln!(f, "{token}").map_err(io)?;
            tracing::info!(path = %path.display(), "created access token");
        }
        let tokens = read_tokens(path)?;
        Ok(AccessTokens { path: path.to_owned(), tokens: RwLock::new(tokens) })
    }

    /// Re-reads the token file.
    pub fn reload(&self) -> Result<(), TokenError> {
        let fresh = read_tokens(&self.path)?;
        if let Ok(mut tokens) = self.tokens.write() {
            *tokens = fresh;
        }
        Ok(())
    }

    /// The first token (what local clients use).
    pub fn primary(&self) -> Option<String> {
        self.tokens.read().ok().and_then(|t| t.first().cloned())
    }

    /// Whether `candidate` is one of the tokens.
    pub fn verify(&self, candidate: &str) -> bool {
        let Ok(tokens) = self.tokens.read() else {
            return false;
        };
        // Check every token so timing does not reveal which one (if any) matched.
        let candidate = token_secret(candidate);
        tokens.iter().fold(false, |found, t| {
            constant_time_eq(token_secret(t).as_bytes(), candidate.as_bytes()) | found
        })
    }
}

fn read_tokens(path: &Path) -> Result<Vec<String>, TokenError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| TokenError::Io { path: path.to_owned(), source })?;
    let tokens: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    if tokens.is_empty() {
        return Err(TokenError::Empty(path.to_owned()));
    }
    Ok(tokens)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_once_and_verifies() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("access-token");
        let a = AccessTokens::load_or_create(&path).expect("create");
        let token = a.primary().expect("token");
        let secret = token.strip_prefix("e2b_").expect("an E2B API key");
        assert!(secret.len() == 64 && secret.bytes().all(|b| b.is_ascii_hexdigit()));
        let b = AccessTokens::load_or_create(&path).expect("load");
        assert_eq!(b.primary(), Some(token.clone()));
        assert!(b.verify(&token) && b.verify(secret), "with and without the prefix");
        assert!(!b.verify(""));
        assert!(!b.verify(&token[1..]) && !b.verify(&secret[1..]));
        assert!(!b.verify(&format!("e2b_e2b_{secret}")));
        let mode = std::fs::metadata(&path)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()));
        assert_eq!(mode.expect("mode") & 0o777, 0o600);
    }
}
