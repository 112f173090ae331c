//! Request bodies: `application/json` only, at most [`MAX_BODY`] bytes, read before parsing so an
//! oversized body is refused without being buffered; parse errors name the offending field. A
//! body must arrive whole within `server.request_timeout_ms` of the handler's first read (the
//! server's own timeout covers only the request head): one that does not gets 408, and its
//! connection is let go.

use actix_web::http::header;
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::HttpRequest;
use futures::StreamExt;

use super::error::{self, ApiError};

/// The contract's body limit.
pub const MAX_BODY: usize = 64 * 1024;

/// How long a body may take when no app state says (unit tests): the default of
/// `server.request_timeout_ms`.
const DEFAULT_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads a JSON body: `application/json` only, at most [`MAX_BODY`] bytes, within the body
/// deadline (see the module comment).
pub async fn json_body(req: &HttpRequest, payload: web::Payload) -> Result<Bytes, ApiError> {
    let deadline = super::AppState::of(req).map_or(DEFAULT_BODY_TIMEOUT, |s| s.request_timeout);
    match tokio::time::timeout(deadline, read_json_body(req, payload)).await {
        Ok(read) => read,
        Err(_) => Err(ApiError::RequestTimeout(deadline.as_millis() as u64)),
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
