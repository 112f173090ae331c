//! Error answers that several operations share, named once for the OpenAPI document: each
//! handler's `#[utoipa::path]` lists its own answers and the groups here that apply to it.

use std::collections::BTreeMap;

use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, ToSchema};

use super::error::ErrorBody;

/// What every admin route can answer besides its own: a bad input, no or a wrong token, a token
/// without the right, and the store's faults.
pub struct AdminErrors;

/// What a route that reads a JSON body can answer about it.
pub struct BodyErrors;

impl IntoResponses for AdminErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        errors(&[
            (
                400,
                "invalid_argument: a bad path, query or body, naming the field",
            ),
            (401, "unauthenticated: no token, or a wrong one"),
            (
                403,
                "permission_denied: a valid token without the right to this",
            ),
            (
                500,
                "internal: a fault of the store or the server, never bad input",
            ),
            (503, "unavailable: the store does not answer; try again"),
        ])
    }
}

impl IntoResponses for BodyErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        errors(&[
            (413, "payload_too_large: the body is over 64 KiB"),
            (
                415,
                "unsupported_media_type: the body is not application/json",
            ),
        ])
    }
}

/// Answers with the error body, by status.
fn errors(list: &[(u16, &str)]) -> BTreeMap<String, RefOr<Response>> {
    list.iter()
        .map(|&(status, description)| {
            let body = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(ErrorBody::name())))
                .build();
            let response = ResponseBuilder::new()
                .description(description)
                .content("application/json", body)
                .build();
            (status.to_string(), response.into())
        })
        .collect()
}
