//! The bounds of gRPC connections: how many may be open at once (`grpc.max_connections`; one
//! past it is closed as soon as it is accepted), how many streams it may have open (advertised in the
//! server's first SETTINGS frame, so that a client knows it, and enforced: a stream beyond it
//! is refused), how long one call may take, and how long it may stay silent.
//!
//! Silence is counted on the socket, below HTTP/2: [`IdleIo`] closes a connection that has
//! neither sent nor been sent a byte for `grpc.idle_timeout_ms`. That covers a client that sends
//! nothing, half an HTTP/2 preface, or a preface and no stream, which hyper alone keeps for
//! ever. The server sends no keep-alive PINGs of its own: their answers would count as traffic
//! and keep every idle connection open. A call in flight is never cut by it: the idle timeout
//! is longer than a call may take (`server.request_timeout_ms`, checked at start), and the
//! answer is traffic.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

/// The most streams (calls) open at once on one connection: advertised as
/// `SETTINGS_MAX_CONCURRENT_STREAMS`; a client that opens more gets them refused
/// (`REFUSED_STREAM`), so 50k header-only streams cost one connection no more than this many.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 100;

/// The gRPC server with its connection bounds; `call_timeout` is `server.request_timeout_ms`.
pub fn server(call_timeout: Duration) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .timeout(call_timeout)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .concurrency_limit_per_connection(MAX_STREAMS_PER_CONNECTION as usize)
}

/// A connection closed after `idle` without a byte either way (see the module comment), holding
/// one of the open connections' places while it lives.
pub struct IdleIo<IO> {
    io: IO,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    _place: OwnedSemaphorePermit,
}

impl<IO> IdleIo<IO> {
    /// Wraps a connection just accepted when `places` has room for it (none: the connection is
    /// dropped, closed); its silence is counted from now. Needs the runtime.
    pub fn admit(io: IO, idle: Duration, places: &Arc<Semaphore>) -> Option<Self> {
        let Ok(place) = places.clone().try_acquire_owned() else {
            tracing::debug!("gRPC connection refused: grpc.max_connections are open");
            return None;
        };
        Some(IdleIo {
            io,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            _place: place,
        })
    }

    /// Traffic: the connection's silence starts again.
    fn heard(&mut self) {
        let at = Instant::now() + self.idle;
        self.deadline.as_mut().reset(at);
    }

    /// Whether the connection has been silent for `idle`; wakes the task when it will have.
    fn silent(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

fn idle_error() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "gRPC connection idle")
}

impl<IO: AsyncRead + Unpin> AsyncRead for IdleIo<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.heard();
                Poll::Ready(Ok(()))
            }
            // hyper always has a read pending on an HTTP/2 connection: here silence is seen.
            Poll::Pending if this.silent(cx) => Poll::Ready(Err(idle_error())),
            other => other,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for IdleIo<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            if n > 0 {
                this.heard();
            }
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for IdleIo<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_silent_connection_fails_at_the_idle_timeout_and_traffic_defers_it() {
        let idle = Duration::from_millis(300);
        let (mut client, server) = tokio::io::duplex(64);
        let places = Arc::new(Semaphore::new(1));
        let mut server = IdleIo::admit(server, idle, &places).unwrap();
        let (_, other) = tokio::io::duplex(64);
        assert!(
            IdleIo::admit(other, idle, &places).is_none(),
            "one place, taken"
        );
        let mut buf = [0u8; 8];
        tokio::time::sleep(idle / 2).await;
        client.write_all(b"x").await.unwrap();
        assert_eq!(server.read(&mut buf).await.unwrap(), 1);
        let heard = Instant::now();
        let e = server.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(heard.elapsed() >= idle, "{:?}", heard.elapsed());
    }
}
