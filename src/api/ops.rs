//! `/healthz`, `/readyz`, `/metrics`.

use actix_web::{web, HttpResponse};
use serde_json::json;

use super::error::{ApiError, ErrorBody};
use super::openapi::{Health, Ready};
use super::AppState;

/// 200 while the process serves.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "ops",
    operation_id = "healthz",
    responses((status = 200, description = "The process serves", body = Health)),
)]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// 200 while the store answers within the store deadline, else 503.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "ops",
    operation_id = "readyz",
    responses(
        (status = 200, description = "The store answers", body = Ready),
        (status = 503, description = "unavailable: the store does not answer", body = ErrorBody),
    ),
)]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    match tokio::time::timeout(
        state
            .store_timeout
            .max(std::time::Duration::from_millis(500)),
        state.store.ping(),
    )
    .await
    {
        Ok(Ok(())) => {
            Ok(HttpResponse::Ok().json(json!({"status": "ready", "store": state.store.kind()})))
        }
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
