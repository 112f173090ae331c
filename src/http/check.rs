//! `POST /v1/check` and `POST /v1/check/batch`.

use std::borrow::Cow;

use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::body::{json_body, parse_json};
use super::error::{ApiError, ErrorBody};
use super::state::AppState;
use crate::checks::ceil_secs;
use crate::checks::{Check, Outcome};
use crate::domain::{
    normalize_resource, parse_cost, parse_duration_ms, validate_resource, ClientId, TenantId,
    HOLD_MESSAGE, MAX_HOLD_MS, MIN_HOLD_MS,
};
use crate::limiter::Decision;

/// Most checks in one batch.
pub const MAX_BATCH: usize = 1000;

/// A check as sent. Fields are optional here so a missing one gets a message naming it;
/// unknown fields are refused so a typo (`"cots"`) is not silently ignored. The `schema`
/// attributes state for the OpenAPI document what `validate` enforces.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Check)]
struct CheckDto<'a> {
    /// The tenant whose quota applies.
    #[serde(borrow, default)]
    #[schema(value_type = String, required = true, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", example = "acme")]
    tenant: Option<Cow<'a, str>>,
    /// The tenant's client (an API key, a user id...).
    #[serde(borrow, default)]
    #[schema(value_type = String, required = true, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", example = "key-123")]
    client: Option<Cow<'a, str>>,
    /// What the request touches; limits with a `resource` apply only when it matches. Absent
    /// (or null): only the limits without a `resource` apply.
    #[serde(borrow, default)]
    #[schema(value_type = Option<String>, pattern = "^[ -~]{1,256}$", example = "PUT /products/42")]
    resource: Option<Cow<'a, str>>,
    /// Units to take; 0 peeks and consumes nothing. Absent (or null): 1. With `reserve`, the
    /// estimate the reservation holds.
    #[serde(default)]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1000000000, default = 1)]
    cost: Option<serde_json::Number>,
    /// Hold the cost as a reservation, to settle at the real cost (or release) once the work
    /// is done: an admitted answer carries its id. In-flight limits apply only to such checks.
    /// Not in a batch. Absent (or null): false.
    #[serde(default)]
    #[schema(value_type = Option<bool>, default = false)]
    reserve: Option<bool>,
    /// With `reserve`: how long the reservation is held before it expires (keeping its
    /// estimate), 1s to 1h. Absent (or null): the policy's `hold`, else 5m.
    #[serde(borrow, default)]
    #[schema(value_type = Option<String>, example = "2m")]
    hold: Option<Cow<'a, str>>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CheckBatch)]
struct BatchDto<'a> {
    /// Decided in order, each as if sent alone.
    #[serde(borrow)]
    #[schema(min_items = 1, max_items = 1000)]
    checks: Vec<CheckDto<'a>>,
}

/// A check as read from a request: the service's own [`Check`].
pub(super) type Parsed<'a> = Check<'a>;

/// What a check asks to hold: None, or the hold's time if it gave one.
type Reserve = Option<Option<i64>>;

/// A field's name in errors: `tenant` in a single check, `checks[3].tenant` in a batch.
fn field(item: Option<usize>, name: &str) -> String {
    match item {
        None => name.to_owned(),
        Some(i) => format!("checks[{i}].{name}"),
    }
}

/// Runs a field's validation under its short name and, only when it fails, again under its
/// full name, so a valid check builds no field names (no allocation for them per check).
fn named<T, E>(item: Option<usize>, name: &str, f: impl Fn(&str) -> Result<T, E>) -> Result<T, E> {
    match (f(name), item) {
        (Err(_), Some(_)) => f(&field(item, name)),
        (r, _) => r,
    }
}

/// Checks a check's fields. `prev`: the tenant of the batch's previous item, shared when this
/// one names the same (a batch is mostly of one tenant).
fn validate<'a>(
    dto: CheckDto<'a>,
    item: Option<usize>,
    prev: Option<&TenantId>,
) -> Result<Parsed<'a>, ApiError> {
    validate_reserving(dto, item, prev).map(|(p, _)| p)
}

