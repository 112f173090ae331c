//! `GET /v1/whoami`: who the request's token is (its name, role and tenants), so that a console
//! can say who is signed in and offer only what the token may do.

use actix_web::HttpResponse;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::ApiError;
use super::params::Admin;
use super::responses::AdminErrors;

/// The token's name (the audit log's actor), role, and the tenants it may manage.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WhoAmI {
    /// The token's configured name, as the audit log names its changes.
    name: String,
    /// `admin` (every tenant) or `tenant_admin` (the listed tenants).
    #[schema(value_type = WhoRole)]
    role: &'static str,
    /// The tenants a tenant_admin may manage, sorted; null for an admin (every tenant).
    #[schema(required = true)]
    tenants: Option<Vec<String>>,
}

/// The roles that may ask (for the document).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum WhoRole {
    Admin,
    TenantAdmin,
}

#[utoipa::path(
    get,
    path = "/v1/whoami",
    tag = "ops",
    operation_id = "whoami",
    summary = "Who this admin or tenant_admin token is: its name, role and tenants",
    responses(
        (status = 200, description = "The token's name, role and tenants", body = WhoAmI),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn whoami(Admin(who): Admin) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(WhoAmI {
        name: who.name.to_string(),
        role: who.role.as_str(),
        tenants: who
            .tenants()
            .map(|t| t.into_iter().map(str::to_owned).collect()),
    }))
}
