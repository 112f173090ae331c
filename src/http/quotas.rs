//! `/v1/quotas`: tenants' policies and clients' overrides (admin), and the [`PolicyView`] and
//! [`QuotaList`] they answer with. A change is enforced at once by this instance (its policy
//! cache reloads) and by the others within `quotas.refresh_ms`.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::audit;
use super::body::{json_body, parse_json};
use super::error::{ApiError, ErrorBody};
use super::params::{page_size, query, Admin, Managed, PAGE_DEFAULT, PAGE_MAX};
use super::responses::{AdminErrors, BodyErrors};
use super::state::AppState;
use crate::domain::{
    ClientId, Consistency, LimitDoc, Mode, OnStoreFailure, Policy, PolicyDoc, TenantId,
};
use crate::store::{PolicyKey, PolicyRecord};

/// A policy as the admin API shows it: the canonical document, every default spelled out, with
/// its bookkeeping.
// `deny_unknown_fields` only tells the OpenAPI document that it has no other fields. Fields are
// in alphabetical order, the order serde_json gives a map's keys, which answers always had.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PolicyRecord)]
pub struct PolicyView {
    /// Present on a client override.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    client: Option<String>,
    // `consistency`, `mode` and `on_store_failure` are always there: the store holds the
    // canonical document (`put` writes `Policy::to_doc`), passed on as stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Consistency, required = true)]
    consistency: Option<String>,
    #[schema(min_items = 1, max_items = 16)]
    limits: Vec<LimitDoc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Mode, required = true)]
    mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = OnStoreFailure, required = true)]
    on_store_failure: Option<String>,
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    tenant: String,
    #[schema(format = DateTime)]
    updated_at: String,
    /// 1 on creation, one more at each replacement.
    #[schema(minimum = 1)]
    version: u64,
}

impl PolicyView {
    /// The stored record as the API shows it.
    fn of(r: &PolicyRecord) -> Result<Self, ApiError> {
        let doc: PolicyDoc = serde_json::from_str(&r.body)
            .map_err(|e| ApiError::Internal(format!("stored policy is not a policy: {e}")))?;
        Ok(PolicyView {
            tenant: r.key.tenant.to_string(),
            client: r.key.client.as_ref().map(ToString::to_string),
            limits: doc.limits,
            mode: doc.mode,
            consistency: doc.consistency,
            on_store_failure: doc.on_store_failure,
            version: r.version,
            updated_at: r.updated_at.to_rfc3339(),
        })
    }
}

/// A page of `GET /v1/quotas`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaList {
    /// The `after` of the next page; null on the last page.
    #[schema(required = true, pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    next: Option<String>,
    quotas: Vec<PolicyView>,
}

async fn put(
    Managed {
        who,
        tenant,
        client,
    }: Managed,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = json_body(&req, payload).await?;
    let doc: PolicyDoc = parse_json(&body)?;
    let policy = Policy::from_doc(&doc, client.is_some())?;
    let canonical =
        serde_json::to_string(&policy.to_doc()).map_err(|e| ApiError::Internal(e.to_string()))?;
    let key = PolicyKey { tenant, client };
    // What the audit log shows as "before" (concurrent changes of one key may interleave
    // between this read and the write; the versions in the log tell).
    let before = state.store.get_policy(&key).await?;
    if let Some(same) = before.as_ref().filter(|b| b.body == canonical) {
        // Nothing changes: no new version, no audit entry.
        return Ok(HttpResponse::Ok().json(PolicyView::of(same)?));
    }
    let record = state
        .store
        .put_policy(&key, &canonical, chrono::Utc::now())
        .await?;
    audit::record(&state, &req, &who, &key, before.as_ref(), Some(&record)).await;
    // This instance enforces the change at once; the others within quotas.refresh_ms.
    if let Err(e) = state.policies.reload(true).await {
        tracing::warn!(error = %e, "policy saved but the local cache could not reload yet");
    }
    let mut res = if record.version == 1 {
        HttpResponse::Created()
    } else {
        HttpResponse::Ok()
    };
    Ok(res.json(PolicyView::of(&record)?))
}

async fn get(
    Managed { tenant, client, .. }: Managed,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let key = PolicyKey { tenant, client };
    match state.store.get_policy(&key).await? {
        Some(r) => Ok(HttpResponse::Ok().json(PolicyView::of(&r)?)),
        None => Err(not_found(&key)),
    }
}

async fn delete(
    Managed {
        who,
        tenant,
        client,
    }: Managed,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let key = PolicyKey { tenant, client };
    let before = state.store.get_policy(&key).await?;
    if !state.store.delete_policy(&key).await? {
        return Err(not_found(&key));
    }
    audit::record(&state, &req, &who, &key, before.as_ref(), None).await;
    if let Err(e) = state.policies.reload(true).await {
        tracing::warn!(error = %e, "policy deleted but the local cache could not reload yet");
    }
    Ok(HttpResponse::NoContent().finish())
}