/// [`validate`], and what the check asks to hold.
fn validate_reserving<'a>(
    dto: CheckDto<'a>,
    item: Option<usize>,
    prev: Option<&TenantId>,
) -> Result<(Parsed<'a>, Reserve), ApiError> {
    let reserve = match (dto.reserve, &dto.hold) {
        (Some(true), None) => Some(None),
        (Some(true), Some(h)) => Some(Some(
            parse_duration_ms(h)
                .filter(|ms| (MIN_HOLD_MS..=MAX_HOLD_MS).contains(ms))
                .ok_or_else(|| ApiError::invalid(field(item, "hold"), HOLD_MESSAGE))?,
        )),
        (_, Some(_)) => {
            return Err(ApiError::invalid(
                field(item, "hold"),
                "hold is the time of a reservation: give it with \"reserve\": true",
            ))
        }
        _ => None,
    };
    if reserve.is_some() && item.is_some() {
        return Err(ApiError::invalid(
            field(item, "reserve"),
            "a batch takes no reservations: send a reserving check alone to POST /v1/check",
        ));
    }
    let tenant = dto
        .tenant
        .ok_or_else(|| ApiError::invalid(field(item, "tenant"), "tenant is required"))?;
    let tenant = match prev {
        Some(t) if t.as_str() == tenant => t.clone(),
        _ => named(item, "tenant", |f| TenantId::parse_field(&tenant, f))?,
    };
    let client = dto
        .client
        .ok_or_else(|| ApiError::invalid(field(item, "client"), "client is required"))?;
    let client = named(item, "client", |f| ClientId::parse_field(&client, f))?;
    if let Some(r) = &dto.resource {
        named(item, "resource", |f| validate_resource(f, r))?;
    }
    // A request's path as limits compare it: no spelling of it walks past a limit.
    let resource = dto.resource.map(|r| match normalize_resource(&r) {
        Cow::Borrowed(_) => r,
        Cow::Owned(n) => Cow::Owned(n),
    });
    let cost = parse_cost(dto.cost.as_ref()).map_err(|mut e| {
        e.field = field(item, "cost");
        e
    })?;
    Ok((
        Parsed {
            tenant,
            client,
            resource,
            cost,
        },
        reserve,
    ))
}

/// The answer to a check (200 admitted, 429 denied). The binding limit's fields are null when no
/// limit applies. (`deny_unknown_fields` only tells the OpenAPI document that an answer has no
/// other fields.)
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CheckAnswer)]
struct Answer<'a> {
    allowed: bool,
    /// The binding limit: the one that denied (the longest wait), else the least remaining.
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    limit_id: Option<&'a str>,
    #[schema(minimum = 1)]
    limit: Option<u64>,
    remaining: Option<u64>,
    /// Until the binding limit's period ends, or its oldest counted hits leave its window.
    #[schema(minimum = 0)]
    reset_after_ms: Option<i64>,
    /// On a denial, until the same request could be admitted (null: never, the cost is above a
    /// limit's max); 0 when admitted.
    #[schema(minimum = 0)]
    retry_after_ms: Option<i64>,
    /// Present (true) only in dry_run mode, where enforcing would have denied.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dry_run_denied: bool,
    /// Present on an admitted check that asked to `reserve`: the reservation to settle or
    /// release at `/v1/reservations/{id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    reservation: Option<Taken>,
}

/// A reservation just taken.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ReservationTaken)]
struct Taken {
    #[schema(pattern = "^[0-9a-f]{32}$")]
    id: String,
    /// The cost held: the check's `cost`.
    estimate: u64,
    /// RFC 3339, UTC: unless settled or released by then, it expires, keeping its estimate.
    expires_at: String,
}

