//! The path and query of the admin routes, parsed into domain types; a bad one is a 400 naming it.

use actix_web::{web, HttpRequest};
use serde::Deserialize;

use super::error::ApiError;
use crate::domain::{ClientId, TenantId};

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
