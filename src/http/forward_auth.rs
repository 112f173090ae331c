//! `/v1/forward-auth`: a check asked by a proxy before it passes a request on (nginx
//! `auth_request`, Traefik `ForwardAuth`). Any method; the body is never read. The tenant and
//! the client come from request headers named in the configuration (`forward_auth`), the cost
//! is 1 unless the operator named a cost header, the resource is `METHOD /path` of the original
//! request from the first pair of headers `forward_auth.resource_from` names
//! (`X-Original-Method` + `X-Original-URI`, as the nginx example sets them, or Traefik's
//! `X-Forwarded-Method` + `X-Forwarded-Uri`), and the answer is 200 or the configured denial
//! status with the RateLimit-* and Retry-After headers the proxy copies to its client, and an
//! empty body. Every header read here is the proxy's to set: one a caller sent and the proxy
//! passed on would let the caller choose what is counted (the shipped examples set or clear
//! each of them).

use std::borrow::Cow;

use actix_web::http::header::HeaderName;
use actix_web::http::{Method, StatusCode};
use actix_web::{HttpRequest, HttpResponse};

use super::check::{rate_headers, Parsed};
use super::error::{ApiError, ErrorBody};
use super::state::AppState;
use crate::config::ResourceSource;
use crate::domain::{
    normalize_path, parse_cost, resource_from_bytes, validate_resource, ClientId, TenantId,
    MAX_RESOURCE_LEN,
};

/// A header's value as visible ASCII: other bytes (raw UTF-8 in a path, say) are
/// percent-encoded, so a header that is there is never taken for absent (which would let
/// `/orders/é` pass as `/`).
fn ascii_header(req: &HttpRequest, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .map(|v| resource_from_bytes(v.as_bytes()))
}

/// A header's value, required: a 400 naming the header when absent.
fn required<'a>(req: &'a HttpRequest, name: &HeaderName) -> Result<&'a str, ApiError> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| ApiError::invalid(name.as_str(), format!("the {name} header is required")))
}

/// `METHOD /path` of the original request (the method in upper case, the query string left
/// out, the path normalised: [`normalize_path`]), at most the longest resource a check takes,
/// or None when no source in `from` is present. The first source with either of its headers
/// is the one: both its headers or a 400, never the method of one and the path of another
/// (a caller who adds `X-Original-URI` behind Traefik must not move its request elsewhere).
fn resource(req: &HttpRequest, from: &[ResourceSource]) -> Result<Option<String>, ApiError> {
    let Some((method_h, uri_h, method, uri)) = from.iter().find_map(|s| {
        let (m, u) = s.headers();
        let (method, uri) = (ascii_header(req, m), ascii_header(req, u));
        (method.is_some() || uri.is_some()).then_some((m, u, method, uri))
    }) else {
        return Ok(None);
    };
    let missing = |h: &str, other: &str| {
        ApiError::invalid(h, format!("{other} came without {h}: the proxy sends both"))
    };
    let method = method.ok_or_else(|| missing(method_h, uri_h))?;
    let uri = uri.ok_or_else(|| missing(uri_h, method_h))?;
    // HTTP methods are case-sensitive, but limits are written `POST /login` and no backend
    // routes `post` elsewhere: folded, so that `post` cannot pass beside a `POST` limit.
    let method = method.to_ascii_uppercase();
    if Method::from_bytes(method.as_bytes()).is_err() {
        return Err(ApiError::invalid(method_h, "not an HTTP method"));
    }
    let path = normalize_path(uri.split(['?', '#']).next().unwrap_or(&uri));
    let mut r = format!("{method} {path}");
    // Long paths are cut, not refused: a limit's resource pattern matches a prefix anyway.
    // (Printable ASCII by now, so any cut is on a character boundary.)
    r.truncate(MAX_RESOURCE_LEN);
    validate_resource(uri_h, &r)?;
    Ok(Some(r))
}

/// The cost: 1 unless the operator named a cost header (`forward_auth.cost_header`) and the
/// request carries it.
fn cost(req: &HttpRequest, header: Option<&HeaderName>) -> Result<u64, ApiError> {
    let Some(v) = header.and_then(|h| req.headers().get(h)) else {
        return Ok(1);
    };
    let n = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<serde_json::Number>().ok());
    parse_cost(Some(
        n.as_ref().unwrap_or(&serde_json::Number::from(u64::MAX)),
    ))
    .map_err(|e| ApiError::invalid(header.map_or("cost", |h| h.as_str()), e.message))
}