impl<'a> Answer<'a> {
    fn of(d: &'a Decision) -> Self {
        let b = d.binding.as_ref();
        Answer {
            allowed: d.allowed,
            limit_id: b.map(|b| b.limit_id.as_str()),
            limit: b.map(|b| b.limit),
            remaining: b.map(|b| b.remaining),
            reset_after_ms: b.map(|b| b.reset_after_ms),
            retry_after_ms: d.retry_after_ms,
            dry_run_denied: d.dry_run_denied,
            reservation: None,
        }
    }
}

#[utoipa::path(
    post,
    path = "/v1/check",
    tag = "checks",
    operation_id = "check",
    summary = "Asks whether a client of a tenant may do something now, and takes the cost if so",
    request_body(content = CheckDto, content_type = "application/json"),
    responses(
        (status = 200, description = "Admitted (or dry_run)", body = Answer, headers(
                ("RateLimit-Limit" = u64, description = "The binding limit's max (absent when no limit applies); also as X-RateLimit-Limit"),
                ("RateLimit-Remaining" = u64, description = "What it has left; also as X-RateLimit-Remaining"),
                ("RateLimit-Reset" = u64, description = "Seconds, rounded up, until it resets; also as X-RateLimit-Reset"),
                ("X-RateLimit-Limit" = u64), ("X-RateLimit-Remaining" = u64), ("X-RateLimit-Reset" = u64)
            )),
        (status = 429, description = "Denied; nothing was consumed. Or, for a reserving check only, an error `resource_exhausted`: the tenant already has `limiter.max_open_holds_per_tenant` open reservations taken on this instance (or the instance `limiter.max_open_holds`), and nothing was decided or charged", body = Refused, headers(
                ("RateLimit-Limit" = u64, description = "The binding limit's max (absent when no limit applies); also as X-RateLimit-Limit"),
                ("RateLimit-Remaining" = u64, description = "What it has left; also as X-RateLimit-Remaining"),
                ("RateLimit-Reset" = u64, description = "Seconds, rounded up, until it resets; also as X-RateLimit-Reset"),
                ("X-RateLimit-Limit" = u64), ("X-RateLimit-Remaining" = u64), ("X-RateLimit-Reset" = u64),
                ("Retry-After" = u64, description = "Seconds (at least 1) until the same request could be admitted; absent when it never can")
            )),
        (status = 400, description = "invalid_argument: a bad body, naming the field", body = ErrorBody),
        (status = 401, description = "unauthenticated: a check token is configured and this request has none or a wrong one", body = ErrorBody),
        (status = 403, description = "permission_denied: the token may not check for this tenant", body = ErrorBody),
        (status = 404, description = "not_found: the tenant has no quota and no default is configured", body = ErrorBody),
        (status = 413, description = "payload_too_large: the body is over 64 KiB", body = ErrorBody),
        (status = 415, description = "unsupported_media_type: the body is not application/json", body = ErrorBody),
        (status = 503, description = "unavailable: a reserving check was admitted but the store could not keep its reservation; nothing was charged", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub async fn check(req: HttpRequest, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    let state = AppState::of(&req)?;
    let who = state.auth.checker(&req).await?;
    let body = json_body(&req, payload).await?;
    let dto: CheckDto = parse_json(&body)?;
    let (p, reserve) = validate_reserving(dto, None, None)?;
    if let Some(w) = &who {
        w.may_check(p.tenant.as_str())?;
    }
    let header = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok());
    if let Some(hold) = reserve {
        return reserve_check(state, &p, hold, header).await;
    }
    let d = state.checks.decide(&p, header).await;
    let d = d.ok_or_else(|| ApiError::no_quota(&p.tenant))?;
    let status = if d.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut res = HttpResponse::build(status);
    rate_headers(&mut res, &d);
    Ok(res.json(Answer::of(&d)))
}

/// A check that asks to reserve: decided, and when admitted its reservation taken.
async fn reserve_check<'h>(
    state: &AppState,
    p: &Parsed<'_>,
    hold: Option<i64>,
    header: impl Fn(&str) -> Option<&'h str>,
) -> Result<HttpResponse, ApiError> {
    let place = state
        .holds
        .claim(p.tenant.as_str())
        .map_err(|full| ApiError::ResourceExhausted(open_holds_full(full)))?;
    let decided = state.checks.decide_reserving(p, header).await;
    let (d, policy, now) = decided.ok_or_else(|| ApiError::no_quota(&p.tenant))?;
    let mut answer = Answer::of(&d);
    if d.allowed {
        let hold_ms = crate::domain::hold_ms(hold, policy.hold_ms);
        let h = state
            .holds
            .take(place, &policy, p, &d, now, hold_ms)
            .await
            .map_err(|e| ApiError::Unavailable(format!("the reservation was not kept: {e}")))?;
        answer.reservation = Some(Taken {
            id: h.id,
            estimate: h.estimate,
            expires_at: super::reservations::rfc3339(h.expires_ms),
        });
    }
    let status = if d.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut res = HttpResponse::build(status);
    rate_headers(&mut res, &d);
    Ok(res.json(answer))
}

