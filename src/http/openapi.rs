//! `GET /v1/openapi.json`: the OpenAPI 3.1 document of the HTTP API, for people and for client
//! generators.
//!
//! It is derived at start-up (utoipa) from the types the handlers really parse and send (the
//! check and batch bodies and answers, the policy document, the error body) and from the
//! `#[utoipa::path]` attribute on each handler, which lists its answers. It only points inward:
//! it names handlers and the types they answer with, which live beside them; nothing but the
//! route that serves it uses this module. The HTTP tests (`tests/api/openapi*.rs`) hold real
//! answers against the served document and check that it lists exactly the route table
//! (`super::ROUTES`), and `scripts/fuzz-api.sh` runs schemathesis against it. Objects the
//! server refuses extra fields in are `additionalProperties: false`.

use std::sync::OnceLock;

use actix_web::HttpResponse;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, ObjectBuilder, Ref, ResponseBuilder, Type};
use utoipa::{Modify, OpenApi};

use super::error::ErrorBody;
use super::{
    adjust, audit, check, forward_auth, history, ops, quotas, reservations, usage, whoami,
};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "quotad",
        description = "A multi-tenant quota and rate-limit service. Every error is \
            `{\"error\": {\"code\", \"message\", \"field\"?}}` with a 4xx/5xx status; bad input \
            never gets a 5xx. A method a route does not have gets 405 `method_not_allowed` \
            with an `Allow` header naming the route's methods \
            (components.responses.MethodNotAllowed), an unknown path 404 `not_found`, request \
            header fields over the configured limit (16 KiB by default) 431 \
            `request_header_fields_too_large` (components.responses.RequestHeaderFieldsTooLarge)."
    ),
    paths(
        check::check,
        check::batch,
        reservations::get,
        reservations::settle,
        reservations::release,
        forward_auth::forward_auth,
        quotas::list,
        quotas::list_overrides,
        quotas::put_tenant,
        quotas::get_tenant,
        quotas::delete_tenant,
        quotas::put_client,
        quotas::get_client,
        quotas::delete_client,
        usage::usage,
        usage::nearest,
        adjust::reset,
        adjust::grant,
        history::client_history,
        history::tenant_history,
        history::top,
        audit::list,
        whoami::whoami,
        ops::healthz,
        ops::readyz,
        ops::metrics,
        openapi_json,
    ),
    modifiers(&Extras),
    tags(
        (name = "checks", description = "Rate-limit decisions"),
        (name = "quotas", description = "Tenants' policies and clients' overrides (admin)"),
        (name = "usage", description = "Counts, read without consuming, and usage history (admin)"),
        (name = "audit", description = "The log of every quota change (admin)"),
        (name = "ops", description = "Health, readiness, metrics, this document"),
    )
)]
pub struct ApiDoc;

/// What the derive cannot say: the bearer scheme, the 405 every route answers to a method it
/// does not have (no operation of the document can carry it), and the 431 any request can get.
struct Extras;

impl Modify for Extras {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An admin or tenant_admin token for /v1/quotas, /v1/usage and /v1/audit; the check token (when one \
                         is configured) or the admin token for /v1/check",
                    ))
                    .build(),
            ),
        );
        let error_json = || {
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(
                    <ErrorBody as utoipa::ToSchema>::name(),
                )))
                .build()
        };
        components.responses.insert(
            "MethodNotAllowed".into(),
            ResponseBuilder::new()
                .description("method_not_allowed: the route has no such method")
                .header(
                    "Allow",
                    HeaderBuilder::new()
                        .schema(
                            ObjectBuilder::new()
                                .schema_type(Type::String)
                                .examples(["GET, PUT, DELETE"]),
                        )
                        .description(Some("The methods the route has, e.g. `GET, PUT, DELETE`"))
                        .build(),
                )
                .content("application/json", error_json())
                .build()
                .into(),
        );
        components.responses.insert(
            "RequestHeaderFieldsTooLarge".into(),
            ResponseBuilder::new()
                .description(
                    "request_header_fields_too_large: the request's header fields are over \
                     server.max_header_bytes",
                )
                .content("application/json", error_json())
                .build()
                .into(),
        );
    }
}