fn not_found(key: &PolicyKey) -> ApiError {
    match &key.client {
        None => ApiError::no_quota(&key.tenant),
        Some(c) => ApiError::NotFound(format!(
            "tenant {} has no override for client {c}",
            key.tenant
        )),
    }
}

#[utoipa::path(
    put,
    path = "/v1/quotas/{tenant}",
    tag = "quotas",
    operation_id = "put_quota",
    summary = "Creates or replaces a tenant's policy",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme")),
    request_body(content = PolicyDoc, content_type = "application/json"),
    responses(
        (status = 200, description = "Replaced", body = PolicyView),
        (status = 201, description = "Created", body = PolicyView),
        BodyErrors,
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn put_tenant(
    m: Managed,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    put(m, req, payload, state).await
}

#[utoipa::path(
    get,
    path = "/v1/quotas/{tenant}",
    tag = "quotas",
    operation_id = "get_quota",
    summary = "A tenant's policy",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme")),
    responses(
        (status = 200, description = "The policy", body = PolicyView),
        (status = 404, description = "not_found: the tenant has no quota", body = ErrorBody),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn get_tenant(m: Managed, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    get(m, state).await
}

#[utoipa::path(
    delete,
    path = "/v1/quotas/{tenant}",
    tag = "quotas",
    operation_id = "delete_quota",
    summary = "Deletes a tenant's policy (its client overrides stay)",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "not_found: the tenant has no quota", body = ErrorBody),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn delete_tenant(
    m: Managed,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    delete(m, req, state).await
}

#[utoipa::path(
    put,
    path = "/v1/quotas/{tenant}/clients/{client}",
    tag = "quotas",
    operation_id = "put_override",
    summary = "Creates or replaces a client's override of its tenant's policy",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), ("client" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "A client of the tenant", example = "key-123")),
    request_body(content = PolicyDoc, content_type = "application/json"),
    responses(
        (status = 200, description = "Replaced", body = PolicyView),
        (status = 201, description = "Created", body = PolicyView),
        BodyErrors,
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn put_client(
    m: Managed,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    put(m, req, payload, state).await
}

#[utoipa::path(
    get,
    path = "/v1/quotas/{tenant}/clients/{client}",
    tag = "quotas",
    operation_id = "get_override",
    summary = "A client's override",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), ("client" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "A client of the tenant", example = "key-123")),
    responses(
        (status = 200, description = "The override", body = PolicyView),
        (status = 404, description = "not_found: the tenant has no override for this client", body = ErrorBody),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn get_client(m: Managed, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    get(m, state).await
}

#[utoipa::path(
    delete,
    path = "/v1/quotas/{tenant}/clients/{client}",
    tag = "quotas",
    operation_id = "delete_override",
    summary = "Deletes a client's override",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), ("client" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "A client of the tenant", example = "key-123")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "not_found: the tenant has no override for this client", body = ErrorBody),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn delete_client(
    m: Managed,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    delete(m, req, state).await
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Page size.
    #[param(value_type = u32, required = false, minimum = 1, maximum = 1000, default = 100)]
    limit: Option<String>,
    /// Start after this tenant (the previous page's `next`).
    #[param(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    after: Option<String>,
    /// Only tenants whose id starts with this.
    #[param(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    prefix: Option<String>,
}

/// The characters of an id, in byte order (`domain::validate_id`).
const ID_CHARS: &str = "-.0123456789:@ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~";

/// The greatest id that sorts before every id starting with `prefix` (a list's `after`), or
/// None when none does (`prefix` is the smallest id there is).
fn just_before(prefix: &str) -> Option<String> {
    let last = prefix.chars().last()?;
    let head = &prefix[..prefix.len() - last.len_utf8()];
    match ID_CHARS.find(last) {
        // The smallest character: the prefix without it sorts before, and nothing between.
        Some(0) | None => (!head.is_empty()).then(|| head.to_owned()),
        // The previous character, then the greatest characters up to the longest id.
        Some(i) => {
            let mut s = format!("{head}{}", &ID_CHARS[i - 1..i]);
            while s.len() < crate::domain::MAX_ID_LEN {
                s.push('~');
            }
            Some(s)
        }
    }
}