/// The message of a reservation refused because too many are open.
fn open_holds_full(full: crate::holds::Full) -> String {
    match full {
        crate::holds::Full::Tenant(n) => format!(
            "the tenant has {n} open reservations on this instance, as many as \
             limiter.max_open_holds_per_tenant allows; settle or release some first"
        ),
        crate::holds::Full::Process(n) => format!(
            "this instance has {n} open reservations, as many as limiter.max_open_holds \
             allows; try again later"
        ),
    }
}

/// The RateLimit-* (and X-RateLimit-*) headers of a decision, and Retry-After on a denial.
pub(super) fn rate_headers(res: &mut actix_web::HttpResponseBuilder, d: &Decision) {
    if let Some(b) = &d.binding {
        let (limit, remaining, reset) =
            rate_values(b.limit, b.remaining, ceil_secs(b.reset_after_ms));
        res.insert_header((RATELIMIT_LIMIT, limit.clone()));
        res.insert_header((RATELIMIT_REMAINING, remaining.clone()));
        res.insert_header((RATELIMIT_RESET, reset.clone()));
        res.insert_header((X_RATELIMIT_LIMIT, limit));
        res.insert_header((X_RATELIMIT_REMAINING, remaining));
        res.insert_header((X_RATELIMIT_RESET, reset));
    }
    if !d.allowed {
        if let Some(ms) = d.retry_after_ms {
            res.insert_header((header::RETRY_AFTER, HeaderValue::from(ceil_secs(ms).max(1))));
        }
    }
}

/// The three values of the rate headers, each formatted once and shared by its two names.
/// Their digits go in one buffer and each value is a slice of it: one allocation and one shared
/// count for the six headers, where a value of its own was two allocations each (its bytes,
/// and the count its second name shared).
fn rate_values(limit: u64, remaining: u64, reset: i64) -> (HeaderValue, HeaderValue, HeaderValue) {
    let mut digits = Vec::with_capacity(3 * 20);
    let mut put = |n: &str| {
        let at = digits.len();
        digits.extend_from_slice(n.as_bytes());
        at..digits.len()
    };
    let mut n = itoa::Buffer::new();
    let ranges = [
        put(n.format(limit)),
        put(n.format(remaining)),
        put(n.format(reset)),
    ];
    let digits = web::Bytes::from(digits);
    let value = |r: std::ops::Range<usize>| HeaderValue::from_maybe_shared(digits.slice(r));
    let [l, m, r] = ranges;
    match (value(l), value(m), value(r)) {
        (Ok(l), Ok(m), Ok(r)) => (l, m, r),
        // Digits are always a valid value: never taken.
        _ => (limit.into(), remaining.into(), reset.into()),
    }
}

