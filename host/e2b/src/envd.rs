//! What every envd request shares: which sandbox (the `E2b-Sandbox-Id` header), whether the
//! caller may touch it (`X-Access-Token`), as whom (`Authorization: Basic base64("user:")`, or
//! a `username` query parameter on `/files`), and how Brig's errors read as envd's.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use brig_sdk::{ErrorCode, Sandbox, SandboxState};

use crate::connect::{Code, ConnectError};
use crate::gateway::header;
use crate::Gateway;

/// The sandbox id E2B's SDKs use in debug mode (`E2B_DEBUG=true`), where they create nothing.
pub const DEBUG_SANDBOX_ID: &str = "debug_sandbox_id";

/// The user a request runs as when it names none (E2B's default).
pub const DEFAULT_USER: &str = "user";

/// Who an envd request acts as, and that user's home (where relative paths start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvdUser {
    pub name: String,
}

impl EnvdUser {
    pub fn named(name: Option<&str>) -> Result<EnvdUser, ConnectError> {
        let name = name.map(str::trim).filter(|n| !n.is_empty()).unwrap_or(DEFAULT_USER);
        let valid = name.len() <= 32
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !valid {
            return Err(ConnectError::new(Code::InvalidArgument, format!("bad user {name:?}")));
        }
        Ok(EnvdUser { name: name.to_string() })
    }

    /// From `Authorization: Basic base64("name:")`.
    pub fn from_headers(headers: &HeaderMap) -> Result<EnvdUser, ConnectError> {
        let Some(value) = header(headers, "authorization") else { return EnvdUser::named(None) };
        let encoded = value.strip_prefix("Basic ").ok_or_else(|| {
            ConnectError::new(Code::Unauthenticated, "Authorization is not Basic")
        })?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|_| ConnectError::new(Code::Unauthenticated, "Authorization is not base64"))?;
        let text = String::from_utf8_lossy(&decoded);
        EnvdUser::named(Some(text.split(':').next().unwrap_or("")))
    }

    pub fn is_root(&self) -> bool {
        self.name == "root"
    }

    pub fn home(&self) -> String {
        if self.is_root() {
            "/root".into()
        } else {
            format!("/home/{}", self.name)
        }
    }

    /// `path` as an absolute path: relative ones (and `~/…`) start at the user's home.
    pub fn resolve(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_string()
        } else if path == "~" || path.is_empty() {
            self.home()
        } else if let Some(rest) = path.strip_prefix("~/") {
            format!("{}/{rest}", self.home())
        } else {
            format!("{}/{path}", self.home())
        }
    }

    /// The Brig user a command runs as (`None` is root).
    pub fn brig_user(&self) -> Option<String> {
        (!self.is_root()).then(|| self.name.clone())
    }
}

/// Longest `E2b-Sandbox-Id` looked at. Brig's sandbox ids are 28 bytes (`sb-`, 8 and 16 hex
/// digits: `brig_core::SandboxId`), the debug layout's [`DEBUG_SANDBOX_ID`] 16.
pub const MAX_SANDBOX_ID_BYTES: usize = 64;

/// The sandbox an envd request names: its `E2b-Sandbox-Id` header, else the host
/// `49983-<id>.<domain>` E2B's SDKs address a sandbox's envd at (and its signed file URLs
/// carry) when `E2B_SANDBOX_URL` is not set.
pub fn sandbox_id(headers: &HeaderMap) -> Option<&str> {
    header(headers, "e2b-sandbox-id").or_else(|| {
        let host = header(headers, "host")?;
        let (port, rest) = host.split_once('-')?;
        let id = rest.split(['.', ':']).next()?;
        (port.parse::<u16>().ok()? == crate::ENVD_PORT && !id.is_empty()).then_some(id)
    })
}

/// The sandbox id of an envd request whose caller may touch that sandbox: the id is short
/// enough to be one and `X-Access-Token` is its envd access token (the debug layout's
/// [`DEBUG_SANDBOX_ID`] needs none, as a local envd). Checked before anything else is done
/// for the request (its body read, a place of its sandbox's share taken); a missing or wrong
/// token is `unauthenticated` (401). A signed file URL is admitted by [`signed_file_url`].
pub fn authorized<'h>(gw: &Gateway, headers: &'h HeaderMap) -> Result<&'h str, ConnectError> {
    let id = sandbox_id(headers)
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "no E2b-Sandbox-Id header"))?;
    if id.len() > MAX_SANDBOX_ID_BYTES {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("E2b-Sandbox-Id is {} bytes long, not a sandbox id", id.len()),
        ));
    }
    if gw.debug_layout && id == DEBUG_SANDBOX_ID {
        return Ok(id);
    }
    let token = header(headers, "x-access-token").unwrap_or("");
    if !gw.envd_token_ok(id, token) {
        return Err(ConnectError::new(
            Code::Unauthenticated,
            format!("no valid X-Access-Token for sandbox {id}"),
        ));
    }
    Ok(id)
}