#[utoipa::path(
    get,
    path = "/v1/quotas",
    tag = "quotas",
    operation_id = "list_quotas",
    summary = "Tenants' policies in tenant order, a page at a time",
    params(ListQuery),
    responses(
        (status = 200, description = "A page; `next` is the `after` of the next page, null on the last", body = QuotaList),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    Admin(who): Admin,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let q: ListQuery = query(&req)?;
    let limit = page_size(q.limit.as_deref(), PAGE_DEFAULT, PAGE_MAX)?;
    let mut after = q
        .after
        .as_deref()
        .map(|a| TenantId::parse_field(a, "after"))
        .transpose()?;
    let prefix = q
        .prefix
        .as_deref()
        .map(|p| TenantId::parse_field(p, "prefix"))
        .transpose()?;
    if let Some(p) = &prefix {
        // Start where the prefix's tenants start, unless the page's cursor is past it.
        let start = just_before(p.as_str())
            .map(|s| TenantId::parse_field(&s, "prefix"))
            .transpose()?;
        if after
            .as_ref()
            .is_none_or(|a| start.as_ref().is_some_and(|s| s > a))
        {
            after = start;
        }
    }
    let in_prefix = |t: &TenantId| {
        prefix
            .as_ref()
            .is_none_or(|p| t.as_str().starts_with(p.as_str()))
    };
    let mut records = Vec::new();
    if let Some(scope) = who.tenants() {
        // A tenant admin sees only its tenants: read those (a handful), never the whole list.
        for t in scope {
            let Ok(tenant) = TenantId::parse(t) else {
                continue; // refused by the configuration's checks before we get here
            };
            if after.as_ref().is_some_and(|a| &tenant <= a) || !in_prefix(&tenant) {
                continue;
            }
            let key = PolicyKey {
                tenant,
                client: None,
            };
            if let Some(r) = state.store.get_policy(&key).await? {
                records.push(r);
                if records.len() > limit {
                    break;
                }
            }
        }
    } else {
        let mut cursor = after;
        loop {
            let page = state
                .store
                .list_policies(cursor.as_ref(), limit + 1)
                .await?;
            let mut end = page.len() <= limit;
            cursor = page.last().map(|r| r.key.tenant.clone());
            for r in page {
                if !in_prefix(&r.key.tenant) {
                    if prefix
                        .as_ref()
                        .is_some_and(|p| r.key.tenant.as_str() > p.as_str())
                    {
                        end = true;
                        break;
                    }
                    continue;
                }
                if who.sees(r.key.tenant.as_str()) {
                    records.push(r);
                }
            }
            if end || records.len() > limit {
                break;
            }
        }
    }
    let more = records.len() > limit;
    records.truncate(limit);
    let next = if more {
        records.last().map(|r| r.key.tenant.to_string())
    } else {
        None
    };
    let quotas = records
        .iter()
        .map(PolicyView::of)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HttpResponse::Ok().json(QuotaList { quotas, next }))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct OverridesQuery {
    /// Page size.
    #[param(value_type = u32, required = false, minimum = 1, maximum = 1000, default = 100)]
    limit: Option<String>,
    /// Start after this client (the previous page's `next`).
    #[param(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    after: Option<String>,
}

/// A page of `GET /v1/quotas/{tenant}/clients`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OverrideList {
    /// The `after` of the next page; null on the last page.
    #[schema(required = true, pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    next: Option<String>,
    overrides: Vec<PolicyView>,
}

#[utoipa::path(
    get,
    path = "/v1/quotas/{tenant}/clients",
    tag = "quotas",
    operation_id = "list_overrides",
    summary = "A tenant's client overrides in client order, a page at a time",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), OverridesQuery),
    responses(
        (status = 200, description = "A page; `next` is the `after` of the next page, null on the last", body = OverrideList),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn list_overrides(
    Managed { tenant, .. }: Managed,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let q: OverridesQuery = query(&req)?;
    let limit = page_size(q.limit.as_deref(), PAGE_DEFAULT, PAGE_MAX)?;
    let after = q
        .after
        .as_deref()
        .map(|a| ClientId::parse_field(a, "after"))
        .transpose()?;
    let mut records = state
        .store
        .list_overrides(&tenant, after.as_ref(), limit + 1)
        .await?;
    let more = records.len() > limit;
    records.truncate(limit);
    let next = if more {
        records
            .last()
            .and_then(|r| r.key.client.as_ref().map(ToString::to_string))
    } else {
        None
    };
    let overrides = records
        .iter()
        .map(PolicyView::of)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HttpResponse::Ok().json(OverrideList { overrides, next }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn just_before_sorts_before_every_id_with_the_prefix_and_after_the_others() {
        assert_eq!(just_before("-"), None);
        assert_eq!(just_before("a-").as_deref(), Some("a"));
        let b = just_before("ac").unwrap();
        assert!(b.starts_with("ab~") && b.len() == crate::domain::MAX_ID_LEN);
        for id in ["ac", "ac-", "ac~~", "acme"] {
            assert!(b.as_str() < id, "{b} < {id}");
        }
        for id in ["ab", "ab~", "abz", "a"] {
            assert!(b.as_str() >= id, "{b} >= {id}");
        }
        // Every character of an id, in byte order.
        let mut sorted: Vec<char> = ID_CHARS.chars().collect();
        sorted.sort();
        assert_eq!(sorted.into_iter().collect::<String>(), ID_CHARS);
        assert!(ID_CHARS
            .chars()
            .all(|c| crate::domain::validate_id("x", &c.to_string()).is_ok()));
    }
}