const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The body of a 429 to a check: the limits' answer, or for a reserving check the error of too
/// many open reservations. (For the OpenAPI document only.)
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = CheckRefused)]
#[allow(dead_code)]
enum Refused<'a> {
    Answer(Answer<'a>),
    Error(ErrorBody<'a>),
}

/// One result of a batch: an answer, or the error the check would have got alone.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = CheckBatchItem)]
enum Item<'a> {
    Answer(Answer<'a>),
    Error(ErrorBody<'a>),
}

/// The answer to a batch.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CheckBatchAnswer)]
struct BatchAnswer<'a> {
    results: Vec<Item<'a>>,
}

#[utoipa::path(
    post,
    path = "/v1/check/batch",
    tag = "checks",
    operation_id = "check_batch",
    summary = "Decides 1 to 1000 checks in order, each as if sent alone",
    request_body(content = BatchDto, content_type = "application/json"),
    responses(
        (status = 200, description = "One result per check, in order: an answer, or the error the check would get alone (not_found)", body = BatchAnswer),
        (status = 400, description = "invalid_argument: a bad body or item, naming the field (checks[i].field)", body = ErrorBody),
        (status = 401, description = "unauthenticated: a check token is configured and this request has none or a wrong one", body = ErrorBody),
        (status = 403, description = "permission_denied: the token may not check for a tenant of the batch", body = ErrorBody),
        (status = 413, description = "payload_too_large: the body is over 64 KiB", body = ErrorBody),
        (status = 415, description = "unsupported_media_type: the body is not application/json", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub async fn batch(req: HttpRequest, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    let state = AppState::of(&req)?;
    let who = state.auth.checker(&req).await?;
    let body = json_body(&req, payload).await?;
    let dto: BatchDto = parse_json(&body)?;
    if dto.checks.is_empty() || dto.checks.len() > MAX_BATCH {
        return Err(ApiError::invalid(
            "checks",
            format!("a batch has 1 to {MAX_BATCH} checks"),
        ));
    }
    let mut parsed: Vec<Parsed> = Vec::with_capacity(dto.checks.len());
    for (i, c) in dto.checks.into_iter().enumerate() {
        let p = validate(c, Some(i), parsed.last().map(|p| &p.tenant))?;
        parsed.push(p);
    }
    // Each check is decided as if sent alone, in order; a tenant without a quota, or one the
    // token may not check, gets its own error in place, as it would alone.
    let allowed = |c: &Parsed<'_>| {
        who.as_ref()
            .map_or(Ok(()), |w| w.may_check(c.tenant.as_str()))
    };
    let outcomes = state.checks.decide_batch(&parsed, allowed).await;
    let decisions: Vec<Result<Decision, ApiError>> = outcomes
        .into_iter()
        .zip(&parsed)
        .map(|(o, p)| match o {
            Outcome::Decided(d) => Ok(d),
            Outcome::NoQuota => Err(ApiError::no_quota(&p.tenant)),
            Outcome::NotAllowed(refusal) => Err(refusal.into()),
        })
        .collect();
    let items: Vec<Item> = decisions
        .iter()
        .map(|d| match d {
            Ok(d) => Item::Answer(Answer::of(d)),
            Err(e) => Item::Error(e.body()),
        })
        .collect();
    // One buffer sized for the answer (an item is about 120 bytes), not grown as it is written.
    let mut buf = Vec::with_capacity(16 + 128 * items.len());
    serde_json::to_writer(&mut buf, &BatchAnswer { results: items })
        .map_err(|e| ApiError::Internal(format!("encoding the answer: {e}")))?;
    Ok(HttpResponse::Ok()
        .content_type(header::ContentType::json())
        .body(buf))
}

#[cfg(test)]
mod tests {
    use super::rate_values;

    #[test]
    fn rate_values_are_the_decimal_numbers() {
        for (l, m, r) in [
            (0, 0, 0),
            (1, 0, 1),
            (100_000, 99_999, 60),
            (u64::MAX, u64::MAX - 1, i64::MAX),
        ] {
            let (a, b, c) = rate_values(l, m, r);
            assert_eq!(a.to_str().unwrap(), l.to_string());
            assert_eq!(b.to_str().unwrap(), m.to_string());
            assert_eq!(c.to_str().unwrap(), r.to_string());
        }
    }
}
