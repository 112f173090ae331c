//! [`TokenBody`]: a response body passed on as it comes, watched for the usage to settle at.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde_json::Value;

use super::hold::Hold;

/// The most of a JSON answer kept to read its usage from: past it, the answer goes on
/// unread and the reservation is settled at its estimate.
const MAX_JSON: usize = 8 << 20;
/// The most of one server-sent event kept; a longer one is skipped.
const MAX_EVENT: usize = 1 << 20;

/// `usage.total_tokens` of an answer or an event, when it says.
fn total_tokens(json: &[u8]) -> Option<u64> {
    let v: Value = serde_json::from_slice(json).ok()?;
    v.get("usage")?.get("total_tokens")?.as_u64()
}

/// A stream of server-sent events, read for the last one carrying `usage`.
#[derive(Debug, Default)]
pub(super) struct Events {
    line: Vec<u8>,
    data: Vec<u8>,
    skip: bool,
    usage: Option<u64>,
    done: bool,
}

impl Events {
    /// Reads a chunk; true once `data: [DONE]` has come.
    fn feed(&mut self, mut chunk: &[u8]) -> bool {
        while !chunk.is_empty() && !self.done {
            let end = chunk.iter().position(|&b| b == b'\n');
            let (part, rest) = match end {
                Some(i) => (&chunk[..i], &chunk[i + 1..]),
                None => (chunk, &[][..]),
            };
            if self.line.len() + part.len() <= MAX_EVENT {
                self.line.extend_from_slice(part);
            } else {
                self.skip = true;
            }
            if end.is_some() {
                let line = std::mem::take(&mut self.line);
                self.line_ended(&line);
                self.line = line;
                self.line.clear();
            }
            chunk = rest;
        }
        self.done
    }

