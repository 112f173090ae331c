//! The path and query of the admin routes, parsed into domain types; a bad one is a 400 naming it.
//! The caller of an admin route, with the tenant it asks about: [`Managed`] and [`Admin`].

use actix_web::{web, HttpRequest};
use serde::Deserialize;

use super::error::ApiError;
use super::state::AppState;
use crate::auth::Principal;
use crate::domain::{ClientId, TenantId};

/// An admin request about one tenant, as every admin route on `/{tenant}[/...]` starts: a token
/// that may use the admin API (401/403), the path's tenant and client (400 when malformed),
/// and a caller that may manage that tenant (403). Said once, as an extractor.
pub struct Managed {
    pub who: Principal,
    pub tenant: TenantId,
    pub client: Option<ClientId>,
}

impl Managed {
    async fn of(req: &HttpRequest) -> Result<Self, ApiError> {
        let who = AppState::of(req)?.auth.admin(req).await?;
        let (tenant, client) = path_ids(req)?;
        who.may_manage(tenant.as_str())?;
        Ok(Managed {
            who,
            tenant,
            client,
        })
    }
}

// The futures are boxed: a token's first check may wait for an argon2 run (`crate::auth`).
impl actix_web::FromRequest for Managed {
    type Error = ApiError;
    type Future = futures::future::LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move { Managed::of(&req).await })
    }
}

/// An admin request on no one tenant (the lists, the audit log, `whoami`): a token that may
/// use the admin API.
pub struct Admin(pub Principal);

impl actix_web::FromRequest for Admin {
    type Error = ApiError;
    type Future = futures::future::LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move { Ok(Admin(AppState::of(&req)?.auth.admin(&req).await?)) })
    }
}

/// The `{tenant}` of the path, and its `{client}` when the route has one.
pub fn path_ids(req: &HttpRequest) -> Result<(TenantId, Option<ClientId>), ApiError> {
    let tenant = TenantId::parse(req.match_info().get("tenant").unwrap_or_default())?;
    let client = req
        .match_info()
        .get("client")
        .map(ClientId::parse)
        .transpose()?;
    Ok((tenant, client))
}

/// The query string as `T` (whose `deny_unknown_fields` refuses a misspelt parameter).
pub fn query<T: for<'de> Deserialize<'de>>(req: &HttpRequest) -> Result<T, ApiError> {
    web::Query::<T>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| ApiError::invalid("query", e.to_string()))
}

/// An instant given in the query as RFC 3339 (`2026-11-23T14:00:00Z`), as ms since the epoch.
pub fn instant(field: &str, value: Option<&str>) -> Result<Option<i64>, ApiError> {
    value
        .map(|v| {
            chrono::DateTime::parse_from_rfc3339(v)
                .map(|t| t.timestamp_millis())
                .map_err(|e| {
                    ApiError::invalid(
                        field,
                        format!(
                            "{field} must be an RFC 3339 time such as 2026-11-23T14:00:00Z: {e}"
                        ),
                    )
                })
        })
        .transpose()
}

/// Default and largest page of the listing routes (`GET /v1/quotas`, `GET /v1/audit`).
pub const PAGE_DEFAULT: usize = 100;
pub const PAGE_MAX: usize = 1000;

/// A page size from the query: `default` when absent, else 1..=`max`.
pub fn page_size(value: Option<&str>, default: usize, max: usize) -> Result<usize, ApiError> {
    match value {
        None => Ok(default),
        Some(s) => s
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| ApiError::invalid("limit", format!("limit must be 1..={max}"))),
    }
}
