//! TLS for Brig: a self-signed certificate per server, pinned by clients.
//!
//! On first start a server writes `cert.der`, `cert.pem` and `key.der` (mode 0600) into its TLS
//! directory and reuses them afterwards. Clients do not use a CA: they pin the certificate's
//! SHA-256 fingerprint (from the cert file or given as hex) and refuse any other certificate,
//! whatever names it carries. Only TLS 1.3 with the ring provider is offered.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::TransportError;

const CERT_DER: &str = "cert.der";
const CERT_PEM: &str = "cert.pem";
const KEY_DER: &str = "key.der";

/// A server's certificate and private key.
pub struct Identity {
    pub cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("fingerprint", &self.fingerprint()).finish()
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TransportError + '_ {
    move |source| TransportError::IdentityIo { path: path.to_owned(), source }
}

impl Identity {
    /// Loads the identity from `dir`, or creates one for `names` (DNS names or IP addresses).
    pub fn load_or_create(dir: &Path, names: &[String]) -> Result<Identity, TransportError> {
        let cert_path = dir.join(CERT_DER);
        let key_path = dir.join(KEY_DER);
        if cert_path.exists() && key_path.exists() {
            let cert = std::fs::read(&cert_path).map_err(io_err(&cert_path))?;
            let key = std::fs::read(&key_path).map_err(io_err(&key_path))?;
            return Ok(Identity { cert: cert.into(), key: key.into() });
        }
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let generated =
            rcgen::generate_simple_self_signed(names.to_vec()).map_err(TransportError::CertGen)?;
        let cert_der = generated.cert.der().to_vec();
        let key_der = generated.signing_key.serialize_der();
        write_private(&key_path, &key_der)?;
        std::fs::write(&cert_path, &cert_der).map_err(io_err(&cert_path))?;
        let pem_path = dir.join(CERT_PEM);
        std::fs::write(&pem_path, generated.cert.pem()).map_err(io_err(&pem_path))?;
        Ok(Identity { cert: cert_der.into(), key: key_der.into() })
    }

    /// Path of the DER certificate inside a TLS directory (what clients pin).
    pub fn cert_path(dir: &Path) -> PathBuf {
        dir.join(CERT_DER)
    }

    /// SHA-256 of the certificate, lowercase hex.
    pub fn fingerprint(&self) -> String {
        hex::encode(Sha256::digest(self.cert.as_ref()))
    }

    /// The key stateless resets are made with, derived from the private key, so a server that
    /// restarts with the same identity can reset its predecessor's connections: a client's
    /// requests on a connection the new process does not know fail at once (and the client
    /// reconnects) instead of waiting out the idle timeout.
    pub fn reset_key(&self) -> Arc<dyn quinn::crypto::HmacKey> {
        let mut derive = Sha256::new();
        derive.update(b"brig quic stateless reset key v1\0");
        derive.update(self.key.secret_pkcs8_der());
        let secret = derive.finalize();
        Arc::new(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret))
    }

    /// A key for the connection ids a server hands out, derived like [`Identity::reset_key`]:
    /// a restarted server must recognise its predecessor's ids as its own kind, or it drops
    /// their packets instead of answering them with a stateless reset.
    pub fn connection_id_key(&self) -> u64 {
        let mut derive = Sha256::new();
        derive.update(b"brig quic connection id key v1\0");
        derive.update(self.key.secret_pkcs8_der());
        let digest = derive.finalize();
        let mut key = [0u8; 8];
        key.copy_from_slice(&digest[..8]);
        u64::from_le_bytes(key)
    }

    /// quinn server configuration for this identity.
    pub fn server_config(&self) -> Result<quinn::ServerConfig, TransportError> {
        let mut tls = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TransportError::Tls)?
            .with_no_client_auth()
            .with_single_cert(vec![self.cert.clone()], PrivateKeyDer::Pkcs8(self.key.clone_key()))
            .map_err(TransportError::Tls)?;
        tls.alpn_protocols = vec![brig_proto::ALPN.to_vec()];
        tls.max_early_data_size = 0;
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
            .map_err(|e| TransportError::Tls(rustls::Error::General(e.to_string())))?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config.transport_config(crate::tuning::transport_config(crate::tuning::End::Server));
        Ok(config)
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TransportError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(bytes).map_err(io_err(path))
}

/// Makes ring the process-wide default rustls provider. Other libraries in the daemon (the S3
/// client) build TLS configurations from the default, which is ambiguous when more than one
/// provider is compiled in. Idempotent.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What a client trusts: exactly one certificate, by SHA-256 fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPin([u8; 32]);

impl CertPin {
    /// From a hex fingerprint (colons allowed, as `openssl x509 -fingerprint` prints).
    pub fn from_hex(hex_str: &str) -> Result<CertPin, TransportError> {
        let clean: String = hex_str.chars().filter(|c| *c != ':').collect();
        let bytes = hex::decode(&clean).map_err(|_| TransportError::BadPin(hex_str.into()))?;
        let arr: [u8; 32] = bytes.try_into().map_err(|_| TransportError::BadPin(hex_str.into()))?;
        Ok(CertPin(arr))
    }

    /// From a certificate file, DER or PEM.
    pub fn from_cert_file(path: &Path) -> Result<CertPin, TransportError> {
        let bytes = std::fs::read(path).map_err(io_err(path))?;
        let der = match std::str::from_utf8(&bytes) {
            Ok(text) if text.contains("-----BEGIN CERTIFICATE-----") => {
                CertificateDer::from_pem_slice(text.as_bytes())
                    .map_err(|_| TransportError::BadPin(path.display().to_string()))?
                    .to_vec()
            }
            _ => bytes,
        };
        Ok(CertPin::from_der(&der))
    }

    pub fn from_der(der: &[u8]) -> CertPin {
        CertPin(Sha256::digest(der).into())
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// quinn client configuration that trusts only this certificate.
    pub fn client_config(&self) -> Result<quinn::ClientConfig, TransportError> {
        let provider = provider();
        let verifier = Arc::new(PinnedVerifier { pin: self.clone(), provider: provider.clone() });
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TransportError::Tls)?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        tls.alpn_protocols = vec![brig_proto::ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
            .map_err(|e| TransportError::Tls(rustls::Error::General(e.to_string())))?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        config.transport_config(crate::tuning::transport_config(crate::tuning::End::Client));
        Ok(config)
    }
}

/// Accepts exactly the pinned certificate; signatures are still verified with ring.
#[derive(Debug)]
struct PinnedVerifier {
    pin: CertPin,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if CertPin::from_der(end_entity.as_ref()) == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "server certificate does not match pinned fingerprint {}",
                self.pin.to_hex()
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_persists_and_pins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Identity::load_or_create(dir.path(), &["localhost".into()]).expect("create");
        let b = Identity::load_or_create(dir.path(), &["localhost".into()]).expect("load");
        assert_eq!(a.fingerprint(), b.fingerprint());
        let from_der = CertPin::from_cert_file(&dir.path().join(CERT_DER)).expect("der pin");
        let from_pem = CertPin::from_cert_file(&dir.path().join(CERT_PEM)).expect("pem pin");
        assert_eq!(from_der, from_pem);
        assert_eq!(from_der.to_hex(), a.fingerprint());
        assert_eq!(CertPin::from_hex(&a.fingerprint()).expect("hex"), from_der);
        assert!(CertPin::from_hex("zz").is_err());
    }
}