    fn line_ended(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch();
        } else if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if !self.data.is_empty() {
                self.data.push(b'\n');
            }
            if self.data.len() + value.len() <= MAX_EVENT {
                self.data.extend_from_slice(value);
            } else {
                self.skip = true;
            }
        }
        // `event:`, `id:`, `retry:` and `:` comments say nothing of usage.
    }

    /// The event whose lines were read ends (a blank line, or the end of the stream).
    fn dispatch(&mut self) {
        let data = std::mem::take(&mut self.data);
        if std::mem::take(&mut self.skip) || data.is_empty() {
            return;
        }
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
        } else if contains(&data, b"\"usage\"") {
            if let Some(n) = total_tokens(&data) {
                self.usage = Some(n);
            }
        }
    }

    /// The stream ended: an event without its blank line still counts.
    fn end(&mut self) -> Option<u64> {
        if !self.done {
            let line = std::mem::take(&mut self.line);
            if !line.is_empty() {
                self.line_ended(&line);
            }
            self.dispatch();
        }
        self.usage
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// How an answer is read for its usage.
#[derive(Debug)]
pub(super) enum Usage {
    /// One JSON document (a copy of it, kept until it ends).
    Json(Vec<u8>, bool),
    /// Server-sent events.
    Events(Events),
    /// Neither: settled at the estimate.
    Unknown,
}

impl Usage {
    /// The reading an answer of this `Content-Type` gets.
    pub fn of(content_type: Option<&str>) -> Self {
        let ct = content_type.unwrap_or("").to_ascii_lowercase();
        if ct.starts_with("text/event-stream") {
            Usage::Events(Events::default())
        } else if ct.contains("json") {
            Usage::Json(Vec::new(), false)
        } else {
            Usage::Unknown
        }
    }
}

/// An answer's reservation and its reading: settled once the answer ends (or is dropped), at
/// the usage it carried or else at the estimate.
struct Watch {
    hold: Option<Hold>,
    usage: Usage,
}

impl Watch {
    /// Reads a chunk; true once the answer has said all it will.
    fn feed(&mut self, chunk: &[u8]) -> bool {
        match &mut self.usage {
            Usage::Json(copy, over) => {
                if !*over && copy.len() + chunk.len() <= MAX_JSON {
                    copy.extend_from_slice(chunk);
                } else {
                    *over = true;
                    *copy = Vec::new();
                }
                false
            }
            Usage::Events(e) => e.feed(chunk),
            Usage::Unknown => false,
        }
    }

    fn end(&mut self) {
        let Some(hold) = self.hold.take() else {
            return;
        };
        let usage = match &mut self.usage {
            Usage::Json(copy, false) => total_tokens(copy),
            Usage::Json(_, true) | Usage::Unknown => None,
            Usage::Events(e) => e.end(),
        };
        let cost = usage.unwrap_or_else(|| hold.estimate());
        hold.settle(cost);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.end();
    }
}

pin_project! {
    /// The body of a response [`super::TokenBudgetLayer`] answers: the upstream's, passed on
    /// frame by frame as it comes (and read on the way for its usage), or the layer's own
    /// (a 429, a 503, a 413).
    pub struct TokenBody<B> {
        #[pin]
        inner: Option<B>,
        own: Option<Bytes>,
        watch: Option<Watch>,
    }
}

impl<B> TokenBody<B> {
    /// The upstream's body, unread.
    pub(super) fn passed(inner: B) -> Self {
        TokenBody {
            inner: Some(inner),
            own: None,
            watch: None,
        }
    }

    /// The upstream's body, read for the usage to settle `hold` at.
    pub(super) fn watched(inner: B, hold: Hold, usage: Usage) -> Self {
        TokenBody {
            inner: Some(inner),
            own: None,
            watch: Some(Watch {
                hold: Some(hold),
                usage,
            }),
        }
    }

    /// The layer's own answer.
    pub(super) fn own(body: impl Into<Bytes>) -> Self {
        TokenBody {
            inner: None,
            own: Some(body.into()),
            watch: None,
        }
    }
}

impl<B: Body<Data = Bytes>> Body for TokenBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let Some(mut inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(this.own.take().map(|b| Ok(Frame::data(b))));
        };
        let frame = ready!(inner.as_mut().poll_frame(cx));
        let Some(watch) = this.watch.as_mut() else {
            return Poll::Ready(frame);
        };
        // Ended when the inner body says so after its last frame: a server may drop a body
        // that says it has ended without polling it again.
        let ended = match &frame {
            Some(Ok(f)) => f.data_ref().is_some_and(|d| watch.feed(d)) || inner.is_end_stream(),
            Some(Err(_)) | None => true,
        };
        if ended {
            watch.end();
            *this.watch = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(inner) => inner.is_end_stream(),
            None => self.own.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.inner, &self.own) {
            (Some(inner), _) => inner.size_hint(),
            (None, Some(b)) => SizeHint::with_exact(b.len() as u64),
            (None, None) => SizeHint::with_exact(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_usage_before_done_is_read_however_the_chunks_fall() {
        let stream = concat!(
            ": a comment\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n",
            "event: message\r\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\r\n",
            "data: \"total_tokens\":7}}\r\n\r\n",
            "data: [DONE]\n\n",
            "data: {\"usage\":{\"total_tokens\":99}}\n\n",
        )
        .as_bytes();
        for size in [1, 2, 7, 64, stream.len()] {
            let mut e = Events::default();
            let mut done = false;
            for chunk in stream.chunks(size) {
                done |= e.feed(chunk);
            }
            assert!(done, "{size}");
            assert_eq!(e.end(), Some(7), "{size}");
        }
    }

    #[test]
    fn a_stream_without_usage_or_cut_short_says_none_and_a_last_event_counts_unterminated() {
        let mut e = Events::default();
        assert!(!e.feed(b"data: {\"choices\":[]}\n\ndata: {\"usage\":{\"total_"));
        assert_eq!(e.end(), None);
        let mut e = Events::default();
        assert!(!e.feed(b"data: {\"usage\":{\"total_tokens\":12}}"));
        assert_eq!(e.end(), Some(12));
    }

    #[test]
    fn an_answer_is_read_by_its_content_type() {
        assert!(matches!(
            Usage::of(Some("text/event-stream; charset=utf-8")),
            Usage::Events(_)
        ));
        assert!(matches!(
            Usage::of(Some("application/json")),
            Usage::Json(..)
        ));
        assert!(matches!(Usage::of(Some("audio/mpeg")), Usage::Unknown));
        assert!(matches!(Usage::of(None), Usage::Unknown));
        assert_eq!(total_tokens(br#"{"usage":{"total_tokens":5}}"#), Some(5));
        assert_eq!(total_tokens(br#"{"usage":null}"#), None);
    }
}
