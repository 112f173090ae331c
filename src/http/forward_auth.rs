//! `/v1/forward-auth`: a check asked by a proxy before it passes a request on (nginx
//! `auth_request`, Traefik `ForwardAuth`). Any method; the body is never read. The tenant, the
//! client and the cost come from request headers named in the configuration (`forward_auth`),
//! the resource is `METHOD /path` of the original request (`X-Original-Method`/`X-Original-URI`,
//! as nginx is told to send them, or Traefik's `X-Forwarded-Method`/`X-Forwarded-Uri`), and the
//! answer is 200 or the configured denial status with the RateLimit-* and Retry-After headers the
//! proxy copies to its client, and an empty body.

use std::borrow::Cow;

use actix_web::http::header::HeaderName;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};

use super::check::{rate_headers, Parsed};
use super::error::{ApiError, ErrorBody};
use super::state::AppState;
use crate::domain::{
    normalize_path, parse_cost, resource_from_bytes, validate_resource, ClientId, TenantId,
    MAX_RESOURCE_LEN,
};

const ORIGINAL_METHOD: [&str; 2] = ["x-original-method", "x-forwarded-method"];
const ORIGINAL_URI: [&str; 2] = ["x-original-uri", "x-forwarded-uri"];

/// The first of `names` present in the request, with its name, as visible ASCII: other bytes
/// (raw UTF-8 in a path, say) are percent-encoded, so a header that is there is never taken
/// for absent (which would let `/orders/é` pass as `/`).
fn first_header(req: &HttpRequest, names: &[&'static str]) -> Option<(&'static str, String)> {
    names.iter().find_map(|n| {
        req.headers()
            .get(*n)
            .map(|v| (*n, resource_from_bytes(v.as_bytes())))
    })
}

/// A header's value, required: a 400 naming the header when absent.
fn required<'a>(req: &'a HttpRequest, name: &HeaderName) -> Result<&'a str, ApiError> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| ApiError::invalid(name.as_str(), format!("the {name} header is required")))
}

/// `METHOD /path` of the original request (the query string left out, the path normalised:
/// [`normalize_path`]), at most the longest resource a check takes, or None when the proxy sent
/// neither.
fn resource(req: &HttpRequest) -> Result<Option<String>, ApiError> {
    let method = first_header(req, &ORIGINAL_METHOD);
    let uri = first_header(req, &ORIGINAL_URI);
    if method.is_none() && uri.is_none() {
        return Ok(None);
    }
    let path = uri.as_ref().map_or("/", |(_, u)| u.as_str());
    let path = normalize_path(path.split(['?', '#']).next().unwrap_or(path));
    let method_name = method.as_ref().map_or("GET", |(_, m)| m.as_str());
    let mut r = format!("{method_name} {path}");
    // Long paths are cut, not refused: a limit's resource pattern matches a prefix anyway.
    // (Printable ASCII by now, so any cut is on a character boundary.)
    r.truncate(MAX_RESOURCE_LEN);
    let field = uri.or(method).map_or(ORIGINAL_URI[0], |(n, _)| n);
    validate_resource(field, &r)?;
    Ok(Some(r))
}

#[utoipa::path(
    method(get, head, post, put, patch, delete, options),
    path = "/v1/forward-auth",
    tag = "checks",
    operation_id = "forward_auth",
    summary = "A check for a proxy (nginx auth_request, Traefik ForwardAuth): headers in, status and headers out",
    description = "The tenant, client and cost come from the headers named by `forward_auth.tenant_header` (default `X-Quota-Tenant`), `forward_auth.client_header` (`X-Quota-Client`) and `forward_auth.cost_header` (`X-Quota-Cost`, absent: 1); the resource is `METHOD /path` from `X-Original-Method`/`X-Original-URI` or `X-Forwarded-Method`/`X-Forwarded-Uri` (the query left out). The body is never read. A tenant without a quota is admitted (200 with no RateLimit headers): a proxy in front of everything must not refuse what no rule covers. When a check token is configured, it is read from `forward_auth.token_header` (`X-Quota-Token`), since `Authorization` belongs to the end user.",
    params(
        ("X-Quota-Tenant" = String, Header, description = "The tenant (header name configurable)", pattern = "^[A-Za-z0-9._~:@-]{1,128}$"),
        ("X-Quota-Client" = String, Header, description = "The client (header name configurable)", pattern = "^[A-Za-z0-9._~:@-]{1,128}$"),
        ("X-Quota-Cost" = Option<u64>, Header, description = "Units to take, 0..=1000000; absent: 1", minimum = 0, maximum = 1000000),
        ("X-Original-Method" = Option<String>, Header, description = "The original request's method (nginx)"),
        ("X-Original-URI" = Option<String>, Header, description = "The original request's URI (nginx); X-Forwarded-Method and X-Forwarded-Uri (Traefik) are read too"),
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
    let who = state.auth.checker_in(&req, &fa.token)?;
    let tenant = TenantId::parse_field(required(&req, &fa.tenant)?, fa.tenant.as_str())?;
    let client = ClientId::parse_field(required(&req, &fa.client)?, fa.client.as_str())?;
    let cost = match req.headers().get(&fa.cost) {
        None => 1,
        Some(v) => {
            let n = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<serde_json::Number>().ok());
            parse_cost(Some(
                n.as_ref().unwrap_or(&serde_json::Number::from(u64::MAX)),
            ))
            .map_err(|e| ApiError::invalid(fa.cost.as_str(), e.message))?
        }
    };
    if let Some(w) = &who {
        w.may_check(tenant.as_str())?;
    }
    let resource = resource(&req)?;
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
