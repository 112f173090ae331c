//! Changing a client's counts by hand: `POST /v1/usage/{tenant}/{client}/reset` (back to zero)
//! and `.../grant` (a one-off credit). Both are durable and fleet-wide (the store's counts
//! change), honour `Idempotency-Key` ([`super::idempotency`]) and land in the audit log.

use std::collections::BTreeMap;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::audit::{append, new_entry};
use super::body::{json_body, parse_json};
use super::error::{ApiError, ErrorBody};
use super::idempotency::{at_most_once, Failed};
use super::middleware::RequestId;
use super::params::Managed;
use super::responses::AdminErrors;
use super::state::AppState;
use super::usage::{policy_of, UsageLimit, UsageView};
use crate::auth::Principal;
use crate::domain::{ClientId, Limit, LimitId, Policy, Scope, TenantId, MAX_LIMIT};

/// The body of a reset: all the client's limits, or one.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UsageReset)]
pub struct ResetDto {
    /// Reset only this limit (client-scoped); absent: every client-scoped limit of the client.
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$", example = "per-minute")]
    limit_id: Option<String>,
}

/// The body of a grant.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UsageGrant)]
pub struct GrantDto {
    /// The client-scoped limit to credit.
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$", example = "per-day")]
    limit_id: String,
    /// How much to credit: a whole number from 1 to 2^53.
    #[schema(value_type = u64, minimum = 1, maximum = 9007199254740992.0, example = 100)]
    amount: serde_json::Number,
}

/// The answer to a grant: what was credited, and the client's usage after it.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UsageGranted)]
pub struct GrantView<'a> {
    /// What was asked.
    amount: u64,
    client: &'a str,
    /// What was credited: the amount, or for a token bucket what it lacked of full (a bucket
    /// never holds more than its burst).
    granted: u64,
    #[schema(value_type = String, pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    limit_id: &'a str,
    /// Every limit that applies to the client, after the grant.
    limits: Vec<UsageLimit<'a>>,
    tenant: &'a str,
}

/// The caller (admin or tenant_admin of the path's tenant), the tenant and the client.
fn target(m: Managed) -> Result<(Principal, TenantId, ClientId), ApiError> {
    let client = m
        .client
        .ok_or_else(|| ApiError::invalid("client", "client is required"))?;
    Ok((m.who, m.tenant, client))
}

/// The client-scoped limit `id` of `policy`, or a 400 naming `limit_id`.
fn client_limit<'p>(policy: &'p Policy, id: &str, what: &str) -> Result<&'p Limit, ApiError> {
    let id = LimitId::parse_field(id, "limit_id")?;
    match policy.limits.iter().find(|l| l.id == id) {
        None => Err(ApiError::invalid(
            "limit_id",
            format!("no limit {id} applies to this client"),
        )),
        Some(l) if l.scope == Scope::Tenant => Err(ApiError::invalid(
            "limit_id",
            format!("limit {id} is tenant-scoped: shared by every client, a client's {what} does not change it"),
        )),
        Some(l) if l.in_flight.is_some() => Err(ApiError::invalid(
            "limit_id",
            format!("limit {id} counts the reservations held: release or settle them instead of a {what}"),
        )),
        Some(l) => Ok(l),
    }
}

/// A count per limit id, as the audit log keeps a reset's or a grant's before and after.
fn counts_json(counts: impl IntoIterator<Item = (String, i64)>) -> String {
    let m: BTreeMap<String, i64> = counts.into_iter().collect();
    serde_json::to_string(&m).unwrap_or_default()
}

