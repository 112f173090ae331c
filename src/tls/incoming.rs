//! The gRPC port's connections over TLS: the stream tonic serves from.
//!
//! One task accepts TCP connections; each handshake runs in a task of its own under a deadline,
//! so a client that connects and never speaks holds one task for the deadline and no one else
//! waits for it. At most [`MAX_HANDSHAKES`] run at once: past that, accepting waits (the
//! kernel's backlog holds new connections) rather than handshakes piling up without bound. A
//! failed or late handshake is logged at debug and dropped; nothing stops the accept loop but
//! tonic dropping the stream at shutdown.

use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Handshakes in progress at once on the gRPC port.
pub const MAX_HANDSHAKES: usize = 256;
/// Connections handshaken and not yet taken by tonic (which takes them at once).
const READY: usize = 64;

/// The TLS connections of `listener`, each handshaken within `deadline`. Needs a tokio runtime.
pub fn tls_incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    deadline: Duration,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, Infallible>> + Send + 'static {
    let (tx, mut rx) = mpsc::channel(READY);
    tokio::spawn(accept_loop(listener, acceptor, deadline, tx));
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|c| c.map(Ok)))
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    deadline: Duration,
    ready: mpsc::Sender<TlsStream<TcpStream>>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        // Either wait ends when tonic has dropped the stream: the listener closes with this task.
        let permit = tokio::select! {
            _ = ready.closed() => return,
            p = handshakes.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let (tcp, peer) = tokio::select! {
            _ = ready.closed() => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(deadline, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    drop(permit);
                    // Fails only once tonic has stopped: the connection is dropped.
                    let _ = ready.send(tls).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "gRPC TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, ?deadline, "gRPC TLS handshake timed out"),
            }
        });
    }
}

/// An accept that failed: a connection reset before it was taken is the client's business;
/// anything else (out of file descriptors) is the operator's, and is not retried in a hot loop.
async fn accept_failed(e: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
    if matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted) {
        tracing::debug!(error = %e, "gRPC accept failed");
    } else {
        tracing::warn!(error = %e, "gRPC accept failed; retrying in 100ms");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
