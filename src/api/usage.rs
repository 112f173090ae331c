//! `GET /v1/usage/{tenant}/{client}`: what a client has used of each limit that applies to it,
//! read without consuming anything, and the [`UsageView`] it answers with.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::body::{json_body, parse_json};
use super::error::{ApiError, ErrorBody};
use super::params::{path_ids, query};
use super::responses::AdminErrors;
use super::state::AppState;
use std::sync::Arc;

use super::audit::{append, new_entry};
use super::middleware::RequestId;
use crate::domain::{validate_resource, ClientId, LimitId, Policy, Scope, TenantId};
use crate::limiter::Usage;

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct UsageQuery {
    /// Show the limits that would apply to a check on this resource.
    #[param(pattern = "^[ -~]{1,256}$")]
    resource: Option<String>,
}

/// `GET /v1/usage/{tenant}/{client}`.
// `deny_unknown_fields` only tells the OpenAPI document that the answer has no other fields.
// Fields are in alphabetical order, the order serde_json gives a map's keys, which answers
// always had.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Usage)]
pub struct UsageView<'a> {
    client: &'a str,
    limits: Vec<UsageLimit<'a>>,
    tenant: &'a str,
}

/// One applicable limit's count.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageLimit<'a> {
    count: u64,
    #[schema(minimum = 1)]
    limit: u64,
    #[schema(value_type = String, pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    limit_id: &'a str,
    remaining: u64,
    #[schema(minimum = 0)]
    reset_after_ms: i64,
}

impl<'a> UsageLimit<'a> {
    fn of(u: &'a Usage) -> Self {
        UsageLimit {
            count: u.count,
            limit: u.limit,
            limit_id: u.limit_id.as_str(),
            remaining: u.remaining,
            reset_after_ms: u.reset_after_ms,
        }
    }
}

#[utoipa::path(
    get,
    path = "/v1/usage/{tenant}/{client}",
    tag = "usage",
    operation_id = "get_usage",
    summary = "What a client has used of each applicable limit; consumes nothing",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), ("client" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "A client of the tenant", example = "key-123"), UsageQuery),
    responses(
        (status = 200, description = "One entry per applicable limit", body = UsageView),
        (status = 404, description = "not_found: the tenant has no quota", body = ErrorBody),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn usage(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let who = state.auth.admin(&req)?;
    let (tenant, client) = path_ids(&req)?;
    who.may_manage(tenant.as_str())?;
    let client = client.ok_or_else(|| ApiError::invalid("client", "client is required"))?;
    let q: UsageQuery = query(&req)?;
    if let Some(r) = &q.resource {
        validate_resource("resource", r)?;
    }
    let policy = policy_of(&state, &tenant, &client)?;
    answer(&state, &policy, &tenant, &client, q.resource.as_deref()).await
}

/// The policy a client's checks meet: 404 when its tenant has none.
fn policy_of(
    state: &AppState,
    tenant: &TenantId,
    client: &ClientId,
) -> Result<Arc<Policy>, ApiError> {
    state
        .policies
        .resolve(tenant.as_str(), client.as_str())
        .ok_or_else(|| ApiError::no_quota(tenant))
}

/// 200 with the client's usage of the limits a check on `resource` meets.
async fn answer(
    state: &AppState,
    policy: &Policy,
    tenant: &TenantId,
    client: &ClientId,
    resource: Option<&str>,
) -> Result<HttpResponse, ApiError> {
    let usage = state
        .limiter
        .usage(policy, tenant, client, resource)
        .await?;
    Ok(HttpResponse::Ok().json(UsageView {
        client: client.as_str(),
        limits: usage.iter().map(UsageLimit::of).collect(),
        tenant: tenant.as_str(),
    }))
}

/// The body of a reset: all the client's limits, or one.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UsageReset)]
pub struct ResetDto {
    /// Reset only this limit (client-scoped); absent: every client-scoped limit of the client.
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$", example = "per-minute")]
    limit_id: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/usage/{tenant}/{client}/reset",
    tag = "usage",
    operation_id = "reset_usage",
    summary = "Brings a client's consumption to zero now, fleet-wide and durably",
    description = "Adds minus each counted bucket's total in the store, so every instance (at its next sync round for a counter in use) and a restart see zero. Only client-scoped limits are reset: a tenant-scoped limit is shared by every client. Hits admitted in the last sync round before the reset, not yet written, still count. Repeating a reset is harmless (it zeroes again). Recorded in the audit log as `usage.reset`. The body is optional.",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), ("client" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "A client of the tenant", example = "key-123")),
    request_body(content = Option<ResetDto>, content_type = "application/json"),
    responses(
        (status = 200, description = "The client's usage after the reset", body = UsageView),
        (status = 404, description = "not_found: the tenant has no quota", body = ErrorBody),
        (status = 415, description = "unsupported_media_type: a body that is not application/json", body = ErrorBody),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn reset(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let who = state.auth.admin(&req)?;
    let (tenant, client) = path_ids(&req)?;
    who.may_manage(tenant.as_str())?;
    let client = client.ok_or_else(|| ApiError::invalid("client", "client is required"))?;
    // The body is optional: none at all (no Content-Type, nothing sent) resets every limit.
    let has_body = req
        .headers()
        .contains_key(actix_web::http::header::CONTENT_TYPE)
        || req
            .headers()
            .get(actix_web::http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    let dto = if has_body {
        let body = json_body(&req, payload).await?;
        if body.is_empty() {
            ResetDto { limit_id: None }
        } else {
            parse_json::<ResetDto>(&body)?
        }
    } else {
        ResetDto { limit_id: None }
    };
    let policy = policy_of(&state, &tenant, &client)?;
    let only = match &dto.limit_id {
        None => None,
        Some(id) => {
            let id = LimitId::parse_field(id, "limit_id")?;
            match policy.limits.iter().find(|l| l.id == id) {
                None => {
                    return Err(ApiError::invalid(
                        "limit_id",
                        format!("no limit {id} applies to this client"),
                    ))
                }
                Some(l) if l.scope == Scope::Tenant => {
                    return Err(ApiError::invalid(
                        "limit_id",
                        format!("limit {id} is tenant-scoped: shared by every client, a client's reset does not change it"),
                    ))
                }
                Some(_) => Some(id),
            }
        }
    };
    let before = state
        .limiter
        .reset(&policy, &tenant, &client, only.as_ref())
        .await?;
    let counts = |f: &dyn Fn(u64) -> u64| {
        let m: std::collections::BTreeMap<&str, u64> =
            before.iter().map(|(id, n)| (id.as_str(), f(*n))).collect();
        serde_json::to_string(&m).unwrap_or_default()
    };
    let mut entry = new_entry(
        &who.name,
        who.role.as_str(),
        "usage.reset",
        &tenant,
        Some(&client),
        RequestId::of(&req),
    );
    entry.body_before = Some(counts(&|n| n));
    entry.body_after = Some(counts(&|_| 0));
    append(&state, entry).await;
    answer(&state, &policy, &tenant, &client, None).await
}
