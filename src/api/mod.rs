//! The HTTP API (actix-web): routes, auth, body handling. Handlers parse input into domain types
//! at the edge and hand them to the limiter or the store; every error is an [`ApiError`].

mod admin;
mod check;
pub mod error;
mod openapi;
mod ops;

use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{AppService, HttpServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderMap};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::{FromRequest, Handler, HttpRequest, HttpResponse, Responder, ResponseError};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use std::collections::HashSet;

use crate::config::{Role, TokenSettings};

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

/// Bearer tokens, kept as SHA-256 digests and compared in constant time: the tokens themselves
/// are never stored, logged or exported.
pub struct Auth {
    tokens: Vec<TokenEntry>,
    /// No check token is configured: `/v1/check` needs none.
    checks_open: bool,
}

struct TokenEntry {
    digest: [u8; 32],
    principal: Principal,
}

/// Who a request is, once its token matched.
#[derive(Clone, Debug)]
pub struct Principal {
    pub role: Role,
    /// None: every tenant.
    tenants: Option<Arc<HashSet<String>>>,
}

/// What a principal that is not allowed gets. It says nothing about whether the tenant exists.
const FORBIDDEN: ApiError =
    ApiError::PermissionDenied("this token may not do that for this tenant");

impl Principal {
    fn covers(&self, tenant: &str) -> bool {
        self.tenants.as_ref().is_none_or(|t| t.contains(tenant))
    }

    /// May manage and read this tenant's quotas and usage.
    pub fn may_manage(&self, tenant: &str) -> Result<(), ApiError> {
        match self.role {
            Role::Admin => Ok(()),
            Role::TenantAdmin if self.covers(tenant) => Ok(()),
            _ => Err(FORBIDDEN),
        }
    }

    /// May run checks for this tenant.
    pub fn may_check(&self, tenant: &str) -> Result<(), ApiError> {
        if self.covers(tenant) {
            Ok(())
        } else {
            Err(FORBIDDEN)
        }
    }

    /// Whether the quota list shows this tenant to this principal.
    pub fn sees(&self, tenant: &str) -> bool {
        self.may_manage(tenant).is_ok()
    }
}

pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Constant-time equality of two digests.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Auth {
    /// `admin_token` and `check_token` are the contract's single tokens (empty = none);
    /// `tokens` the scoped ones, already validated by the configuration.
    pub fn new(admin_token: &str, check_token: &str, tokens: &[TokenSettings]) -> Self {
        let mut entries = Vec::new();
        let unscoped = |role| Principal {
            role,
            tenants: None,
        };
        if !admin_token.is_empty() {
            entries.push(TokenEntry {
                digest: digest(admin_token),
                principal: unscoped(Role::Admin),
            });
        }
        if !check_token.is_empty() {
            entries.push(TokenEntry {
                digest: digest(check_token),
                principal: unscoped(Role::Check),
            });
        }
        for t in tokens {
            let mut d = [0u8; 32];
            if hex::decode_to_slice(&t.sha256, &mut d).is_err() {
                continue; // refused by Settings::validate before we get here
            }
            entries.push(TokenEntry {
                digest: d,
                principal: Principal {
                    role: t.role,
                    tenants: t
                        .tenants
                        .as_ref()
                        .map(|v| Arc::new(v.iter().cloned().collect())),
                },
            });
        }
        let checks_open = !entries.iter().any(|e| e.principal.role == Role::Check);
        Self {
            tokens: entries,
            checks_open,
        }
    }

    /// Whether any admin-role token is configured.
    pub fn has_admin(&self) -> bool {
        self.tokens.iter().any(|e| e.principal.role == Role::Admin)
    }

    /// The principal of the request's bearer token: 401 when missing or unknown.
    pub fn identify(&self, req: &HttpRequest) -> Result<Principal, ApiError> {
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
        let got = digest(token);
        // Compare against every entry, so the time taken does not tell which one matched.
        let mut found = None;
        for e in &self.tokens {
            if same(&got, &e.digest) && found.is_none() {
                found = Some(&e.principal);
            }
        }
        found
            .cloned()
            .ok_or(ApiError::Unauthenticated("invalid token"))
    }

    /// For the admin API: a token whose role may use it (check-only tokens get 403).
    pub fn admin(&self, req: &HttpRequest) -> Result<Principal, ApiError> {
        let p = self.identify(req)?;
        if p.role == Role::Check {
            return Err(ApiError::PermissionDenied(
                "this token may not use the admin API",
            ));
        }
        Ok(p)
    }

    /// For `/v1/check`: None when checks are open, else the caller (401 without a valid token).
    pub fn checker(&self, req: &HttpRequest) -> Result<Option<Principal>, ApiError> {
        if self.checks_open {
            return Ok(None);
        }
        self.identify(req).map(Some)
    }
}

/// The size of a request's header fields, each counted as `name: value\r\n` (the request line
/// and the blank line that ends the head are not counted).
pub fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum()
}

