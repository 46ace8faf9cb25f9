//! Node tokens: what a client shows a node. The control plane signs them (Ed25519); nodes only
//! verify, with the public key every heartbeat reply carries, so a node can never mint one.
//!
//! ```text
//! bt1.<hex of JSON claims>.<hex of the 64-byte signature over the JSON>
//! ```

use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};

const PREFIX: &str = "bt1.";

/// What a node token grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The node it is good for.
    pub node: u32,
    /// The project whose sandboxes it reaches; `None` with `admin`.
    pub project: Option<String>,
    /// The control plane's own token: every sandbox, creates on the project's behalf.
    pub admin: bool,
    pub expires_unix_ms: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SigningError {
    #[error("the signing key is malformed")]
    BadKey,
    #[error("cannot generate a signing key")]
    Generate,
    #[error("not a node token")]
    Malformed,
    #[error("the token's signature does not match any key of this cluster")]
    BadSignature,
    #[error("the token is for node {0:08x}")]
    WrongNode(u32),
    #[error("the token expired")]
    Expired,
}

/// The control plane's signing key.
pub struct Signer {
    key: Ed25519KeyPair,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({})", hex::encode(self.public_key()))
    }
}

impl Signer {
    /// A fresh key, as PKCS#8 bytes (what the cluster store keeps).
    pub fn generate_pkcs8() -> Result<Vec<u8>, SigningError> {
        let rng = ring::rand::SystemRandom::new();
        Ed25519KeyPair::generate_pkcs8(&rng)
            .map(|doc| doc.as_ref().to_vec())
            .map_err(|_| SigningError::Generate)
    }

    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Signer, SigningError> {
        Ok(Signer { key: Ed25519KeyPair::from_pkcs8(pkcs8).map_err(|_| SigningError::BadKey)? })
    }

    pub fn public_key(&self) -> Vec<u8> {
        self.key.public_key().as_ref().to_vec()
    }

    pub fn sign(&self, claims: &Claims) -> String {
        // Serializing a plain struct of strings and integers cannot fail.
        let json = serde_json::to_vec(claims).unwrap_or_default();
        let sig = self.key.sign(&json);
        format!("{PREFIX}{}.{}", hex::encode(&json), hex::encode(sig.as_ref()))
    }
}

/// Checks a node token against the cluster's public keys, for node `node` at `now_unix_ms`.
pub fn verify(
    token: &str,
    public_keys: &[Vec<u8>],
    node: u32,
    now_unix_ms: u64,
) -> Result<Claims, SigningError> {
    let rest = token.strip_prefix(PREFIX).ok_or(SigningError::Malformed)?;
    let (json, sig) = rest.split_once('.').ok_or(SigningError::Malformed)?;
    let json = hex::decode(json).map_err(|_| SigningError::Malformed)?;
    let sig = hex::decode(sig).map_err(|_| SigningError::Malformed)?;
    let signed_by_us = public_keys
        .iter()
        .any(|key| UnparsedPublicKey::new(&ED25519, key).verify(&json, &sig).is_ok());
    if !signed_by_us {
        return Err(SigningError::BadSignature);
    }
    let claims: Claims = serde_json::from_slice(&json).map_err(|_| SigningError::Malformed)?;
    if claims.node != node {
        return Err(SigningError::WrongNode(claims.node));
    }
    if claims.expires_unix_ms <= now_unix_ms {
        return Err(SigningError::Expired);
    }
    Ok(claims)
}

/// Whether `text` looks like a node token (rather than an access token).
pub fn is_node_token(text: &str) -> bool {
    text.starts_with(PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_and_verifies_and_refuses_tampering() {
        let signer = Signer::from_pkcs8(&Signer::generate_pkcs8().expect("key")).expect("signer");
        let other = Signer::from_pkcs8(&Signer::generate_pkcs8().expect("key")).expect("signer");
        let claims =
            Claims { node: 7, project: Some("team/a".into()), admin: false, expires_unix_ms: 1000 };
        let token = signer.sign(&claims);
        let keys = vec![signer.public_key()];
        assert_eq!(verify(&token, &keys, 7, 999), Ok(claims.clone()));
        assert_eq!(verify(&token, &keys, 8, 999), Err(SigningError::WrongNode(7)));
        assert_eq!(verify(&token, &keys, 7, 1000), Err(SigningError::Expired));
        assert_eq!(verify(&token, &[other.public_key()], 7, 0), Err(SigningError::BadSignature));
        // Rewriting the claims (say, to another project) breaks the signature.
        let forged_claims = Claims { project: Some("team".into()), ..claims };
        let forged = other.sign(&forged_claims);
        let (_, sig) = token.rsplit_once('.').expect("sig");
        let (body, _) = forged.rsplit_once('.').expect("body");
        assert_eq!(verify(&format!("{body}.{sig}"), &keys, 7, 0), Err(SigningError::BadSignature));
        assert_eq!(verify("bt1.zz.yy", &keys, 7, 0), Err(SigningError::Malformed));
        assert!(!is_node_token("abcdef"));
    }
}
