//! One HTTP/1.1 connection's stream, read only as fast as its answers are taken.
//!
//! actix-http reads a connection as long as bytes come (up to 128 KiB ahead) and decodes every
//! request in what it read, whether or not the peer takes the answers: a peer that pipelines
//! requests and reads nothing makes it hold thousands of parsed requests. [`Gated`] sits between
//! the socket (or the TLS stream) and actix-http and stops handing it bytes:
//!
//! - once more than [`HEADS_AHEAD`] request heads came in since an answer was last written, until
//!   one is;
//! - while the peer takes no answer (the last write was refused for want of room), until a write
//!   goes through.
//!
//! And a peer that takes no byte of an answer for the stall limit has the connection closed:
//! the write fails with `TimedOut`, which ends the connection in actix-http.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{sleep, Instant, Sleep};

/// How many request heads a connection may send past its last answer before quotad stops
/// reading it. actix-http itself queues up to 16 decoded requests.
pub const HEADS_AHEAD: u32 = 32;

/// A stream whose reads wait for its writes (see the module).
pub struct Gated<T> {
    io: T,
    /// Request heads (`\r\n\r\n`) read since the last write went through.
    heads: u32,
    /// How much of `\r\n\r\n` the bytes read so far end with.
    matched: u8,
    /// The last write was refused for want of room.
    stalled: bool,
    /// A read that waits on the gate, woken when a write goes through.
    reader: Option<Waker>,
    stall_limit: Duration,
    /// Fires `stall_limit` after the first refused write of a stall; made at the first stall.
    stall_timer: Option<Pin<Box<Sleep>>>,
}

impl<T> Gated<T> {
    /// `io`, closed when its peer takes no byte of an answer for `stall_limit`.
    pub fn new(io: T, stall_limit: Duration) -> Gated<T> {
        Gated {
            io,
            heads: 0,
            matched: 0,
            stalled: false,
            reader: None,
            stall_limit,
            stall_timer: None,
        }
    }

    fn open(&self) -> bool {
        !self.stalled && self.heads <= HEADS_AHEAD
    }

    /// Counts the ends of request heads in bytes just read.
    fn saw(&mut self, bytes: &[u8]) {
        const END: &[u8; 4] = b"\r\n\r\n";
        for &b in bytes {
            if b == END[self.matched as usize] {
                self.matched += 1;
                if self.matched == 4 {
                    self.heads = self.heads.saturating_add(1);
                    self.matched = 0;
                }
            } else {
                self.matched = u8::from(b == b'\r');
            }
        }
    }

    /// A write went through: the peer takes answers, so reading may go on.
    fn wrote(&mut self) {
        self.heads = 0;
        self.stalled = false;
        if let Some(w) = self.reader.take() {
            w.wake();
        }
    }

    /// A write was refused for want of room: `Pending` while the stall is younger than its
    /// limit (the timer wakes the writer then), the error that closes the connection after.
    fn refused<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let deadline = Instant::now() + self.stall_limit;
        if !self.stalled {
            self.stalled = true;
            match &mut self.stall_timer {
                Some(t) => t.as_mut().reset(deadline),
                None => self.stall_timer = Some(Box::pin(sleep(self.stall_limit))),
            }
        }
        let timer = self.stall_timer.as_mut().expect("set when the stall began");
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer took no answer within the stall limit",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Gated<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.open() {
            this.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let filled = buf.filled();
            this.saw(&filled[before..]);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Gated<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    this.wrote();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending => this.refused(cx),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Pending => this.refused(cx),
            Poll::Ready(Ok(())) => {
                // Under TLS the bytes of an answer may go out on a flush alone, with no write.
                if this.stalled {
                    this.wrote();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that always has a byte to read, takes every write, and refuses its first flush.
    struct Stream {
        flushes_refused: u32,
    }

    impl AsyncRead for Stream {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            buf.put_slice(b"x");
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Stream {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(data.len()))
        }
        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            if self.flushes_refused == 0 {
                self.flushes_refused += 1;
                return Poll::Pending;
            }
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_flush_that_goes_through_after_a_stall_opens_reading_again() {
        let mut g = Gated::new(Stream { flushes_refused: 0 }, Duration::from_secs(60));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut space = [0u8; 8];
        let mut read = |g: &mut Gated<Stream>, cx: &mut Context<'_>| {
            let mut buf = ReadBuf::new(&mut space);
            Pin::new(g).poll_read(cx, &mut buf).is_ready()
        };
        assert!(read(&mut g, &mut cx));
        assert!(Pin::new(&mut g).poll_flush(&mut cx).is_pending());
        assert!(
            !read(&mut g, &mut cx),
            "no reading while the peer takes nothing"
        );
        assert!(Pin::new(&mut g).poll_flush(&mut cx).is_ready());
        assert!(
            read(&mut g, &mut cx),
            "the flush went through: reading goes on"
        );
    }

    #[test]
    fn heads_are_counted_across_reads_and_reset_by_a_write() {
        let mut g = Gated::new((), Duration::from_secs(1));
        g.saw(b"GET / HTTP/1.1\r\nHost: q\r\n\r\nGET / HTTP/1.1\r\n\r");
        assert_eq!(g.heads, 1);
        g.saw(b"\n");
        assert_eq!(g.heads, 2);
        g.saw(b"\r\r\n\r\n");
        assert_eq!(g.heads, 3, "a lone \\r before the end must not hide it");
        for _ in 0..HEADS_AHEAD {
            g.saw(b"GET / HTTP/1.1\r\n\r\n");
        }
        assert!(!g.open());
        g.wrote();
        assert!(g.open());
        assert_eq!(g.heads, 0);
    }
}
