//! Request bodies: `application/json` only, at most [`MAX_BODY`] bytes, read before parsing so an
//! oversized body is refused without being buffered; parse errors name the offending field.
//!
//! A body must arrive whole within `server.request_timeout_ms` of its request's routing (the
//! server's own timeout covers only the request head), on every route and whatever its framing:
//! one that does not gets 408 and its connection is let go. [`body_deadline`] keeps the body of
//! every request alive until the answer is written, so that actix-http closes the connection of
//! a body nobody finished reading (a 408, a refusal before the body, a route that takes none)
//! instead of draining it: left alone, it drains a chunked body for as long as the caller keeps
//! sending it, for ever if it never ends, and only a `Content-Length` body gets closed.

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use actix_web::body::MessageBody;
use actix_web::dev::{self, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::{HttpMessage, HttpRequest};
use futures::{Stream, StreamExt};
use tokio::time::Instant;

use super::error::{self, ApiError};

/// The contract's body limit.
pub const MAX_BODY: usize = 64 * 1024;

/// How long a body may take when no app state says (unit tests): the default of
/// `server.request_timeout_ms`.
const DEFAULT_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// When the body of a request must have arrived: set by [`body_deadline`], read by
/// [`json_body`].
#[derive(Clone, Copy, Debug)]
struct BodyDeadline {
    at: Instant,
    /// `server.request_timeout_ms`, for the 408's message.
    timeout: std::time::Duration,
}

/// Middleware: gives the request's body its deadline and holds the body until the answer is
/// written (see the module comment).
pub async fn body_deadline<B: MessageBody + Unpin>(
    timeout: std::time::Duration,
    mut req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<HoldingBody<B>>, actix_web::Error> {
    let at = Instant::now() + timeout;
    req.extensions_mut().insert(BodyDeadline { at, timeout });
    let body = SharedBody(Rc::new(RefCell::new(req.take_payload())));
    req.set_payload(dev::Payload::Stream {
        payload: Box::pin(body.clone()),
    });
    let res = next.call(req).await?;
    Ok(res.map_body(|_, answer| HoldingBody {
        answer,
        _request: body,
    }))
}

/// An answer's body that holds its request's body until the answer is written: actix-http
/// decides whether to keep the connection both when the answer starts and when it ends, and a
/// request body unfinished and still held then is unread, so the connection is closed.
pub struct HoldingBody<B> {
    answer: B,
    _request: SharedBody,
}

impl<B: MessageBody + Unpin> MessageBody for HoldingBody<B> {
    type Error = B::Error;

    fn size(&self) -> actix_web::body::BodySize {
        self.answer.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.get_mut().answer).poll_next(cx)
    }
}

/// A request's body that the handler reads and the answer keeps alive. Single-threaded: a
/// request lives on one worker, and so does its body.
#[derive(Clone)]
struct SharedBody(Rc<RefCell<dev::Payload>>);

impl Stream for SharedBody {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_next(cx)
    }
}

/// Reads a JSON body: `application/json` only, at most [`MAX_BODY`] bytes, within the body
/// deadline (see the module comment).
pub async fn json_body(req: &HttpRequest, payload: web::Payload) -> Result<Bytes, ApiError> {
    let deadline = req.extensions().get::<BodyDeadline>().copied();
    let deadline = deadline.unwrap_or_else(|| {
        // Without the middleware (unit tests): from the first read.
        let timeout = super::AppState::of(req).map_or(DEFAULT_BODY_TIMEOUT, |s| s.request_timeout);
        BodyDeadline {
            at: Instant::now() + timeout,
            timeout,
        }
    });
    match tokio::time::timeout_at(deadline.at, read_json_body(req, payload)).await {
        Ok(read) => read,
        Err(_) => Err(ApiError::RequestTimeout(deadline.timeout.as_millis() as u64)),
    }
}

async fn read_json_body(req: &HttpRequest, mut payload: web::Payload) -> Result<Bytes, ApiError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim();
    if !mime.eq_ignore_ascii_case("application/json") {
        return Err(ApiError::UnsupportedMediaType(
            "Content-Type must be application/json",
        ));
    }
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > MAX_BODY {
            return Err(ApiError::PayloadTooLarge(MAX_BODY));
        }
    }
    let read = |c: Result<Bytes, _>| {
        c.map_err(|e: actix_web::error::PayloadError| {
            ApiError::invalid("body", format!("cannot read body: {e}"))
        })
    };
    // A small body usually arrives in one chunk: keep it as it is, without a copy.
    let first = match payload.next().await {
        None => return Ok(Bytes::new()),
        Some(c) => read(c)?,
    };
    if first.len() > MAX_BODY {
        return Err(ApiError::PayloadTooLarge(MAX_BODY));
    }
    let Some(second) = payload.next().await else {
        return Ok(first);
    };
    let mut body = BytesMut::from(&first[..]);
    let mut next = Some(second);
    while let Some(chunk) = next {
        let chunk = read(chunk)?;
        if body.len() + chunk.len() > MAX_BODY {
            return Err(ApiError::PayloadTooLarge(MAX_BODY));
        }
        body.extend_from_slice(&chunk);
        next = payload.next().await;
    }
    Ok(body.freeze())
}

/// Deserializes a JSON body, one value and nothing after it but whitespace; an error names the
/// field it is about (`limits[2].max`).
///
/// Parsed once without tracking where it is: keeping the path costs about a fifth of a
/// 100-check batch's time. Only a body that fails is parsed again, with the path, for the
/// error (parsing is deterministic: it fails the same way).
pub fn parse_json<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    if let Ok(t) = T::deserialize(&mut de) {
        return de.end().map(|()| t).map_err(|e| {
            ApiError::invalid(
                "body",
                format!("the body holds more than one JSON value: {e}"),
            )
        });
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| error::json_error(e, ""))
}