/// What a signed `/files` URL carries (E2B's `download_url`/`upload_url` for a secured sandbox).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct SignedQuery {
    pub path: Option<String>,
    pub username: Option<String>,
    pub signature: Option<String>,
    pub signature_expiration: Option<u64>,
}

/// A file URL's signature as E2B's SDK makes it (`e2b/sandbox/signature.py`): `v1_` and the
/// unpadded base64 of SHA-256 over `path:operation:user:token[:expiration]`.
pub fn file_signature(
    token: &str,
    path: &str,
    operation: &str,
    user: &str,
    expiration: Option<u64>,
) -> String {
    let raw = match expiration {
        Some(at) => format!("{path}:{operation}:{user}:{token}:{at}"),
        None => format!("{path}:{operation}:{user}:{token}"),
    };
    let digest = ring::digest::digest(&ring::digest::SHA256, raw.as_bytes());
    format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest.as_ref()))
}

/// The sandbox of a signed `/files` request (`GET` reads, `POST` writes) whose signature is
/// that sandbox's and has not expired; `unauthenticated` otherwise. The signature stands for
/// the access token: the caller holds a URL its token made.
pub fn signed_file_url<'h>(
    gw: &Gateway,
    headers: &'h HeaderMap,
    write: bool,
    query: &SignedQuery,
) -> Result<&'h str, ConnectError> {
    let refused = |why: &str| Err(ConnectError::new(Code::Unauthenticated, why.to_string()));
    let Some(signature) = query.signature.as_deref() else {
        return refused("no X-Access-Token and no signature");
    };
    let id = sandbox_id(headers)
        .filter(|id| id.len() <= MAX_SANDBOX_ID_BYTES)
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "no E2b-Sandbox-Id header"))?;
    if let Some(at) = query.signature_expiration {
        if at < crate::api::unix_ms() / 1000 {
            return refused("the signed URL expired");
        }
    }
    let operation = if write { "write" } else { "read" };
    let path = query.path.as_deref().unwrap_or_default();
    let user = query.username.as_deref().unwrap_or_default();
    let token = gw.envd_token(id);
    let expected = file_signature(&token, path, operation, user, query.signature_expiration);
    // Compared in constant time: every byte is looked at, whatever the first difference.
    let (a, b) = (expected.as_bytes(), signature.as_bytes());
    let same = a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
    if !same {
        return refused("the URL's signature is not this sandbox's");
    }
    Ok(id)
}

/// The sandbox an envd request is for, once its access token is checked ([`authorized`]) and
/// it is running. A sandbox that is gone or paused answers as envd's proxy does ("… was not
/// found", 502), which the SDKs read as "not running"; a missing or wrong token is
/// `unauthenticated`.
pub async fn sandbox(gw: &Gateway, headers: &HeaderMap) -> Result<Sandbox, ConnectError> {
    let id = authorized(gw, headers)?;
    if gw.debug_layout && id == DEBUG_SANDBOX_ID {
        let id = gw.debug_sandbox().await?;
        return Ok(gw.admin().await?.sandbox(&id));
    }
    let sb = gw.admin().await?.sandbox(id);
    if gw.inner.running.fresh(id) {
        return Ok(sb);
    }
    match sb.status().await {
        Ok(info) if info.state == SandboxState::Running => {
            gw.inner.running.mark(id);
            Ok(sb)
        }
        // Paused by its timeout and made to resume on a request (E2B's auto-resume).
        Ok(info) if info.state == SandboxState::Paused && crate::auto_resume::wanted(&info) => {
            crate::auto_resume::resume(gw, &sb, &info).await.map_err(|e| sandbox_error(id, e))?;
            Ok(sb)
        }
        Ok(_) => Err(ConnectError::SandboxGone(id.to_string())),
        Err(e) => Err(sandbox_error(id, e)),
    }
}

