//! `POST /v1/check` and `POST /v1/check/batch`.

use std::borrow::Cow;
use std::time::Instant;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::error::{json_error, ApiError};
use super::{json_body, AppState};
use crate::domain::{parse_cost, validate_resource, ClientId, TenantId};
use crate::limiter::{CheckInput, Decision};
use crate::metrics::DecisionLabel;

/// Most checks in one batch.
pub const MAX_BATCH: usize = 1000;

/// A check as sent. Fields are optional here so a missing one gets a message naming it;
/// unknown fields are refused so a typo (`"cots"`) is not silently ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckDto<'a> {
    #[serde(borrow, default)]
    tenant: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    client: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    resource: Option<Cow<'a, str>>,
    #[serde(default)]
    cost: Option<serde_json::Number>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchDto<'a> {
    #[serde(borrow)]
    checks: Vec<CheckDto<'a>>,
}

struct Parsed<'a> {
    tenant: TenantId,
    client: ClientId,
    resource: Option<Cow<'a, str>>,
    cost: u64,
}

fn field(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}.{name}")
    }
}

fn validate<'a>(dto: CheckDto<'a>, prefix: &str) -> Result<Parsed<'a>, ApiError> {
    let tenant = dto
        .tenant
        .ok_or_else(|| ApiError::invalid(field(prefix, "tenant"), "tenant is required"))?;
    let tenant = TenantId::parse_field(&tenant, &field(prefix, "tenant"))?;
    let client = dto
        .client
        .ok_or_else(|| ApiError::invalid(field(prefix, "client"), "client is required"))?;
    let client = ClientId::parse_field(&client, &field(prefix, "client"))?;
    if let Some(r) = &dto.resource {
        validate_resource(&field(prefix, "resource"), r)?;
    }
    let cost = parse_cost(dto.cost.as_ref()).map_err(|mut e| {
        e.field = field(prefix, "cost");
        e
    })?;
    Ok(Parsed {
        tenant,
        client,
        resource: dto.resource,
        cost,
    })
}

#[derive(Serialize)]
struct Answer<'a> {
    allowed: bool,
    limit_id: Option<&'a str>,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_after_ms: Option<i64>,
    retry_after_ms: Option<i64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dry_run_denied: bool,
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
        }
    }
}

/// Decides one parsed check; None when the tenant has no quota.
async fn decide(state: &AppState, p: &Parsed<'_>) -> Option<Decision> {
    let started = Instant::now();
    let policy = state
        .policies
        .resolve(p.tenant.as_str(), p.client.as_str())?;
    let d = state
        .limiter
        .check(
            &policy,
            CheckInput {
                tenant: &p.tenant,
                client: &p.client,
                resource: p.resource.as_deref(),
                cost: p.cost,
            },
        )
        .await;
    let label = if d.binding.is_none() {
        DecisionLabel::NoLimit
    } else if d.dry_run_denied {
        DecisionLabel::DryRunDenied
    } else if d.allowed {
        DecisionLabel::Allowed
    } else {
        DecisionLabel::Denied
    };
    state
        .metrics
        .check_decided(p.tenant.as_str(), label, started.elapsed().as_secs_f64());
    Some(d)
}

fn no_quota(tenant: &TenantId) -> ApiError {
    ApiError::NotFound(format!("tenant {tenant} has no quota"))
}

fn ceil_secs(ms: i64) -> i64 {
    (ms.max(0) + 999) / 1000
}

pub async fn check(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let who = state.auth.checker(&req)?;
    let body = json_body(&req, payload).await?;
    let de = &mut serde_json::Deserializer::from_slice(&body);
    let dto: CheckDto = serde_path_to_error::deserialize(de).map_err(|e| json_error(e, ""))?;
    let p = validate(dto, "")?;
    if let Some(w) = &who {
        w.may_check(p.tenant.as_str())?;
    }
    let d = decide(&state, &p)
        .await
        .ok_or_else(|| no_quota(&p.tenant))?;
    let status = if d.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut res = HttpResponse::build(status);
    if let Some(b) = &d.binding {
        let reset = ceil_secs(b.reset_after_ms);
        for (name, value) in [
            ("RateLimit-Limit", b.limit.to_string()),
            ("RateLimit-Remaining", b.remaining.to_string()),
            ("RateLimit-Reset", reset.to_string()),
            ("X-RateLimit-Limit", b.limit.to_string()),
            ("X-RateLimit-Remaining", b.remaining.to_string()),
            ("X-RateLimit-Reset", reset.to_string()),
        ] {
            res.insert_header((name, value));
        }
    }
    if !d.allowed {
        if let Some(ms) = d.retry_after_ms {
            res.insert_header(("Retry-After", ceil_secs(ms).max(1).to_string()));
        }
    }
    Ok(res.json(Answer::of(&d)))
}

#[derive(Serialize)]
#[serde(untagged)]
enum Item<'a> {
    Answer(Answer<'a>),
    Error(super::error::ErrorBody<'a>),
}

pub async fn batch(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let who = state.auth.checker(&req)?;
    let body = json_body(&req, payload).await?;
    let de = &mut serde_json::Deserializer::from_slice(&body);
    let dto: BatchDto = serde_path_to_error::deserialize(de).map_err(|e| json_error(e, ""))?;
    if dto.checks.is_empty() || dto.checks.len() > MAX_BATCH {
        return Err(ApiError::invalid(
            "checks",
            format!("a batch has 1 to {MAX_BATCH} checks"),
        ));
    }
    let parsed = dto
        .checks
        .into_iter()
        .enumerate()
        .map(|(i, c)| validate(c, &format!("checks[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    // Each check is decided as if sent alone, in order; a tenant without a quota gets its own
    // not_found error in place, as it would alone.
    let mut decisions = Vec::with_capacity(parsed.len());
    for p in &parsed {
        if let Some(Err(e)) = who.as_ref().map(|w| w.may_check(p.tenant.as_str())) {
            decisions.push(Err(e));
            continue;
        }
        decisions.push(decide(&state, p).await.ok_or_else(|| no_quota(&p.tenant)));
    }
    let items: Vec<Item> = decisions
        .iter()
        .map(|d| match d {
            Ok(d) => Item::Answer(Answer::of(d)),
            Err(e) => Item::Error(e.body()),
        })
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "results": items })))
}