#[utoipa::path(
    method(get, head, post, put, patch, delete, options),
    path = "/v1/forward-auth",
    tag = "checks",
    operation_id = "forward_auth",
    summary = "A check for a proxy (nginx auth_request, Traefik ForwardAuth): headers in, status and headers out",
    description = "The tenant and client come from the headers named by `forward_auth.tenant_header` (default `X-Quota-Tenant`) and `forward_auth.client_header` (`X-Quota-Client`); the cost is 1, or read from `forward_auth.cost_header` when the operator set one (unset by default: a caller's own header must not choose its cost); the resource is `METHOD /path` (method in upper case, the query left out) from the first pair `forward_auth.resource_from` names, `X-Original-Method` + `X-Original-URI` then `X-Forwarded-Method` + `X-Forwarded-Uri` by default, both headers of one pair or a 400. The body is never read. A tenant without a quota is admitted (200 with no RateLimit headers): a proxy in front of everything must not refuse what no rule covers. When a check token is configured, it is read from `forward_auth.token_header` (`X-Quota-Token`), since `Authorization` belongs to the end user.",
    params(
        ("X-Quota-Tenant" = String, Header, description = "The tenant (header name configurable)", pattern = "^[A-Za-z0-9._~:@-]{1,128}$"),
        ("X-Quota-Client" = String, Header, description = "The client (header name configurable)", pattern = "^[A-Za-z0-9._~:@-]{1,128}$"),
        ("X-Quota-Cost" = Option<u64>, Header, description = "Units to take, 0..=1000000, read only when `forward_auth.cost_header` names it (unset by default: the cost is 1)", minimum = 0, maximum = 1000000),
        ("X-Original-Method" = Option<String>, Header, description = "The original request's method (nginx), with X-Original-URI"),
        ("X-Original-URI" = Option<String>, Header, description = "The original request's URI (nginx), with X-Original-Method; X-Forwarded-Method and X-Forwarded-Uri (Traefik) are the other pair `forward_auth.resource_from` may name"),
    ),
    responses(
        (status = 200, description = "Admitted; empty body", headers(
                ("RateLimit-Limit" = u64, description = "The binding limit's max (absent when no limit applies)"),
                ("RateLimit-Remaining" = u64), ("RateLimit-Reset" = u64),
                ("X-RateLimit-Limit" = u64), ("X-RateLimit-Remaining" = u64), ("X-RateLimit-Reset" = u64)
            )),
        (status = 429, description = "Denied (the status is `forward_auth.deny_status`: 429, or 403 for nginx); empty body; nothing consumed", headers(
                ("RateLimit-Limit" = u64), ("RateLimit-Remaining" = u64), ("RateLimit-Reset" = u64),
                ("X-RateLimit-Limit" = u64), ("X-RateLimit-Remaining" = u64), ("X-RateLimit-Reset" = u64),
                ("Retry-After" = u64, description = "Seconds (at least 1) until the same request could be admitted")
            )),
        (status = 400, description = "invalid_argument: a missing or bad header, naming it", body = ErrorBody),
        (status = 401, description = "unauthenticated: a check token is configured and the token header has none or a wrong one", body = ErrorBody),
        (status = 403, description = "permission_denied: the token may not check for this tenant (also a denial when `deny_status` is 403: then the body is empty)", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub async fn forward_auth(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let state = AppState::of(&req)?;
    let fa = &state.forward_auth;
    let who = state.auth.checker_in(&req, &fa.token).await?;
    let tenant = TenantId::parse_field(required(&req, &fa.tenant)?, fa.tenant.as_str())?;
    let client = ClientId::parse_field(required(&req, &fa.client)?, fa.client.as_str())?;
    let cost = cost(&req, fa.cost.as_ref())?;
    if let Some(w) = &who {
        w.may_check(tenant.as_str())?;
    }
    let resource = resource(&req, &fa.resource_from)?;
    let p = Parsed {
        tenant,
        client,
        resource: resource.map(Cow::Owned),
        cost,
    };
    let header = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok());
    let Some(d) = state.checks.decide(&p, header).await else {
        return Ok(HttpResponse::Ok().finish());
    };
    let mut res = HttpResponse::build(if d.allowed { StatusCode::OK } else { fa.deny });
    rate_headers(&mut res, &d);
    Ok(res.finish())
}
