//! `/healthz`, `/readyz`, `/metrics`: for orchestrators and scrapers, without auth, and the
//! [`Health`] and [`Ready`] answers.

use std::time::Duration;

use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::state::AppState;

/// `GET /healthz`.
// `deny_unknown_fields` only tells the OpenAPI document that an answer has no other fields.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Health {
    #[schema(example = "ok")]
    status: &'static str,
}

/// `GET /readyz` while the store answers and this instance holds its shard lease.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    #[schema(example = "ready")]
    status: &'static str,
    /// The configured store (`embedded`, `scylla`).
    #[schema(example = "embedded")]
    store: &'static str,
    /// The write shard this instance holds a lease on (always 0 on the embedded store).
    #[schema(example = 0)]
    shard: i16,
    /// Instances holding a lease, this one included (1 on the embedded store).
    #[schema(example = 1)]
    members: u32,
}

/// 200 while the process serves.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "ops",
    operation_id = "healthz",
    responses((status = 200, description = "The process serves", body = Health)),
)]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
}

/// 200 while the store answers within the store deadline and this instance holds its shard
/// lease, else 503.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "ops",
    operation_id = "readyz",
    responses(
        (status = 200, description = "The store answers", body = Ready),
        (status = 503, description = "unavailable: the store does not answer, or this instance holds no shard lease", body = ErrorBody),
    ),
)]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    // A probe waits at least half a second, however short the store deadline of checks is.
    let deadline = state.store_timeout.max(Duration::from_millis(500));
    let Some(shard) = state.fleet.shard() else {
        return Err(ApiError::Unavailable(
            "this instance holds no shard lease (it cannot renew it, or every shard is taken)"
                .into(),
        ));
    };
    match tokio::time::timeout(deadline, state.store.ping()).await {
        Ok(Ok(())) => Ok(HttpResponse::Ok().json(Ready {
            status: "ready",
            store: state.store.kind(),
            shard,
            members: state.fleet.members(),
        })),
        Ok(Err(e)) => Err(ApiError::Unavailable(format!(
            "the store does not answer: {e}"
        ))),
        Err(_) => Err(ApiError::Unavailable(
            "the store does not answer in time".into(),
        )),
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "ops",
    operation_id = "metrics",
    responses((status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain")),
)]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics.render())
}
