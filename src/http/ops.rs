//! `/healthz`, `/readyz`, `/metrics`: for orchestrators and scrapers, without auth, and the
//! [`Health`] and [`Ready`] answers.

use std::time::Duration;

use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::state::AppState;
use crate::clock::ClockState;

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
    /// `ready`; `degraded` while the store refused or left unanswered part of the last sync
    /// round's writes (a node down with no quorum for some partitions, or one that stopped
    /// answering): this instance still serves, unsent hits wait and are sent again.
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
    /// The region (Cassandra/ScyllaDB data centre) this instance serves; absent on the
    /// embedded store.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "eu")]
    region: Option<String>,
    /// Every region of the fleet as this one sees it, its own first; absent on the embedded
    /// store. A region cut off does not make this instance unready: it keeps answering within
    /// its budget.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    regions: Vec<RegionState>,
    /// The clock this instance cuts buckets on.
    clock: ClockStatus,
}

/// The clock an instance cuts buckets on, in `/readyz`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClockStatus {
    /// `store`: the store's clock, which the fleet shares, read `offset_ms` ahead of this
    /// host's (negative: behind) within `uncertainty_ms`; `local`: this host's, with no other
    /// to agree with (the embedded store); `unread`: this host's, until the store's clock is
    /// read (the store has not answered yet).
    #[schema(example = "store")]
    source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = -3)]
    offset_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = 1)]
    uncertainty_ms: Option<i64>,
}

impl ClockStatus {
    fn of(state: Option<ClockState>) -> Self {
        let (source, offset_ms, uncertainty_ms) = match state {
            None | Some(ClockState::Alone) => ("local", None, None),
            Some(ClockState::Unknown) => ("unread", None, None),
            Some(ClockState::Measured {
                offset_ms,
                uncertainty_ms,
            }) => ("store", Some(offset_ms), Some(uncertainty_ms)),
        };
        ClockStatus {
            source,
            offset_ms,
            uncertainty_ms,
        }
    }
}

/// One region of the fleet, in `/readyz`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegionState {
    #[schema(example = "us")]
    region: String,
    /// This instance's own region.
    local: bool,
    /// Instances holding a lease there, as this region's replicas show the leases.
    #[schema(example = 2)]
    members: u32,
    /// How old its newest heartbeat is here, ms: its replication lag plus up to one
    /// heartbeat (`fleet.region_heartbeat_ms`); 0 for this region.
    #[schema(example = 180)]
    lag_ms: i64,
    /// Unheard for longer than `fleet.region_stale_ms` (or heard again for less than the heal
    /// grace): counters keep to their region's budget.
    cut_off: bool,
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
            status: if state.metrics.store_degraded() {
                "degraded"
            } else {
                "ready"
            },
            store: state.store.kind(),
            shard,
            members: state.fleet.members(),
            region: state.fleet.region().map(|r| r.to_string()),
            regions: state
                .fleet
                .regions_seen()
                .iter()
                .map(|r| RegionState {
                    region: r.region.clone(),
                    local: r.local,
                    members: r.members,
                    lag_ms: r.lag_ms,
                    cut_off: r.cut_off,
                })
                .collect(),
            clock: ClockStatus::of(state.limiter.clock().fleet().map(|c| c.state())),
        })),
        // The store's own words (hosts, keyspace, driver errors) go to the log, not to an
        // unauthenticated caller.
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: the store does not answer");
            Err(ApiError::Unavailable(
                "the store does not answer (the reason is in the log)".into(),
            ))
        }
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
