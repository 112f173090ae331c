//! `GET /v1/usage/{tenant}/{client}`: what a client has used of each limit that applies to it,
//! read without consuming anything, and the [`UsageView`] it answers with.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::params::{query, Managed};
use super::responses::AdminErrors;
use super::state::AppState;
use std::sync::Arc;

use crate::domain::{validate_resource, ClientId, InFlight, Policy, Scope, TenantId};
use crate::limiter::Usage;

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct UsageQuery {
    /// Show the limits that would apply to a check on this resource.
    #[param(pattern = "^[ -~]{1,256}$")]
    resource: Option<String>,
    /// `true`: show every limit of the client's policy, whatever resource it names (not with
    /// `resource`).
    #[param(value_type = bool, required = false, default = false)]
    all: Option<String>,
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
    pub(super) limits: Vec<UsageLimit<'a>>,
    tenant: &'a str,
}

/// One applicable limit's count.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageLimit<'a> {
    /// For an in-flight limit: the reservations (or their cost) held now.
    count: u64,
    /// Present for an in-flight limit: what it counts of the reservations held at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<InFlight>)]
    in_flight: Option<&'static str>,
    #[schema(minimum = 1)]
    limit: u64,
    #[schema(value_type = String, pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    limit_id: &'a str,
    remaining: u64,
    /// 0 for an in-flight limit: its count falls as reservations end.
    #[schema(minimum = 0)]
    reset_after_ms: i64,
    /// The limit's resource pattern; null when it counts checks whatever their resource.
    #[schema(required = true, pattern = "^[ -~]{1,256}$")]
    resource: Option<&'a str>,
    /// Whose checks the limit counts: this client's, or all the tenant's clients'.
    #[schema(value_type = Scope)]
    scope: &'static str,
}

impl<'a> UsageLimit<'a> {
    fn of(u: &'a Usage) -> Self {
        UsageLimit {
            count: u.count,
            in_flight: u.in_flight.map(|f| f.as_str()),
            limit: u.limit,
            limit_id: u.limit_id.as_str(),
            remaining: u.remaining,
            reset_after_ms: u.reset_after_ms,
            resource: u.resource.as_deref(),
            scope: u.scope.as_str(),
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
pub async fn usage(
    Managed { tenant, client, .. }: Managed,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let client = client.ok_or_else(|| ApiError::invalid("client", "client is required"))?;
    let q: UsageQuery = query(&req)?;
    if let Some(r) = &q.resource {
        validate_resource("resource", r)?;
    }
    let all = match q.all.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ApiError::invalid("all", "all must be true or false")),
    };
    if all && q.resource.is_some() {
        return Err(ApiError::invalid(
            "all",
            "all=true shows every limit: it takes no resource",
        ));
    }
    let policy = policy_of(&state, &tenant, &client)?;
    if all {
        let usage = state
            .limiter
            .usage_of_every_limit(&policy, &tenant, &client)
            .await?;
        return Ok(HttpResponse::Ok().json(UsageView::of(&tenant, &client, &usage)));
    }
    answer(&state, &policy, &tenant, &client, q.resource.as_deref()).await
}

/// The policy a client's checks meet: 404 when its tenant has none.
pub(super) fn policy_of(
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
    Ok(HttpResponse::Ok().json(UsageView::of(tenant, client, &usage)))
}

impl<'a> UsageView<'a> {
    pub(super) fn of(tenant: &'a TenantId, client: &'a ClientId, usage: &'a [Usage]) -> Self {
        UsageView {
            client: client.as_str(),
            limits: usage.iter().map(UsageLimit::of).collect(),
            tenant: tenant.as_str(),
        }
    }
}

/// Clients of the day's most active that `nearest` reads the usage of.
const NEAREST_CANDIDATES: usize = 200;

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct NearestQuery {
    /// How many clients.
    #[param(value_type = u32, required = false, minimum = 1, maximum = 100, default = 10)]
    limit: Option<String>,
}

/// `GET /v1/usage/{tenant}/nearest`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NearestClients)]
pub struct NearestView {
    /// Nearest first.
    clients: Vec<NearestClient>,
    /// How many clients were looked at: the most active of today and yesterday (UTC), at most
    /// 200.
    considered: u64,
    tenant: String,
}

/// A client and the limit it is nearest to.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NearestClient {
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    client: String,
    count: u64,
    #[schema(minimum = 1)]
    limit: u64,
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    limit_id: String,
    remaining: u64,
    #[schema(minimum = 0)]
    reset_after_ms: i64,
    /// `count / limit`: 1 is at the limit.
    #[schema(minimum = 0)]
    used: f64,
}