/// A Brig error on a request about the sandbox itself.
pub fn sandbox_error(id: &str, e: brig_sdk::Error) -> ConnectError {
    match e.code() {
        Some(ErrorCode::NotFound | ErrorCode::Expired | ErrorCode::SandboxLost) => {
            ConnectError::SandboxGone(id.to_string())
        }
        Some(ErrorCode::BadRequest) => ConnectError::SandboxGone(id.to_string()),
        _ => brig_error(e),
    }
}

/// A Brig error on an operation inside a running sandbox (a missing file is `not_found`).
pub fn brig_error(e: brig_sdk::Error) -> ConnectError {
    let code = match e.code() {
        Some(ErrorCode::NotFound) => Code::NotFound,
        Some(ErrorCode::AlreadyExists) => Code::AlreadyExists,
        Some(ErrorCode::BadRequest) => Code::InvalidArgument,
        Some(ErrorCode::PermissionDenied) => Code::PermissionDenied,
        Some(ErrorCode::Unauthenticated) => Code::Unauthenticated,
        Some(ErrorCode::ResourceExhausted | ErrorCode::QuotaExceeded | ErrorCode::TooLarge) => {
            Code::ResourceExhausted
        }
        Some(ErrorCode::Unavailable) => Code::Unavailable,
        Some(ErrorCode::Conflict) => Code::FailedPrecondition,
        _ => Code::Internal,
    };
    ConnectError::new(code, brig_message(&e))
}

/// What a Brig error says: the server's own message, or the client-side failure.
pub fn brig_message(e: &brig_sdk::Error) -> String {
    match e {
        brig_sdk::Error::Server { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// `GET /health`: envd's (with `E2b-Sandbox-Id`: 204 while the sandbox runs, 502 "not found"
/// otherwise) or the API's own (200).
pub async fn health(State(gw): State<Gateway>, headers: HeaderMap) -> Response {
    if header(&headers, "e2b-sandbox-id").is_none() {
        return (StatusCode::OK, "Health check successful").into_response();
    }
    match sandbox(&gw, &headers).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_come_from_basic_auth_and_paths_start_at_their_home() {
        let mut headers = HeaderMap::new();
        assert_eq!(EnvdUser::from_headers(&headers).expect("default").name, "user");
        headers.insert("authorization", "Basic cm9vdDo=".parse().expect("value"));
        let root = EnvdUser::from_headers(&headers).expect("root");
        assert!(root.is_root());
        assert_eq!(root.resolve("a/b"), "/root/a/b");
        assert_eq!(root.brig_user(), None);
        let user = EnvdUser::named(Some("user")).expect("user");
        assert_eq!(user.resolve("~/x"), "/home/user/x");
        assert_eq!(user.resolve("/etc/x"), "/etc/x");
        assert_eq!(user.resolve(""), "/home/user");
        assert!(EnvdUser::named(Some("a b")).is_err());
        assert!(EnvdUser::named(Some("../../etc")).is_err());
        headers.insert("authorization", "Bearer x".parse().expect("value"));
        assert!(EnvdUser::from_headers(&headers).is_err());
    }

    #[test]
    fn signatures_are_e2bs_and_the_sandbox_comes_from_the_header_or_the_host() {
        // Vectors from E2B's `get_signature` (e2b/sandbox/signature.py).
        let with_expiry =
            file_signature("tok", "/home/user/a.txt", "read", "user", Some(1_700_000_000));
        assert_eq!(with_expiry, "v1_rjyaqcqTmWCotSjgdIM5sPngpduJ8ZZz/orD09SpFng");
        assert_eq!(
            file_signature("tok", "/a", "write", "", None),
            "v1_Q5P1lR77D42gAO/ZDcvuB7/fk7tghA70YKm+MnTldA4"
        );
        let mut headers = HeaderMap::new();
        headers.insert("host", "49983-sb-1.e2b.local:3000".parse().expect("value"));
        assert_eq!(sandbox_id(&headers), Some("sb-1"));
        headers.insert("host", "8000-sb-1.e2b.local".parse().expect("value"));
        assert_eq!(sandbox_id(&headers), None, "another port is not envd");
        headers.insert("e2b-sandbox-id", "sb-2".parse().expect("value"));
        assert_eq!(sandbox_id(&headers), Some("sb-2"));
    }
}
