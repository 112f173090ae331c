//! The route table: every (method, path) the server has and the handler that serves it, in one
//! [`ROUTES`] list. [`routes`] registers exactly that list, and the HTTP tests hold the same list
//! against the OpenAPI document, so a route cannot be served without being documented. The one
//! exception is the web console's static files (`console`), which are pages, not API.
//!
//! Each path answers a method it does not have with 405 and an `Allow` header built from the
//! same entries (RFC 9110 §15.5.6), so the header cannot drift from the routes either.

use actix_web::dev::{AppService, HttpServiceFactory};
use actix_web::http::Method;
use actix_web::{web, HttpResponse};

use super::error::ApiError;
use super::{adjust, audit, check, history, openapi, ops, quotas, reservations, usage, whoami};

/// One method on one path, and the handler that serves it.
pub struct Route {
    pub method: Method,
    /// The path template, as in the OpenAPI document (`/v1/quotas/{tenant}`).
    pub path: &'static str,
    /// Attaches the handler: handlers have distinct types, a function pointer makes them one.
    serve: fn(actix_web::Route) -> actix_web::Route,
}

/// Every route of the server. Entries of one path are registered together, in this order.
pub static ROUTES: [Route; 33] = [
    route(Method::POST, "/v1/check", |r| r.to(check::check)),
    route(Method::POST, "/v1/check/batch", |r| r.to(check::batch)),
    route(Method::GET, "/v1/reservations/{id}", |r| {
        r.to(reservations::get)
    }),
    route(Method::POST, "/v1/reservations/{id}/settle", |r| {
        r.to(reservations::settle)
    }),
    route(Method::POST, "/v1/reservations/{id}/release", |r| {
        r.to(reservations::release)
    }),
    route(Method::GET, "/v1/forward-auth", forward_auth),
    route(Method::HEAD, "/v1/forward-auth", forward_auth),
    route(Method::POST, "/v1/forward-auth", forward_auth),
    route(Method::PUT, "/v1/forward-auth", forward_auth),
    route(Method::PATCH, "/v1/forward-auth", forward_auth),
    route(Method::DELETE, "/v1/forward-auth", forward_auth),
    route(Method::OPTIONS, "/v1/forward-auth", forward_auth),
    route(Method::GET, "/v1/quotas", |r| r.to(quotas::list)),
    route(Method::PUT, "/v1/quotas/{tenant}", |r| {
        r.to(quotas::put_tenant)
    }),
    route(Method::GET, "/v1/quotas/{tenant}", |r| {
        r.to(quotas::get_tenant)
    }),
    route(Method::DELETE, "/v1/quotas/{tenant}", |r| {
        r.to(quotas::delete_tenant)
    }),
    route(Method::GET, "/v1/quotas/{tenant}/clients", |r| {
        r.to(quotas::list_overrides)
    }),
    route(Method::PUT, "/v1/quotas/{tenant}/clients/{client}", |r| {
        r.to(quotas::put_client)
    }),
    route(Method::GET, "/v1/quotas/{tenant}/clients/{client}", |r| {
        r.to(quotas::get_client)
    }),
    route(
        Method::DELETE,
        "/v1/quotas/{tenant}/clients/{client}",
        |r| r.to(quotas::delete_client),
    ),
    // The literal paths before `{client}`: actix takes the first resource that matches.
    route(Method::GET, "/v1/usage/{tenant}/history", |r| {
        r.to(history::tenant_history)
    }),
    route(Method::GET, "/v1/usage/{tenant}/nearest", |r| {
        r.to(usage::nearest)
    }),
    route(Method::GET, "/v1/usage/{tenant}/top", |r| {
        r.to(history::top)
    }),
    route(Method::GET, "/v1/usage/{tenant}/{client}", |r| {
        r.to(usage::usage)
    }),
    route(Method::GET, "/v1/usage/{tenant}/{client}/history", |r| {
        r.to(history::client_history)
    }),
    route(Method::POST, "/v1/usage/{tenant}/{client}/grant", |r| {
        r.to(adjust::grant)
    }),
    route(Method::POST, "/v1/usage/{tenant}/{client}/reset", |r| {
        r.to(adjust::reset)
    }),
    route(Method::GET, "/v1/audit", |r| r.to(audit::list)),
    route(Method::GET, "/v1/whoami", |r| r.to(whoami::whoami)),
    route(Method::GET, "/healthz", |r| r.to(ops::healthz)),
    route(Method::GET, "/readyz", |r| r.to(ops::readyz)),
    route(Method::GET, "/metrics", |r| r.to(ops::metrics)),
    route(Method::GET, "/v1/openapi.json", |r| {
        r.to(openapi::openapi_json)
    }),
];

/// Any method a proxy may forward: the forward-auth check reads no body.
fn forward_auth(r: actix_web::Route) -> actix_web::Route {
    r.to(super::forward_auth::forward_auth)
}

const fn route(
    method: Method,
    path: &'static str,
    serve: fn(actix_web::Route) -> actix_web::Route,
) -> Route {
    Route {
        method,
        path,
        serve,
    }
}

/// Registers every route of [`ROUTES`] on an actix `App`; any other path gets 404.
pub fn routes(cfg: &mut web::ServiceConfig) {
    let mut paths: Vec<&'static str> = Vec::new();
    for r in &ROUTES {
        if !paths.contains(&r.path) {
            paths.push(r.path);
        }
    }
    for path in paths {
        let endpoint = ROUTES
            .iter()
            .filter(|r| r.path == path)
            .fold(Endpoint::new(path), Endpoint::on);
        cfg.service(endpoint);
    }
    // The web console: static pages, not API routes, so not in the table or the document.
    super::console::register(cfg);
    cfg.default_service(web::to(not_found));
}

async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound("no such route".into()))
}

/// One path and the methods it has: a route per method, and 405 with `Allow` for the others.
struct Endpoint {
    resource: actix_web::Resource,
    methods: Vec<Method>,
}

impl Endpoint {
    fn new(path: &str) -> Self {
        Endpoint {
            resource: web::resource(path.to_owned()),
            methods: Vec::new(),
        }
    }

    fn on(mut self, route: &Route) -> Self {
        let method = route.method.clone();
        self.resource = self
            .resource
            .route((route.serve)(web::method(method.clone())));
        self.methods.push(method);
        self
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

/// Query-string and path rejections become 400s in the contract's shape.
pub fn query_config() -> web::QueryConfig {
    web::QueryConfig::default()
        .error_handler(|e, _| ApiError::invalid("query", e.to_string()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_of_a_path_is_routed_once() {
        let mut seen = std::collections::HashSet::new();
        for r in &ROUTES {
            assert!(
                seen.insert((&r.method, r.path)),
                "{} {} twice",
                r.method,
                r.path
            );
        }
    }
}
