//! `/v1/quotas`: tenants' policies and clients' overrides (admin), and the [`PolicyView`] and
//! [`QuotaList`] they answer with. A change is enforced at once by this instance (its policy
//! cache reloads) and by the others within `quotas.refresh_ms`.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::audit;
use super::body::{json_body, parse_json};
use super::error::{ApiError, ErrorBody};
use super::params::{page_size, path_ids, query, PAGE_DEFAULT, PAGE_MAX};
use super::responses::{AdminErrors, BodyErrors};
use super::state::AppState;
use crate::domain::{Consistency, LimitDoc, Mode, OnStoreFailure, Policy, PolicyDoc, TenantId};
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
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let who = state.auth.admin(&req)?;
    let (tenant, client) = path_ids(&req)?;
    who.may_manage(tenant.as_str())?;
    let body = json_body(&req, payload).await?;
    let doc: PolicyDoc = parse_json(&body)?;
    let policy = Policy::from_doc(&doc, client.is_some())?;
    let canonical =
        serde_json::to_string(&policy.to_doc()).map_err(|e| ApiError::Internal(e.to_string()))?;
    let key = PolicyKey { tenant, client };
    // What the audit log shows as "before" (concurrent changes of one key may interleave
    // between this read and the write; the versions in the log tell).
    let before = state.store.get_policy(&key).await?;
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

async fn get(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let who = state.auth.admin(&req)?;
    let (tenant, client) = path_ids(&req)?;
    who.may_manage(tenant.as_str())?;
    let key = PolicyKey { tenant, client };
    match state.store.get_policy(&key).await? {
        Some(r) => Ok(HttpResponse::Ok().json(PolicyView::of(&r)?)),
        None => Err(not_found(&key)),
    }
}

async fn delete(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let who = state.auth.admin(&req)?;
    let (tenant, client) = path_ids(&req)?;
    who.may_manage(tenant.as_str())?;
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
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    put(req, payload, state).await
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
pub async fn get_tenant(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    get(req, state).await
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
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    delete(req, state).await
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
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    put(req, payload, state).await
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
pub async fn get_client(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    get(req, state).await
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
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    delete(req, state).await
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
pub async fn list(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let who = state.auth.admin(&req)?;
    let q: ListQuery = query(&req)?;
    let limit = page_size(q.limit.as_deref(), PAGE_DEFAULT, PAGE_MAX)?;
    let after = q
        .after
        .as_deref()
        .map(|a| TenantId::parse_field(a, "after"))
        .transpose()?;
    // A tenant admin sees only its tenants: read on until the page is full or the list ends.
    let mut records = Vec::new();
    let mut cursor = after;
    loop {
        let page = state
            .store
            .list_policies(cursor.as_ref(), limit + 1)
            .await?;
        let end = page.len() <= limit;
        cursor = page.last().map(|r| r.key.tenant.clone());
        records.extend(page.into_iter().filter(|r| who.sees(r.key.tenant.as_str())));
        if end || records.len() > limit {
            break;
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
