//! Middleware that runs before routing: the limit on the size of a request's header fields.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::HeaderMap;
use actix_web::middleware::Next;
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
