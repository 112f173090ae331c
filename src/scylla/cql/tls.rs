//! TLS to the nodes: the rustls client configuration the driver connects with, built from the
//! `store.tls_*` files, and the words a refused handshake is explained in.
//!
//! The driver names each node by its IP address: a node's certificate must carry that address
//! (an `IP:` subject alternative name) unless `store.tls_server_name` gives the DNS name every
//! node's certificate carries instead, or `store.tls_verify_hostname = false` drops the name
//! check (the chain is still verified against `store.tls_ca_file`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// Where the TLS material is and how strictly a node's name is checked.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsFiles {
    /// PEM bundle of the CAs a node's certificate must chain to.
    pub ca_file: PathBuf,
    /// quotad's client certificate chain and key (PEM), for nodes that require one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Off: any name, the chain still verified.
    pub verify_hostname: bool,
    /// The DNS name each node's certificate must carry, instead of the node's address.
    pub server_name: Option<String>,
}

/// The client configuration, and what the last refused node certificate was refused for.
#[derive(Clone)]
pub struct StoreTls {
    pub config: Arc<ClientConfig>,
    refusal: Arc<Mutex<Option<String>>>,
}

impl fmt::Debug for StoreTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreTls")
    }
}

impl StoreTls {
    /// Reads the files; a message names the file and what is wrong with it, never its content.
    pub fn load(files: &TlsFiles) -> Result<StoreTls, String> {
        let mut roots = RootCertStore::empty();
        let cas = read_certs(&files.ca_file, "tls_ca_file")?;
        for ca in cas {
            roots.add(ca).map_err(|e| {
                format!(
                    "tls_ca_file: {}: not a usable CA certificate: {e}",
                    files.ca_file.display()
                )
            })?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| format!("tls_ca_file: {}: {e}", files.ca_file.display()))?;
        let name = match &files.server_name {
            Some(n) => Some(
                ServerName::try_from(n.clone())
                    .map_err(|_| format!("tls_server_name: {n:?} is not a host name"))?,
            ),
            None => None,
        };
        let refusal = Arc::new(Mutex::new(None));
        let verifier = Arc::new(NodeVerifier {
            inner,
            name,
            verify_name: files.verify_hostname,
            refusal: refusal.clone(),
        });
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("tls: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &files.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = read_certs(cert, "tls_cert_file")?;
                let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    format!("tls_key_file: {}: no PEM private key: {e}", key.display())
                })?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                    format!(
                        "tls_key_file: {} does not go with tls_cert_file {}: {e}",
                        key.display(),
                        cert.display()
                    )
                })?
            }
        };
        Ok(StoreTls {
            config: Arc::new(config),
            refusal,
        })
    }

    /// Why the last node certificate was refused, in words (taken: the next failure starts
    /// afresh).
    pub fn take_refusal(&self) -> Option<String> {
        self.refusal.lock().ok()?.take()
    }
}

fn read_certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{key}: {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{key}: {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{key}: {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certs)
}

/// rustls' own verification of the chain and the name, with the name replaced or dropped as
/// configured; a refusal is written down for the start-up message.
#[derive(Debug)]
struct NodeVerifier {
    inner: Arc<WebPkiServerVerifier>,
    name: Option<ServerName<'static>>,
    verify_name: bool,
    refusal: Arc<Mutex<Option<String>>>,
}

impl ServerCertVerifier for NodeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let name = self.name.as_ref().unwrap_or(server_name);
        let res =
            self.inner
                .verify_server_cert(end_entity, intermediates, name, ocsp_response, now);
        match res {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.verify_name => Ok(ServerCertVerified::assertion()),
            Err(e) => {
                if let Ok(mut r) = self.refusal.lock() {
                    *r = Some(describe(&e, server_name, name));
                }
                Err(e)
            }
            ok => ok,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

fn describe(e: &rustls::Error, node: &ServerName<'_>, checked: &ServerName<'_>) -> String {
    let node = node.to_str();
    let why = match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => {
                "it is not signed by a CA of store.tls_ca_file".to_owned()
            }
            CertificateError::ExpiredContext { not_after, .. } => {
                format!("it has expired (not valid after {})", utc(not_after))
            }
            CertificateError::Expired => "it has expired".to_owned(),
            CertificateError::NotValidYetContext { not_before, .. } => {
                format!("it is not valid yet (not before {})", utc(not_before))
            }
            CertificateError::NotValidYet => "it is not valid yet".to_owned(),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!(
                    "it does not name {} (store.tls_server_name gives the name the nodes' \
                     certificates carry; store.tls_verify_hostname = false skips the name check)",
                    checked.to_str()
                )
            }
            other => format!("{other:?}"),
        },
        other => other.to_string(),
    };
    format!("the certificate of node {node} was refused: {why}")
}

fn utc(t: &UnixTime) -> String {
    i64::try_from(t.as_secs())
        .ok()
        .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
        .map_or_else(|| format!("{} (UNIX)", t.as_secs()), |d| d.to_rfc3339())
}

/// A failed connection explained: the refused certificate, or the refused credentials, or the
/// driver's own words. `tls` is the configured TLS, if any.
pub fn explain_connect_error(driver: &str, tls: Option<&StoreTls>) -> String {
    if let Some(why) = tls.and_then(StoreTls::take_refusal) {
        return format!("{why} ({driver})");
    }
    let lower = driver.to_ascii_lowercase();
    if lower.contains("authenticat") || lower.contains("credentials") {
        return format!(
            "the cluster refused the login: check store.username and store.password \
             (or their _file forms) ({driver})"
        );
    }
    if tls.is_some()
        && [
            "certificaterequired",
            "badcertificate",
            "unknownca",
            "alert",
        ]
        .iter()
        .any(|a| lower.contains(a))
    {
        return format!(
            "the node refused quotad's TLS client certificate (store.tls_cert_file, \
             store.tls_key_file): ({driver})"
        );
    }
    if tls.is_none() && (lower.contains("closed") || lower.contains("reset")) {
        return format!(
            "{driver} (if the nodes require client-to-node encryption, set store.tls_ca_file)"
        );
    }
    driver.to_owned()
}
