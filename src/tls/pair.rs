//! A certificate and its key, from their PEM files to what rustls serves.
//!
//! Every error names the file (and its setting) and says what is wrong in words of its own: a
//! PEM parser's message may quote what it read, and what it read may be the private key.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};

use super::x509;

/// Where the certificate and its key are read from (`server.tls.cert_file`, `key_file`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Why a pair cannot be served. The text names the file; it never holds key material.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

/// Both files as read, before they are parsed.
pub(super) struct RawPair {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl RawPair {
    /// Reads both files (blocking: small files, read on a blocking thread by the reloader).
    pub(super) fn read(files: &TlsFiles) -> Result<Self, TlsError> {
        let read = |setting: &str, path: &Path| {
            std::fs::read(path).map_err(|e| {
                TlsError(format!(
                    "server.tls.{setting} {}: cannot read: {e}",
                    path.display()
                ))
            })
        };
        Ok(Self {
            cert: read("cert_file", &files.cert)?,
            key: read("key_file", &files.key)?,
        })
    }

    /// A digest of both files' bytes: the reloader parses again only when it changes.
    pub(super) fn fingerprint(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update((self.cert.len() as u64).to_be_bytes());
        h.update(&self.cert);
        h.update(&self.key);
        h.finalize().into()
    }

    /// The pair rustls serves, once the certificate parses and the key is the certificate's.
    pub(super) fn parse(
        &self,
        files: &TlsFiles,
        provider: &CryptoProvider,
    ) -> Result<ServedPair, TlsError> {
        let cert_err = |why: String| {
            TlsError(format!(
                "server.tls.cert_file {}: {why}",
                files.cert.display()
            ))
        };
        let key_err = |why: String| {
            TlsError(format!(
                "server.tls.key_file {}: {why}",
                files.key.display()
            ))
        };
        let chain = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| cert_err(pem_problem(&e, "CERTIFICATE")))?;
        let leaf = chain
            .first()
            .ok_or_else(|| cert_err("holds no PEM CERTIFICATE section".into()))?;
        let not_after = x509::not_after(leaf)
            .ok_or_else(|| cert_err("its first certificate is not an X.509 certificate".into()))?;
        let key = PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| key_err(pem_problem(&e, "PRIVATE KEY (PKCS#8, PKCS#1 or SEC1)")))?;
        // rustls's errors here name the problem (an unsupported key type, a bad encoding),
        // never the key's bytes.
        let signer = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| key_err(format!("not a usable private key: {e}")))?;
        let certified = CertifiedKey::new(chain, signer);
        match certified.keys_match() {
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                return Err(key_err(format!(
                    "is not the key of the certificate in {}",
                    files.cert.display()
                )))
            }
            Err(e) => return Err(cert_err(format!("cannot be parsed: {e}"))),
        }
        Ok(ServedPair {
            key: Arc::new(certified),
            not_after,
        })
    }
}

/// A pair that parsed and matched, and when its certificate expires.
pub(super) struct ServedPair {
    pub(super) key: Arc<CertifiedKey>,
    /// The end-entity certificate's not-after, unix seconds.
    pub(super) not_after: i64,
}

/// What is wrong with a PEM file, without quoting any of it.
fn pem_problem(e: &pem::Error, wanted: &str) -> String {
    match e {
        pem::Error::NoItemsFound => format!("holds no PEM {wanted} section"),
        pem::Error::MissingSectionEnd { .. } => "a PEM section has no END line".into(),
        pem::Error::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed".into(),
        pem::Error::Base64Decode(_) => "a PEM section is not valid base64".into(),
        pem::Error::SectionTooLarge => "a PEM section is too large".into(),
        pem::Error::Io(e) => format!("cannot read: {e}"),
        _ => "not valid PEM".into(),
    }
}
