//! The one error type of the HTTP edge. Every failure, including the framework's own
//! rejections (unknown route, wrong method, oversized body), becomes the contract's shape:
//! `{"error": {"code": "...", "message": "...", "field": "..."}}`. Internal details are logged,
//! never sent.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::FieldError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    InvalidArgument {
        message: String,
        field: Option<String>,
    },
    #[error("{0}")]
    Unauthenticated(&'static str),
    #[error("{0}")]
    PermissionDenied(&'static str),
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be done in the state things are in (an idempotency key in use).
    #[error("{0}")]
    Conflict(String),
    /// The methods the path does have, for the `Allow` header (e.g. `GET, PUT, DELETE`).
    #[error("method not allowed; this path allows {0}")]
    MethodNotAllowed(String),
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// The body did not arrive whole within `server.request_timeout_ms` (ms).
    #[error("the request body did not arrive within {0} ms")]
    RequestTimeout(u64),
    /// The limit (`server.max_header_bytes`).
    #[error("request header fields are larger than {0} bytes")]
    HeaderFieldsTooLarge(usize),
    #[error("{0}")]
    UnsupportedMediaType(&'static str),
    /// A bound on what callers may keep open was reached (open reservations of a tenant).
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    Unavailable(String),
    /// The message is logged; the caller sees a generic one.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidArgument {
            message: message.into(),
            field: Some(field.into()),
        }
    }

    /// The 404 of a tenant without a quota (and no default policy).
    pub fn no_quota(tenant: &crate::domain::TenantId) -> Self {
        ApiError::NotFound(format!("tenant {tenant} has no quota"))
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidArgument { .. } => "invalid_argument",
            ApiError::Unauthenticated(_) => "unauthenticated",
            ApiError::PermissionDenied(_) => "permission_denied",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict(_) => "conflict",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::RequestTimeout(_) => "request_timeout",
            ApiError::HeaderFieldsTooLarge(_) => "request_header_fields_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::ResourceExhausted(_) => "resource_exhausted",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The JSON body (also used for per-item errors in a batch).
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.to_string(),
                field: match self {
                    ApiError::InvalidArgument { field, .. } => field.as_deref(),
                    _ => None,
                },
            },
        }
    }
}

/// Every error answer, and a failed item of a batch. (`deny_unknown_fields` only tells the
/// OpenAPI document that it has no other fields.)
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Error)]
pub struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorDetail<'a> {
    /// What went wrong, one of [`ApiError::code`]'s values.
    #[schema(schema_with = code_schema)]
    pub code: &'static str,
    /// For a person; may change between releases.
    #[schema(example = "cost must be 0..=1000000")]
    pub message: String,
    /// The offending input, for `invalid_argument` (`cost`, `limits[2].window`, `checks[3].tenant`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, example = "cost")]
    pub field: Option<&'a str>,
}

/// One error of each kind, for the OpenAPI document's list of codes.
pub fn every_kind() -> Vec<ApiError> {
    let all = vec![
        ApiError::invalid("", ""),
        ApiError::Unauthenticated(""),
        ApiError::PermissionDenied(""),
        ApiError::NotFound(String::new()),
        ApiError::Conflict(String::new()),
        ApiError::MethodNotAllowed(String::new()),
        ApiError::PayloadTooLarge(0),
        ApiError::RequestTimeout(0),
        ApiError::HeaderFieldsTooLarge(0),
        ApiError::UnsupportedMediaType(""),
        ApiError::ResourceExhausted(String::new()),
        ApiError::Unavailable(String::new()),
        ApiError::Internal(String::new()),
    ];
    // A new variant fails to compile here until it is added to the list above.
    for e in &all {
        match e {
            ApiError::InvalidArgument { .. }
            | ApiError::Unauthenticated(_)
            | ApiError::PermissionDenied(_)
            | ApiError::NotFound(_)
            | ApiError::Conflict(_)
            | ApiError::MethodNotAllowed(_)
            | ApiError::PayloadTooLarge(_)
            | ApiError::RequestTimeout(_)
            | ApiError::HeaderFieldsTooLarge(_)
            | ApiError::UnsupportedMediaType(_)
            | ApiError::ResourceExhausted(_)
            | ApiError::Unavailable(_)
            | ApiError::Internal(_) => {}
        }
    }
    all
}

/// The schema of `error.code`: an enum of every code the server can send.
fn code_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .enum_values(Some(every_kind().iter().map(ApiError::code)))
        .build()
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::InvalidArgument {
            message: e.message,
            field: Some(e.field),
        }
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        if e.is_transient() {
            ApiError::Unavailable("the store is unavailable; try again".into())
        } else {
            ApiError::Internal(e.to_string())
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidArgument { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            ApiError::PermissionDenied(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::HeaderFieldsTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::ResourceExhausted(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let ApiError::Internal(detail) = self {
            tracing::error!(%detail, "internal error");
        }
        let mut res = HttpResponse::build(self.status_code());
        match self {
            ApiError::Unauthenticated(_) => {
                res.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            // RFC 9110: a 405 names the methods the target resource supports.
            ApiError::MethodNotAllowed(allow) => {
                res.insert_header((header::ALLOW, allow.as_str()));
            }
            // The rest of the body may never come: the connection is not kept.
            ApiError::RequestTimeout(_) => {
                res.force_close();
            }
            _ => {}
        }
        res.json(self.body())
    }
}

/// Turns a JSON parse failure into a 400 naming the field where serde could tell it.
pub fn json_error(e: serde_path_to_error::Error<serde_json::Error>, prefix: &str) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    let mut message = inner.to_string();
    // serde_json appends " at line L column C"; keep it only for syntax errors, where the
    // position is the useful part.
    if !inner.is_syntax() && !inner.is_eof() {
        if let Some(i) = message.rfind(" at line ") {
            message.truncate(i);
        }
    }
    let field = if path == "." || path.is_empty() {
        // A missing or unknown field is reported at the parent: name it from the message.
        message
            .split('`')
            .nth(1)
            .filter(|_| {
                message.starts_with("unknown field") || message.starts_with("missing field")
            })
            .map(|f| join(prefix, f))
            .or_else(|| (!prefix.is_empty()).then(|| prefix.to_owned()))
    } else {
        Some(join(prefix, &path))
    };
    ApiError::InvalidArgument { message, field }
}

fn join(prefix: &str, path: &str) -> String {
    if prefix.is_empty() {
        path.to_owned()
    } else if path.starts_with('[') {
        format!("{prefix}{path}")
    } else {
        format!("{prefix}.{path}")
    }
}

impl From<crate::auth::Refusal> for ApiError {
    fn from(r: crate::auth::Refusal) -> Self {
        match r {
            crate::auth::Refusal::Unauthenticated(m) => ApiError::Unauthenticated(m),
            crate::auth::Refusal::PermissionDenied(m) => ApiError::PermissionDenied(m),
        }
    }
}
