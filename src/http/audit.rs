//! The audit log at the edge: [`record`] appends what an admin route changed, and
//! `GET /v1/audit` pages through the log newest first ([`AuditPage`]). No route edits or
//! deletes an entry; only retention (`audit.retention`) removes old ones.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::ApiError;
use super::middleware::RequestId;
use super::params::{instant, page_size, query, Admin, PAGE_DEFAULT, PAGE_MAX};
use super::responses::AdminErrors;
use super::state::AppState;
use crate::auth::Principal;
use crate::domain::{ClientId, TenantId};
use crate::store::audit::{AuditCursor, AuditEntry, AuditQuery};
use crate::store::{PolicyKey, PolicyRecord};

/// Appends a change to the audit log: `before` and `after` are the record as it was and as it
/// is (None where there was or is none: a create, a delete).
///
/// The change has already been made when this runs, so a failure here does not undo it or fail
/// the request: the entry is logged in full at error level (from where it can be restored) and
/// counted in `quotad_audit_unrecorded_total`.
pub async fn record(
    state: &AppState,
    req: &HttpRequest,
    who: &Principal,
    key: &PolicyKey,
    before: Option<&PolicyRecord>,
    after: Option<&PolicyRecord>,
) {
    let entry = audit_entry(
        &who.name,
        who.role.as_str(),
        key,
        before,
        after,
        RequestId::of(req),
    );
    append(state, entry).await;
}

/// Appends an entry; on failure, logs it in full and counts it (the change stands).
pub async fn append(state: &AppState, entry: AuditEntry) {
    let res = tokio::time::timeout(
        state.store_timeout.max(std::time::Duration::from_secs(2)),
        state.store.append_audit(&entry),
    )
    .await;
    let why = match res {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "timed out".to_owned(),
    };
    state.metrics.unrecorded_audit();
    tracing::error!(
        error = %why,
        entry = %serde_json::to_string(&entry).unwrap_or_default(),
        "the change was made but the audit log could not take its entry"
    );
}

