//! Middleware that runs before routing: the request id, the limit on the size of a request's
//! header fields, and (with traces on) a span per admin request.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::HttpMessage;
use actix_web::ResponseError;

use super::error::ApiError;

/// The size of a request's header fields, each counted as `name: value\r\n` (the request line
/// and the blank line that ends the head are not counted).
pub fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum()
}

/// Middleware: a request whose header fields take more than `max` bytes
/// (`server.max_header_bytes`) gets 431 in the error shape before routing, auth or the body.
///
/// actix-http has no setting for this. Its own fixed limits stand behind this one: a request
/// head of 128 KiB or more ([`crate::config::HEADER_BYTES_CEILING`]), or more than 96 header
/// fields, gets a bare 431 (no body) and the connection is closed, before any middleware runs.
pub async fn limit_header_bytes<B: MessageBody>(
    max: usize,
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    if header_bytes(req.headers()) > max {
        let res = ApiError::HeaderFieldsTooLarge(max).error_response();
        return Ok(req.into_response(res).map_into_right_body());
    }
    next.call(req)
        .await
        .map(ServiceResponse::map_into_left_body)
}

/// The request's id: its `X-Request-Id` when it sent a usable one, else one made here. Handlers
/// find it in the request's extensions; every response carries it back.
#[derive(Clone, Debug)]
pub struct RequestId(pub HeaderValue);

impl RequestId {
    /// The id of a request that went through [`request_id`] (empty otherwise, in unit tests).
    pub fn of(req: &actix_web::HttpRequest) -> String {
        req.extensions()
            .get::<RequestId>()
            .and_then(|r| r.0.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    }
}

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A caller's id is kept when it is 1..=128 visible ASCII characters (what proxies and tracing
/// systems send); anything else is replaced, not refused: an id is for correlation, never a
/// reason to fail a request.
fn usable(v: &HeaderValue) -> bool {
    (1..=128).contains(&v.len()) && v.as_bytes().iter().all(|b| (0x21..0x7f).contains(b))
}

/// 128 random bits, as 32 hex digits.
fn new_id() -> HeaderValue {
    let mut buf = [0u8; 32];
    let n: u128 = rand::random();
    for (i, b) in buf.iter_mut().enumerate() {
        let nibble = ((n >> (124 - 4 * i)) & 0xf) as u8;
        *b = b"0123456789abcdef"[nibble as usize];
    }
    HeaderValue::from_bytes(&buf).expect("hex digits are a valid header value")
}

/// Middleware, outermost: takes or makes the request's id and echoes it on every response,
/// errors and refusals included.
pub async fn request_id<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<B>, actix_web::Error> {
    let id = match req.headers().get(&X_REQUEST_ID) {
        Some(v) if usable(v) => v.clone(),
        _ => new_id(),
    };
    req.extensions_mut().insert(RequestId(id.clone()));
    let mut res = next.call(req).await?;
    res.headers_mut().insert(X_REQUEST_ID, id);
    Ok(res)
}

/// Paths of the admin API: what [`admin_span`] traces.
fn is_admin(path: &str) -> bool {
    ["/v1/quotas", "/v1/usage", "/v1/audit", "/v1/whoami"]
        .iter()
        .any(|p| path.starts_with(p))
}

/// Middleware, with traces on: a span (`admin`) per admin request, in the caller's trace when
/// it sends a W3C `traceparent`, with its method, route template and status.
pub async fn admin_span<B: MessageBody>(
    traces: std::sync::Arc<crate::traces::Traces>,
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<B>, actix_web::Error> {
    if !is_admin(req.path()) {
        return next.call(req).await;
    }
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (parent, state) = (header("traceparent"), header("tracestate"));
    let span = traces.start_span("admin", parent.as_deref(), state.as_deref());
    let method = req.method().to_string();
    let route = req.match_pattern().unwrap_or_else(|| req.path().to_owned());
    let res = next.call(req).await;
    let status = res.as_ref().map(|r| r.status().as_u16()).ok();
    traces.end_admin(span, &method, &route, status);
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_ids_are_32_hex_digits_and_differ() {
        let (a, b) = (new_id(), new_id());
        assert_eq!(a.len(), 32);
        assert!(a.to_str().unwrap().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(usable(&a));
    }

    #[test]
    fn only_visible_ascii_ids_up_to_128_are_kept() {
        assert!(usable(&HeaderValue::from_static("req-1:abc/DEF")));
        assert!(!usable(&HeaderValue::from_static("")));
        assert!(!usable(&HeaderValue::from_static("has space")));
        assert!(!usable(&HeaderValue::from_str(&"x".repeat(129)).unwrap()));
        assert!(usable(&HeaderValue::from_str(&"x".repeat(128)).unwrap()));
    }
}