/// The document as served (built once).
pub fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
        // A limit is a window, a period or a token bucket: exactly one of `window`, `period`
        // and `burst` that is not null (`Policy::from_doc`); utoipa's object schema cannot
        // carry a `oneOf` beside its properties, the JSON can.
        doc["components"]["schemas"]["Limit"]["oneOf"] = serde_json::json!([
            {"required": ["window"], "properties": {"window": {"type": "string"}}},
            {"required": ["period"], "properties": {"period": {"type": "string"}}},
            {"required": ["burst"], "properties": {"burst": {"type": "integer"}}},
        ]);
        serde_json::to_string_pretty(&doc).expect("the document serializes")
    })
}

#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "ops",
    operation_id = "openapi",
    summary = "This document (OpenAPI 3.1)",
    responses((status = 200, description = "The OpenAPI document", body = Object, content_type = "application/json")),
)]
pub async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(document())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{validate_id, validate_resource};
    use serde_json::Value;

    fn doc() -> Value {
        serde_json::from_str(document()).unwrap()
    }

    /// Every pattern of the document, with the JSON path where it stands.
    fn patterns(v: &Value, at: String, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k == "pattern" {
                        out.push((at.clone(), x.as_str().unwrap().to_owned()));
                    } else {
                        patterns(x, format!("{at}/{k}"), out);
                    }
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    patterns(x, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn patterns_are_the_domain_rules() {
        // The document spells the domain's rules as regexes; these are the only two, and these
        // samples show they agree with the validators at their edges. Besides them: the
        // history's step, and the audit log's entry ids and cursors (tested in api::audit).
        const ID: &str = "^[A-Za-z0-9._~:@-]{1,128}$";
        const RESOURCE: &str = "^[ -~]{1,256}$";
        const OTHERS: [&str; 5] = [
            "^(hour|day)$",
            "^[0-9a-f]{1,64}$",
            "^[0-9]{1,16}\\.[0-9a-f]{1,64}$",
            super::super::idempotency::KEY_PATTERN,
            crate::holds::HOLD_ID_PATTERN,
        ];
        let mut found = Vec::new();
        patterns(&doc(), String::new(), &mut found);
        assert!(found.len() > 10, "{found:?}");
        for (at, p) in &found {
            assert!(
                p == ID || p == RESOURCE || OTHERS.contains(&p.as_str()),
                "{at}: unexpected pattern {p}"
            );
        }
        let id_ok = |s: &str| validate_id("f", s).is_ok();
        assert!(id_ok("AZaz09._~:@-") && id_ok(&"a".repeat(128)));
        assert!(!id_ok("") && !id_ok(&"a".repeat(129)) && !id_ok("a b") && !id_ok("a/b"));
        let hold_ok = crate::holds::is_hold_id;
        assert!(hold_ok(&"0a".repeat(16)));
        assert!(
            !hold_ok(&"0A".repeat(16)) && !hold_ok(&"0".repeat(31)) && !hold_ok(&"g".repeat(32))
        );
        let key_ok = super::super::idempotency::valid_key;
        assert!(key_ok("!~") && key_ok(&"k".repeat(255)));
        assert!(!key_ok("") && !key_ok(&"k".repeat(256)) && !key_ok("a b") && !key_ok("é"));
        let res_ok = |s: &str| validate_resource("f", s).is_ok();
        assert!(res_ok(" ~") && res_ok(&"x".repeat(256)));
        assert!(!res_ok("") && !res_ok(&"x".repeat(257)) && !res_ok("\t") && !res_ok("\u{7f}"));
    }

    #[test]
    fn error_codes_are_every_kind() {
        let d = doc();
        let codes = &d["components"]["schemas"]["ErrorDetail"]["properties"]["code"]["enum"];
        let codes: Vec<&str> = codes
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        for c in [
            "invalid_argument",
            "unauthenticated",
            "permission_denied",
            "not_found",
            "method_not_allowed",
            "payload_too_large",
            "request_header_fields_too_large",
            "unsupported_media_type",
            "unavailable",
            "internal",
        ] {
            assert!(codes.contains(&c), "{c} missing from {codes:?}");
        }
    }
}
