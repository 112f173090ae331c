//! TLS on quotad's own ports (`[server.tls]`): one certificate for the HTTP port and the gRPC
//! port, read again every `reload_interval_ms` and swapped in when its files changed, so that
//! a renewed certificate (cert-manager) is served without a restart.
//!
//! Invariants: what is served is always a pair that parsed and whose key is the certificate's.
//! A changed pair that does not (half-written, mismatched, unreadable) leaves the current one
//! in place and is logged as a warning, once for each content the files had. A connection
//! keeps the certificate it was handshaken with; a new one gets whatever is current then.
//! Nothing here logs or returns key material. The provider is rustls's `ring`, named here
//! rather than installed process-wide.

mod incoming;
mod pair;
mod x509;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

pub use incoming::{tls_incoming, MAX_HANDSHAKES};
use pair::{RawPair, ServedPair};
pub use pair::{TlsError, TlsFiles};

use crate::metrics::Metrics;

/// Hands every handshake the current pair: a load, no lock.
struct Resolver {
    current: ArcSwap<CertifiedKey>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

// By hand: the pair's own Debug would print its signing key's internals.
impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Resolver")
    }
}

/// quotad's certificate: loaded at start-up, served on both ports, reloaded by [`Self::watch`].
pub struct Certificate {
    files: TlsFiles,
    resolver: Arc<Resolver>,
    provider: Arc<CryptoProvider>,
    metrics: Arc<Metrics>,
    /// A digest of the files' bytes as last looked at, whether they were served or refused:
    /// the same bytes are not parsed, nor warned about, twice.
    seen: [u8; 32],
    /// The last read failure, warned about once until the files can be read again.
    unreadable: Option<TlsError>,
}

impl Certificate {
    /// Reads and checks the pair; an error (naming the file) stops start-up.
    pub fn load(files: TlsFiles, metrics: Arc<Metrics>) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let raw = RawPair::read(&files)?;
        let pair = raw.parse(&files, &provider)?;
        metrics.tls_on(pair.not_after);
        log_served(&files, pair.not_after, "TLS certificate loaded");
        Ok(Self {
            seen: raw.fingerprint(),
            resolver: Arc::new(Resolver {
                current: ArcSwap::new(pair.key),
            }),
            files,
            provider,
            metrics,
            unreadable: None,
        })
    }

    /// The HTTP port's configuration. actix-web sets the ALPN protocols itself (`http/1.1`,
    /// and `h2` when built with HTTP/2).
    pub fn http_config(&self) -> rustls::ServerConfig {
        self.server_config(Vec::new())
    }

    /// The gRPC port's acceptor: HTTP/2 only, as gRPC is.
    pub fn grpc_acceptor(&self) -> tokio_rustls::TlsAcceptor {
        Arc::new(self.server_config(vec![b"h2".to_vec()])).into()
    }

    fn server_config(&self, alpn: Vec<Vec<u8>>) -> rustls::ServerConfig {
        let mut c = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports TLS 1.2 and 1.3")
            .with_no_client_auth()
            .with_cert_resolver(self.resolver.clone());
        c.alpn_protocols = alpn;
        c
    }

    /// Looks at the files every `every` until `stop` turns true, and serves a changed pair to
    /// new connections once it parses and matches.
    pub async fn watch(mut self, every: Duration, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is at once: the files were read at start-up.
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                // `look` runs after the select: the guard `wait_for` returns is not `Send`,
                // and must not live across its await.
                _ = stop.wait_for(|s| *s) => return,
            }
            self.look().await;
        }
    }

    /// One look at the files.
    async fn look(&mut self) {
        let files = self.files.clone();
        let raw = match tokio::task::spawn_blocking(move || RawPair::read(&files)).await {
            Ok(Ok(raw)) => raw,
            Ok(Err(e)) => return self.unreadable(e),
            Err(e) => {
                tracing::error!(error = %e, "reading the TLS files failed");
                return;
            }
        };
        self.unreadable = None;
        let seen = raw.fingerprint();
        if seen == self.seen {
            return;
        }
        self.seen = seen;
        match raw.parse(&self.files, &self.provider) {
            Ok(pair) => self.serve(pair),
            Err(e) => {
                self.metrics.tls_reload_refused();
                tracing::warn!(
                    error = %e,
                    "the TLS files changed but cannot be served; new connections keep the \
                     current certificate"
                );
            }
        }
    }

    fn serve(&self, pair: ServedPair) {
        self.resolver.current.store(pair.key);
        self.metrics.tls_reloaded(pair.not_after);
        log_served(&self.files, pair.not_after, "TLS certificate reloaded");
    }

    fn unreadable(&mut self, e: TlsError) {
        if self.unreadable.as_ref() != Some(&e) {
            self.metrics.tls_reload_refused();
            tracing::warn!(
                error = %e,
                "the TLS files cannot be read; new connections keep the current certificate"
            );
            self.unreadable = Some(e);
        }
    }
}

fn log_served(files: &TlsFiles, not_after: i64, what: &str) {
    let expires = chrono::DateTime::from_timestamp(not_after, 0)
        .map_or_else(|| not_after.to_string(), |t| t.to_rfc3339());
    let cert_file = files.cert.display();
    if not_after <= chrono::Utc::now().timestamp() {
        tracing::warn!(%cert_file, not_after = %expires, "{what}; it has expired");
    } else {
        tracing::info!(%cert_file, not_after = %expires, "{what}");
    }
}