/// An entry of `action` on a tenant (and client) made now by `actor` in `role`, with no versions
/// or bodies yet: every entry starts here.
pub fn new_entry(
    actor: &str,
    role: &str,
    action: &str,
    tenant: &TenantId,
    client: Option<&ClientId>,
    request_id: String,
) -> AuditEntry {
    AuditEntry {
        at: now_ms(),
        id: format!("{:016x}", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
        actor: actor.to_owned(),
        role: role.to_owned(),
        action: action.to_owned(),
        tenant: tenant.to_string(),
        client: client.map(ToString::to_string),
        version_before: None,
        version_after: None,
        body_before: None,
        body_after: None,
        request_id,
    }
}

/// The entry of a change of `key` from `before` to `after` (None after a delete), made now by
/// `actor` in `role`: the API's, and `quotad apply`'s.
pub fn audit_entry(
    actor: &str,
    role: &str,
    key: &PolicyKey,
    before: Option<&PolicyRecord>,
    after: Option<&PolicyRecord>,
    request_id: String,
) -> AuditEntry {
    let kind = if key.client.is_some() {
        "override"
    } else {
        "quota"
    };
    let verb = if after.is_some() { "put" } else { "delete" };
    AuditEntry {
        version_before: before.map(|r| r.version),
        version_after: after.map(|r| r.version),
        body_before: before.map(|r| r.body.clone()),
        body_after: after.map(|r| r.body.clone()),
        ..new_entry(
            actor,
            role,
            &format!("{kind}.{verb}"),
            &key.tenant,
            key.client.as_ref(),
            request_id,
        )
    }
}

/// Entry ids: increasing in one process, so that its changes of one millisecond keep their
/// order; from a random 63-bit start, so that two instances' ids do not meet.
static NEXT_ID: LazyLock<AtomicU64> = LazyLock::new(|| AtomicU64::new(rand::random::<u64>() >> 1));

/// Now, to the millisecond the log keeps.
fn now_ms() -> chrono::DateTime<Utc> {
    let ms = Utc::now().timestamp_millis();
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct AuditParams {
    /// Only this tenant's changes. Without it: every tenant's for an admin token, the token's
    /// own tenants' for a tenant_admin token.
    #[param(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    tenant: Option<String>,
    /// Changes made at or after this time (RFC 3339); default: the oldest kept.
    #[param(format = DateTime, example = "2026-11-01T00:00:00Z")]
    from: Option<String>,
    /// Changes made before this time (RFC 3339); default: now.
    #[param(format = DateTime, example = "2026-12-01T00:00:00Z")]
    to: Option<String>,
    /// Page size.
    #[param(value_type = u32, required = false, minimum = 1, maximum = 1000, default = 100)]
    limit: Option<String>,
    /// Continue after this entry: the previous page's `next`.
    #[param(pattern = "^[0-9]{1,16}\\.[0-9a-f]{1,64}$")]
    after: Option<String>,
    /// Only this action (`quota.put`, `quota.delete`, `override.put`, `override.delete`,
    /// `usage.reset`, `usage.grant`).
    #[param(value_type = Option<AuditAction>)]
    action: Option<String>,
    /// Only changes of this client (overrides, resets, grants).
    #[param(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    client: Option<String>,
    /// Only changes made by this token name.
    #[param(min_length = 1, max_length = 128)]
    actor: Option<String>,
}

/// What an audit entry records (for the document: the filter takes these).
#[derive(serde::Serialize, ToSchema)]
#[allow(dead_code)]
pub enum AuditAction {
    #[serde(rename = "quota.put")]
    QuotaPut,
    #[serde(rename = "quota.delete")]
    QuotaDelete,
    #[serde(rename = "override.put")]
    OverridePut,
    #[serde(rename = "override.delete")]
    OverrideDelete,
    #[serde(rename = "usage.reset")]
    UsageReset,
    #[serde(rename = "usage.grant")]
    UsageGrant,
}

/// With a filter, the most entries one request reads looking for its page: past it, the page
/// may hold fewer than `limit` entries, and `next` continues the search.
const FILTER_SCAN_MAX: usize = 5_000;
/// Entries read a round while filtering.
const FILTER_BATCH: usize = 200;

/// What `action`, `client` and `actor` keep.
struct Filter {
    action: Option<String>,
    client: Option<String>,
    actor: Option<String>,
}

impl Filter {
    fn of(q: &AuditParams) -> Result<Option<Filter>, ApiError> {
        if let Some(a) = &q.action {
            if a.is_empty()
                || a.len() > 64
                || !a
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c == b'.' || c == b'_')
            {
                return Err(ApiError::invalid(
                    "action",
                    "action is like quota.put or usage.reset",
                ));
            }
        }
        if let Some(c) = &q.client {
            ClientId::parse_field(c, "client")?;
        }
        if let Some(a) = &q.actor {
            if a.is_empty() || a.len() > 128 || !a.bytes().all(|c| (0x20..0x7f).contains(&c)) {
                return Err(ApiError::invalid(
                    "actor",
                    "actor must be 1 to 128 printable ASCII characters",
                ));
            }
        }
        let f = Filter {
            action: q.action.clone(),
            client: q.client.clone(),
            actor: q.actor.clone(),
        };
        Ok((f.action.is_some() || f.client.is_some() || f.actor.is_some()).then_some(f))
    }

    fn keeps(&self, e: &AuditEntry) -> bool {
        self.action.as_ref().is_none_or(|a| *a == e.action)
            && self
                .client
                .as_ref()
                .is_none_or(|c| e.client.as_ref() == Some(c))
            && self.actor.as_ref().is_none_or(|a| *a == e.actor)
    }
}

/// A page of the audit log, newest first.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditPage {
    entries: Vec<AuditView>,
    /// The `after` of the next page; null on the last page.
    #[schema(required = true, pattern = "^[0-9]{1,16}\\.[0-9a-f]{1,64}$")]
    next: Option<String>,
}

/// One change.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AuditEntry)]
pub struct AuditView {
    /// The change's action: `quota.put`, `quota.delete`, `override.put`, `override.delete`,
    /// `usage.reset`, `usage.grant`.
    #[schema(example = "quota.put")]
    action: String,
    /// The configured name of the token that made it (never the token).
    #[schema(example = "ops-alice")]
    actor: String,
    /// When it was made (UTC, milliseconds).
    #[schema(format = DateTime)]
    at: String,
    /// The policy document after the change; null after a delete.
    #[schema(value_type = Option<Object>, required = true)]
    body_after: Option<serde_json::Value>,
    /// The policy document before the change; null when it created the policy.
    #[schema(value_type = Option<Object>, required = true)]
    body_before: Option<serde_json::Value>,
    /// The client, for an override; null for a tenant's policy.
    #[schema(required = true, pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    client: Option<String>,
    /// Orders entries of the same millisecond.
    #[schema(pattern = "^[0-9a-f]{1,64}$")]
    id: String,
    /// The request's `X-Request-Id` (taken from the request, or made by quotad).
    request_id: String,
    /// The token's role: `admin` or `tenant_admin` (`operator` for `quotad apply`).
    #[schema(example = "admin")]
    role: String,
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    tenant: String,
    #[schema(required = true, minimum = 1)]
    version_after: Option<u64>,
    #[schema(required = true, minimum = 1)]
    version_before: Option<u64>,
}

impl AuditView {
    /// An entry as the API (and `quotad audit`) shows it.
    pub fn of(e: AuditEntry) -> Self {
        // Bodies are the canonical documents the store holds: JSON, shown as objects.
        let doc = |b: Option<String>| {
            b.map(|s| serde_json::from_str(&s).unwrap_or(serde_json::Value::String(s)))
        };
        AuditView {
            at: e.at.to_rfc3339_opts(SecondsFormat::Millis, true),
            id: e.id,
            actor: e.actor,
            role: e.role,
            action: e.action,
            tenant: e.tenant,
            client: e.client,
            version_before: e.version_before,
            version_after: e.version_after,
            body_before: doc(e.body_before),
            body_after: doc(e.body_after),
            request_id: e.request_id,
        }
    }
}