#[utoipa::path(
    get,
    path = "/v1/usage/{tenant}/nearest",
    tag = "usage",
    operation_id = "nearest_clients",
    summary = "The clients nearest to one of their limits now",
    description = "Looks at the tenant's most active clients of today and yesterday (UTC, from the usage history; at most 200, by cost and denials) and reads each one's usage now, as `GET /v1/usage/{tenant}/{client}` does: the clients whose fullest limit is fullest come first. A client literally named `nearest` cannot have its usage read at `/v1/usage/{tenant}/nearest`.",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), NearestQuery),
    responses(
        (status = 200, description = "Nearest first", body = NearestView),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn nearest(
    Managed { tenant, .. }: Managed,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    let q: NearestQuery = query(&req)?;
    let limit = super::params::page_size(q.limit.as_deref(), 10, 100)?;
    let now = state.limiter.clock().now_ms();
    let day = crate::store::history::DAY_MS;
    let today = now - now.rem_euclid(day);
    let mut seen = state
        .store
        .clients_seen(tenant.as_str(), today - day, today + day)
        .await?;
    // A client seen both days is listed once a day: sum them.
    seen.sort_unstable_by(|a, b| a.client.cmp(&b.client));
    seen.dedup_by(|later, first| {
        if later.client == first.client {
            first.cost += later.cost;
            first.denied += later.denied;
            true
        } else {
            false
        }
    });
    seen.sort_unstable_by(|a, b| {
        (b.cost + b.denied)
            .cmp(&(a.cost + a.denied))
            .then_with(|| a.client.cmp(&b.client))
    });
    seen.truncate(NEAREST_CANDIDATES);
    let considered = seen.len() as u64;
    let state = &state;
    let tenant = &tenant;
    let mut found: Vec<NearestClient> = stream::iter(seen)
        .map(|c| async move {
            let Ok(client) = ClientId::parse(&c.client) else {
                return Ok(None);
            };
            let Some(policy) = state.policies.resolve(tenant.as_str(), client.as_str()) else {
                return Ok(None);
            };
            let usage = state
                .limiter
                .usage_of_every_limit(&policy, tenant, &client)
                .await?;
            // The fullest; of equally full limits, the one the policy lists first.
            let f = |u: &Usage| u.count as f64 / u.limit.max(1) as f64;
            let fullest = usage
                .into_iter()
                .reduce(|best, u| if f(&u) > f(&best) { u } else { best });
            Ok::<_, ApiError>(fullest.map(|u| NearestClient {
                client: c.client,
                count: u.count,
                limit: u.limit,
                used: u.count as f64 / u.limit.max(1) as f64,
                limit_id: u.limit_id.to_string(),
                remaining: u.remaining,
                reset_after_ms: u.reset_after_ms,
            }))
        })
        .buffer_unordered(16)
        .try_filter_map(|x| async move { Ok(x) })
        .try_collect()
        .await?;
    found.sort_by(|a, b| {
        b.used
            .total_cmp(&a.used)
            .then_with(|| a.client.cmp(&b.client))
    });
    found.truncate(limit);
    Ok(HttpResponse::Ok().json(NearestView {
        clients: found,
        considered,
        tenant: tenant.to_string(),
    }))
}