#[utoipa::path(
    post,
    path = "/v1/usage/{tenant}/{client}/reset",
    tag = "usage",
    operation_id = "reset_usage",
    summary = "Brings a client's consumption to zero now, fleet-wide and durably",
    description = "Adds minus each counted bucket's total in the store (for a token bucket, credits what it lacks of full), so every instance (at its next sync round for a counter in use) and a restart see zero. Only client-scoped limits are reset: a tenant-scoped limit is shared by every client. Hits admitted in the last sync round before the reset, not yet written, still count. Repeating a reset is harmless (it zeroes again); with an `Idempotency-Key` a repeat within 24 hours is answered from the first. Recorded in the audit log as `usage.reset`. The body is optional.",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), ("client" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "A client of the tenant", example = "key-123"), ("Idempotency-Key" = Option<String>, Header, pattern = "^[!-~]{1,255}$", description = "Makes a retry safe: the same key with the same request within 24 hours is answered from the first (with `Idempotent-Replayed: true`), on any instance")),
    request_body(content = Option<ResetDto>, content_type = "application/json"),
    responses(
        (status = 200, description = "The client's usage after the reset", body = UsageView),
        (status = 404, description = "not_found: the tenant has no quota", body = ErrorBody),
        (status = 409, description = "conflict: a request with this Idempotency-Key is still at work or ended without a known outcome", body = ErrorBody),
        (status = 415, description = "unsupported_media_type: a body that is not application/json", body = ErrorBody),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn reset(
    m: Managed,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (who, tenant, client) = target(m)?;
    // The body is optional: none at all (no Content-Type, nothing sent) resets every limit.
    let has_body = req.headers().contains_key(header::CONTENT_TYPE)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    let body = if has_body {
        json_body(&req, payload).await?
    } else {
        Default::default()
    };
    let dto = if body.is_empty() {
        ResetDto { limit_id: None }
    } else {
        parse_json::<ResetDto>(&body)?
    };
    let policy = policy_of(&state, &tenant, &client)?;
    let only = match &dto.limit_id {
        None => None,
        Some(id) => Some(client_limit(&policy, id, "reset")?.id.clone()),
    };
    at_most_once(&req, &state, &tenant, &body, || async {
        let before = state
            .limiter
            .reset(&policy, &tenant, &client, only.as_ref())
            .await?;
        let mut entry = new_entry(
            &who.name,
            who.role.as_str(),
            "usage.reset",
            &tenant,
            Some(&client),
            RequestId::of(&req),
        );
        let ids = || before.iter().map(|(id, _)| id.to_string());
        entry.body_before = Some(counts_json(ids().zip(before.iter().map(|b| b.1 as i64))));
        entry.body_after = Some(counts_json(ids().map(|id| (id, 0))));
        append(&state, entry).await;
        usage_json(&state, &policy, &tenant, &client)
            .await
            .map_err(|f| Failed::after_the_change(f.error))
    })
    .await
}

#[utoipa::path(
    post,
    path = "/v1/usage/{tenant}/{client}/grant",
    tag = "usage",
    operation_id = "grant_usage",
    summary = "Credits a client a one-off amount of one limit, fleet-wide and durably",
    description = "Writes minus `amount` into the limit's current bucket in the store, so every instance (at its next sync round for a counter in use) and a restart see it. The credit counts against the current window or period: as long as its bucket is in a sliding window, until a calendar period ends; the client may go beyond `max` by as much (its `remaining` may exceed the limit). A token bucket is topped up, never beyond its burst: `granted` says what was credited. Only client-scoped limits. With an `Idempotency-Key` a repeat within 24 hours is answered from the first; without one, every request credits again. Recorded in the audit log as `usage.grant`.",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), ("client" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "A client of the tenant", example = "key-123"), ("Idempotency-Key" = Option<String>, Header, pattern = "^[!-~]{1,255}$", description = "Makes a retry safe: the same key with the same request within 24 hours is answered from the first (with `Idempotent-Replayed: true`), on any instance")),
    request_body(content = GrantDto, content_type = "application/json"),
    responses(
        (status = 200, description = "What was credited, and the client's usage after it", body = GrantView),
        (status = 404, description = "not_found: the tenant has no quota", body = ErrorBody),
        (status = 409, description = "conflict: a request with this Idempotency-Key is still at work or ended without a known outcome", body = ErrorBody),
        (status = 415, description = "unsupported_media_type: a body that is not application/json", body = ErrorBody),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn grant(
    m: Managed,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (who, tenant, client) = target(m)?;
    let body = json_body(&req, payload).await?;
    let dto: GrantDto = parse_json(&body)?;
    let amount = crate::domain::whole_u64(&dto.amount)
        .filter(|a| (1..=MAX_LIMIT).contains(a))
        .ok_or_else(|| {
            ApiError::invalid(
                "amount",
                format!("amount must be an integer 1..={MAX_LIMIT}"),
            )
        })?;
    let policy = policy_of(&state, &tenant, &client)?;
    let limit = client_limit(&policy, &dto.limit_id, "grant")?;
    at_most_once(&req, &state, &tenant, &body, || async {
        let g = state.limiter.grant(&tenant, &client, limit, amount).await?;
        let mut entry = new_entry(
            &who.name,
            who.role.as_str(),
            "usage.grant",
            &tenant,
            Some(&client),
            RequestId::of(&req),
        );
        let id = limit.id.to_string();
        entry.body_before = Some(counts_json([(id.clone(), g.before)]));
        let after = g
            .before
            .saturating_sub(g.amount.min(i64::MAX as u64) as i64);
        entry.body_after = Some(counts_json([(id, after)]));
        append(&state, entry).await;
        let usage = state
            .limiter
            .usage(&policy, &tenant, &client, None)
            .await
            .map_err(Failed::after_the_change)?;
        let view = UsageView::of(&tenant, &client, &usage);
        serde_json::to_string(&GrantView {
            amount,
            client: client.as_str(),
            granted: g.amount,
            limit_id: limit.id.as_str(),
            limits: view.limits,
            tenant: tenant.as_str(),
        })
        .map_err(|e| Failed::after_the_change(ApiError::Internal(e.to_string())))
    })
    .await
}

/// The client's usage of every limit, as the JSON body of `GET /v1/usage/{tenant}/{client}`.
async fn usage_json(
    state: &AppState,
    policy: &Policy,
    tenant: &TenantId,
    client: &ClientId,
) -> Result<String, Failed> {
    let usage = state.limiter.usage(policy, tenant, client, None).await?;
    serde_json::to_string(&UsageView::of(tenant, client, &usage))
        .map_err(|e| Failed::from(ApiError::Internal(e.to_string())))
}