fn cursor_text(c: &AuditCursor) -> String {
    format!("{}.{}", c.at_ms, c.id)
}

fn parse_cursor(s: &str) -> Result<AuditCursor, ApiError> {
    let bad = || ApiError::invalid("after", "after must be the `next` of a previous page");
    let (at, id) = s.split_once('.').ok_or_else(bad)?;
    let ok_id = (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit());
    match at.parse::<i64>() {
        Ok(at_ms) if ok_id && at.len() <= 16 => Ok(AuditCursor {
            at_ms,
            id: id.to_owned(),
        }),
        _ => Err(bad()),
    }
}

/// The newest `limit` entries of the scopes before `before`, newest first: each scope's newest
/// `limit`, merged (any of the overall newest is among its own scope's).
async fn newest(
    state: &AppState,
    scopes: &[Option<String>],
    from: i64,
    to: i64,
    before: Option<AuditCursor>,
    limit: usize,
) -> Result<Vec<AuditEntry>, ApiError> {
    let mut entries = Vec::new();
    for scope in scopes {
        let page = state
            .store
            .audit_page(&AuditQuery {
                tenant: scope.clone(),
                from,
                to,
                before: before.clone(),
                limit,
            })
            .await?;
        entries.extend(page);
    }
    entries.sort_by_key(|e| std::cmp::Reverse(e.cursor()));
    entries.truncate(limit);
    Ok(entries)
}

#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "audit",
    operation_id = "list_audit",
    summary = "Every quota change, newest first, a page at a time",
    params(AuditParams),
    responses(
        (status = 200, description = "A page; `next` is the `after` of the next page, null on the last", body = AuditPage),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    Admin(who): Admin,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let q: AuditParams = query(&req)?;
    let tenant = q
        .tenant
        .as_deref()
        .map(|t| TenantId::parse_field(t, "tenant"))
        .transpose()?;
    if let Some(t) = &tenant {
        who.may_manage(t.as_str())?;
    }
    let limit = page_size(q.limit.as_deref(), PAGE_DEFAULT, PAGE_MAX)?;
    let from = instant("from", q.from.as_deref())?.unwrap_or(0);
    // Entries another instance wrote with a clock slightly ahead are still in "now".
    let to =
        instant("to", q.to.as_deref())?.unwrap_or_else(|| Utc::now().timestamp_millis() + 60_000);
    if from >= to {
        return Err(ApiError::invalid("to", "to must be after from"));
    }
    let before = q.after.as_deref().map(parse_cursor).transpose()?;
    let scopes: Vec<Option<String>> = match (&tenant, who.tenants()) {
        (Some(t), _) => vec![Some(t.to_string())],
        (None, None) => vec![None],
        // A tenant admin's view of "all": its own tenants' logs, merged.
        (None, Some(own)) => own.into_iter().map(|t| Some(t.to_owned())).collect(),
    };
    let filter = Filter::of(&q)?;
    let (entries, next) = match filter {
        None => {
            let mut entries = newest(&state, &scopes, from, to, before, limit + 1).await?;
            let more = entries.len() > limit;
            entries.truncate(limit);
            let next = more
                .then(|| entries.last().map(|e| cursor_text(&e.cursor())))
                .flatten();
            (entries, next)
        }
        Some(f) => {
            // Read newest first a batch at a time, keeping what the filter keeps, until the
            // page is full, the log ends, or FILTER_SCAN_MAX entries were read.
            let (mut kept, mut scanned, mut cursor) = (Vec::new(), 0usize, before);
            let mut next = None;
            loop {
                let batch = newest(&state, &scopes, from, to, cursor.clone(), FILTER_BATCH).await?;
                let ended = batch.len() < FILTER_BATCH;
                for e in batch {
                    scanned += 1;
                    cursor = Some(e.cursor());
                    if f.keeps(&e) {
                        kept.push(e);
                        if kept.len() == limit {
                            break;
                        }
                    }
                }
                if kept.len() == limit || (!ended && scanned >= FILTER_SCAN_MAX) {
                    next = cursor.as_ref().map(cursor_text);
                    break;
                }
                if ended {
                    break;
                }
            }
            (kept, next)
        }
    };
    Ok(HttpResponse::Ok().json(AuditPage {
        entries: entries.into_iter().map(AuditView::of).collect(),
        next,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_what_they_wrote() {
        let c = AuditCursor {
            at_ms: 1_795_000_000_123,
            id: "00ff12ab00ff12ab".into(),
        };
        assert_eq!(parse_cursor(&cursor_text(&c)).unwrap(), c);
        for bad in ["", "12", "x.ab", "12.", "12.zz", "-1x.ab"] {
            assert!(parse_cursor(bad).is_err(), "{bad}");
        }
    }
}
