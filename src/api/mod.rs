//! The HTTP API (actix-web): routes, auth, body handling. Handlers parse input into domain types
//! at the edge and hand them to the limiter or the store; every error is an [`ApiError`].

mod admin;
mod check;
pub mod error;
mod openapi;
mod ops;

use std::sync::Arc;

use actix_web::http::header;
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::HttpRequest;
use futures::StreamExt;
use sha2::{Digest, Sha256};

use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::policy::PolicyCache;
use crate::store::DynStore;
pub use error::ApiError;

/// The contract's body limit.
pub const MAX_BODY: usize = 64 * 1024;

/// What handlers share; built once, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub limiter: Arc<Limiter>,
    pub policies: Arc<PolicyCache>,
    pub store: DynStore,
    pub metrics: Arc<Metrics>,
    pub auth: Arc<Auth>,
    pub store_timeout: std::time::Duration,
}

/// Bearer tokens, kept as SHA-256 digests and compared in constant time.
pub struct Auth {
    admin: [u8; 32],
    check: Option<[u8; 32]>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Constant-time equality of two digests.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Auth {
    pub fn new(admin_token: &str, check_token: Option<&str>) -> Self {
        Self {
            admin: digest(admin_token),
            check: check_token.map(digest),
        }
    }

    fn bearer(req: &HttpRequest) -> Result<[u8; 32], ApiError> {
        let value = req
            .headers()
            .get(header::AUTHORIZATION)
            .ok_or(ApiError::Unauthenticated(
                "missing Authorization: Bearer token",
            ))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(ApiError::Unauthenticated(
                "Authorization must be: Bearer <token>",
            ))?;
        Ok(digest(token))
    }

    pub fn require_admin(&self, req: &HttpRequest) -> Result<(), ApiError> {
        let got = Self::bearer(req)?;
        if same(&got, &self.admin) {
            Ok(())
        } else if self.check.as_ref().is_some_and(|c| same(&got, c)) {
            Err(ApiError::PermissionDenied(
                "this token may not use the admin API",
            ))
        } else {
            Err(ApiError::Unauthenticated("invalid token"))
        }
    }

    pub fn require_check(&self, req: &HttpRequest) -> Result<(), ApiError> {
        let Some(check) = &self.check else {
            return Ok(());
        };
        let got = Self::bearer(req)?;
        // The admin token may check too: an admin trying things out should not need two.
        if same(&got, check) || same(&got, &self.admin) {
            Ok(())
        } else {
            Err(ApiError::Unauthenticated("invalid token"))
        }
    }
}

/// Reads a JSON body: `application/json` only, at most [`MAX_BODY`] bytes.
pub async fn json_body(req: &HttpRequest, mut payload: web::Payload) -> Result<Bytes, ApiError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim();
    if !mime.eq_ignore_ascii_case("application/json") {
        return Err(ApiError::UnsupportedMediaType(
            "Content-Type must be application/json",
        ));
    }
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > MAX_BODY {
            return Err(ApiError::PayloadTooLarge(MAX_BODY));
        }
    }
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::invalid("body", format!("cannot read body: {e}")))?;
        if body.len() + chunk.len() > MAX_BODY {
            return Err(ApiError::PayloadTooLarge(MAX_BODY));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

async fn not_found() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound("no such route".into()))
}

async fn method_not_allowed() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed)
}

/// Registers every route on an actix `App`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    let res =
        |path: &str| web::resource(path.to_owned()).default_service(web::to(method_not_allowed));
    cfg.service(res("/v1/check").route(web::post().to(check::check)))
        .service(res("/v1/check/batch").route(web::post().to(check::batch)))
        .service(res("/v1/quotas").route(web::get().to(admin::list)))
        .service(
            res("/v1/quotas/{tenant}")
                .route(web::put().to(admin::put_tenant))
                .route(web::get().to(admin::get_tenant))
                .route(web::delete().to(admin::delete_tenant)),
        )
        .service(
            res("/v1/quotas/{tenant}/clients/{client}")
                .route(web::put().to(admin::put_client))
                .route(web::get().to(admin::get_client))
                .route(web::delete().to(admin::delete_client)),
        )
        .service(res("/v1/usage/{tenant}/{client}").route(web::get().to(admin::usage)))
        .service(res("/healthz").route(web::get().to(ops::healthz)))
        .service(res("/readyz").route(web::get().to(ops::readyz)))
        .service(res("/metrics").route(web::get().to(ops::metrics)))
        .service(res("/v1/openapi.json").route(web::get().to(openapi::openapi_json)))
        .default_service(web::to(not_found));
}

/// Query-string and path rejections become 400s in the contract's shape.
pub fn query_config() -> web::QueryConfig {
    web::QueryConfig::default()
        .error_handler(|e, _| ApiError::invalid("query", e.to_string()).into())
}