/// Middleware: a request whose header fields take more than `max` bytes
/// (`server.max_header_bytes`) gets 431 in the error shape before routing, auth or the body.
///
/// actix-http has no setting for this. Its own fixed limits stand behind this one: a request
/// head of 128 KiB or more ([`crate::config::HEADER_BYTES_CEILING`]), or more than 96 header
/// fields, gets a bare 431 (no body) and the connection is closed, before any middleware runs.
pub async fn limit_header_bytes<B: MessageBody>(
    max: usize,
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    if header_bytes(req.headers()) > max {
        let res = ApiError::HeaderFieldsTooLarge(max).error_response();
        return Ok(req.into_response(res).map_into_right_body());
    }
    next.call(req)
        .await
        .map(ServiceResponse::map_into_left_body)
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
    let read = |c: Result<Bytes, _>| {
        c.map_err(|e: actix_web::error::PayloadError| {
            ApiError::invalid("body", format!("cannot read body: {e}"))
        })
    };
    // A small body usually arrives in one chunk: keep it as it is, without a copy.
    let first = match payload.next().await {
        None => return Ok(Bytes::new()),
        Some(c) => read(c)?,
    };
    if first.len() > MAX_BODY {
        return Err(ApiError::PayloadTooLarge(MAX_BODY));
    }
    let Some(second) = payload.next().await else {
        return Ok(first);
    };
    let mut body = BytesMut::from(&first[..]);
    let mut next = Some(second);
    while let Some(chunk) = next {
        let chunk = read(chunk)?;
        if body.len() + chunk.len() > MAX_BODY {
            return Err(ApiError::PayloadTooLarge(MAX_BODY));
        }
        body.extend_from_slice(&chunk);
        next = payload.next().await;
    }
    Ok(body.freeze())
}

/// Deserializes a JSON body; an error names the field it is about (`limits[2].max`).
pub fn parse_json<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| error::json_error(e, ""))
}

async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound("no such route".into()))
}

/// One path and the methods it has. Registers a route per method and answers every other method
/// with 405 and an `Allow` header naming exactly these (RFC 9110 §15.5.6): the header is built from
/// the same calls that register the routes, so it cannot drift from them.
struct Endpoint {
    resource: actix_web::Resource,
    methods: Vec<Method>,
}

fn res(path: &str) -> Endpoint {
    Endpoint {
        resource: web::resource(path.to_owned()),
        methods: Vec::new(),
    }
}

impl Endpoint {
    fn on<F, Args>(mut self, method: Method, handler: F) -> Self
    where
        F: Handler<Args>,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static,
    {
        self.resource = self.resource.route(web::method(method.clone()).to(handler));
        self.methods.push(method);
        self
    }

    fn get<F: Handler<A>, A: FromRequest + 'static>(self, h: F) -> Self
    where
        F::Output: Responder + 'static,
    {
        self.on(Method::GET, h)
    }

    fn put<F: Handler<A>, A: FromRequest + 'static>(self, h: F) -> Self
    where
        F::Output: Responder + 'static,
    {
        self.on(Method::PUT, h)
    }

    fn post<F: Handler<A>, A: FromRequest + 'static>(self, h: F) -> Self
    where
        F::Output: Responder + 'static,
    {
        self.on(Method::POST, h)
    }

    fn delete<F: Handler<A>, A: FromRequest + 'static>(self, h: F) -> Self
    where
        F::Output: Responder + 'static,
    {
        self.on(Method::DELETE, h)
    }
}

impl HttpServiceFactory for Endpoint {
    fn register(self, config: &mut AppService) {
        let allow = self
            .methods
            .iter()
            .map(Method::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        self.resource
            .default_service(web::to(move || {
                let allow = allow.clone();
                async move { Err::<HttpResponse, _>(ApiError::MethodNotAllowed(allow)) }
            }))
            .register(config)
    }
}

/// Registers every route on an actix `App`. (`tests/api/openapi.rs` reads this function's source
/// to check that every route is documented: keep one `res("path")` per path.)
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(res("/v1/check").post(check::check))
        .service(res("/v1/check/batch").post(check::batch))
        .service(res("/v1/quotas").get(admin::list))
        .service(
            res("/v1/quotas/{tenant}")
                .put(admin::put_tenant)
                .get(admin::get_tenant)
                .delete(admin::delete_tenant),
        )
        .service(
            res("/v1/quotas/{tenant}/clients/{client}")
                .put(admin::put_client)
                .get(admin::get_client)
                .delete(admin::delete_client),
        )
        .service(res("/v1/usage/{tenant}/{client}").get(admin::usage))
        .service(res("/healthz").get(ops::healthz))
        .service(res("/readyz").get(ops::readyz))
        .service(res("/metrics").get(ops::metrics))
        .service(res("/v1/openapi.json").get(openapi::openapi_json))
        .default_service(web::to(not_found));
}

/// Query-string and path rejections become 400s in the contract's shape.
pub fn query_config() -> web::QueryConfig {
    web::QueryConfig::default()
        .error_handler(|e, _| ApiError::invalid("query", e.to_string()).into())
}
