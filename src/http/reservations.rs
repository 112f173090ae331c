//! Reservations (holds): `GET /v1/reservations/{id}`, and `POST .../settle` and `.../release`,
//! which end one. A reservation is taken by `POST /v1/check` with `"reserve": true`
//! (`super::check`). The routes take the check token (or the admin token), and a token sees
//! only the reservations of tenants it may check: another tenant's is not found.

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::SecondsFormat;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::body::{json_body, parse_json};
use super::error::{ApiError, ErrorBody};
use super::state::AppState;
use crate::domain::{parse_cost, HoldState};
use crate::holds::{is_hold_id, HoldError};
use crate::store::hold::Hold;

/// The body of a settle.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ReservationSettle)]
struct SettleDto {
    /// The real cost of the work: 0 to 1000000000. It replaces the estimate in every limit the
    /// reservation charged, in the buckets of the reservation's time.
    #[schema(value_type = u64, minimum = 0, maximum = 1000000000, example = 1234)]
    cost: Option<serde_json::Number>,
}

/// A reservation, as the store keeps it.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Reservation)]
struct HoldView<'a> {
    #[schema(pattern = "^[0-9a-f]{32}$")]
    id: &'a str,
    tenant: &'a str,
    client: &'a str,
    resource: Option<&'a str>,
    /// `open` until settled (the real cost charged), released (nothing charged) or expired
    /// (the estimate charged).
    #[schema(value_type = HoldState)]
    state: &'static str,
    /// The cost taken when the reservation was made.
    estimate: u64,
    /// The real cost, once settled.
    cost: Option<u64>,
    /// RFC 3339, UTC.
    taken_at: String,
    /// When an open reservation expires.
    expires_at: String,
    ended_at: Option<String>,
    /// On a settle that charged more than the estimate: the limits now past their `max`
    /// (further checks meeting them are refused until their counts fall).
    #[serde(skip_serializing_if = "Option::is_none")]
    over_limit: Option<Vec<String>>,
}

pub(super) fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl<'a> HoldView<'a> {
    fn of(h: &'a Hold) -> Self {
        HoldView {
            id: &h.id,
            tenant: &h.tenant,
            client: &h.client,
            resource: h.resource.as_deref(),
            state: h.state.as_str(),
            estimate: h.estimate,
            cost: h.cost,
            taken_at: rfc3339(h.taken_ms),
            expires_at: rfc3339(h.expires_ms),
            ended_at: h.ended_ms.map(rfc3339),
            over_limit: None,
        }
    }
}

/// The id of the path, or a 400 naming it.
fn path_id(req: &HttpRequest) -> Result<String, ApiError> {
    let id = req.match_info().get("id").unwrap_or_default();
    if is_hold_id(id) {
        Ok(id.to_owned())
    } else {
        Err(ApiError::invalid(
            "id",
            "a reservation id is 32 lowercase hex digits, as POST /v1/check answered it",
        ))
    }
}

/// The caller's view of tenants: whether it may see a reservation of `tenant`.
async fn may_see(state: &AppState, req: &HttpRequest) -> Result<impl Fn(&str) -> bool, ApiError> {
    let who = state.auth.checker(req).await?;
    Ok(move |t: &str| who.as_ref().is_none_or(|w| w.may_check(t).is_ok()))
}

fn refused(id: &str, e: HoldError) -> ApiError {
    match e {
        HoldError::Unknown => ApiError::NotFound(format!("no reservation {id}")),
        HoldError::Ended(h) => ApiError::Conflict(match (h.state, h.cost) {
            (HoldState::Settled, Some(c)) => {
                format!("reservation {id} was settled already, at cost {c}")
            }
            (s, _) => format!("reservation {id} was {s} already"),
        }),
        HoldError::Store(e) => ApiError::Unavailable(e.to_string()),
    }
}

#[utoipa::path(
    get,
    path = "/v1/reservations/{id}",
    tag = "checks",
    operation_id = "reservation_get",
    summary = "A reservation: what it holds, and how it ended",
    params(("id" = String, Path, description = "As `POST /v1/check` answered it", pattern = "^[0-9a-f]{32}$")),
    responses(
        (status = 200, description = "The reservation (one past its time is expired by this read)", body = HoldView),
        (status = 400, description = "invalid_argument: not a reservation id", body = ErrorBody),
        (status = 401, description = "unauthenticated: a check token is configured and this request has none or a wrong one", body = ErrorBody),
        (status = 404, description = "not_found: no such reservation (or one of a tenant the token may not check, or forgotten a day after it expired)", body = ErrorBody),
        (status = 503, description = "unavailable: the store did not answer", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub async fn get(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let state = AppState::of(&req)?;
    let id = path_id(&req)?;
    let may = may_see(state, &req).await?;
    let h = state
        .holds
        .get(&id, may)
        .await
        .map_err(|e| refused(&id, e))?;
    Ok(HttpResponse::Ok().json(HoldView::of(&h)))
}

#[utoipa::path(
    post,
    path = "/v1/reservations/{id}/settle",
    tag = "checks",
    operation_id = "reservation_settle",
    summary = "Ends a reservation at the work's real cost",
    params(("id" = String, Path, description = "As `POST /v1/check` answered it", pattern = "^[0-9a-f]{32}$")),
    request_body(content = SettleDto, content_type = "application/json"),
    responses(
        (status = 200, description = "Settled (or settled before at the same cost: the same answer)", body = HoldView),
        (status = 400, description = "invalid_argument: not a reservation id, or a bad cost", body = ErrorBody),
        (status = 401, description = "unauthenticated: a check token is configured and this request has none or a wrong one", body = ErrorBody),
        (status = 404, description = "not_found: no such reservation", body = ErrorBody),
        (status = 409, description = "conflict: it was released, expired, or settled at another cost", body = ErrorBody),
        (status = 413, description = "payload_too_large: the body is over 64 KiB", body = ErrorBody),
        (status = 415, description = "unsupported_media_type: the body is not application/json", body = ErrorBody),
        (status = 503, description = "unavailable: the store did not answer; the reservation is as it was", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub async fn settle(req: HttpRequest, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    let state = AppState::of(&req)?;
    let id = path_id(&req)?;
    let may = may_see(state, &req).await?;
    let body = json_body(&req, payload).await?;
    let dto: SettleDto = parse_json(&body)?;
    let Some(cost) = dto.cost else {
        return Err(ApiError::invalid("cost", "cost is required"));
    };
    let cost = parse_cost(Some(&cost))?;
    let h = state
        .holds
        .end(&id, Some(cost), may)
        .await
        .map_err(|e| refused(&id, e))?;
    let mut view = HoldView::of(&h);
    if cost > h.estimate {
        view.over_limit = Some(state.holds.over_limit(&h).await);
    }
    Ok(HttpResponse::Ok().json(view))
}

#[utoipa::path(
    post,
    path = "/v1/reservations/{id}/release",
    tag = "checks",
    operation_id = "reservation_release",
    summary = "Ends a reservation whose work never happened: its whole estimate comes back",
    params(("id" = String, Path, description = "As `POST /v1/check` answered it", pattern = "^[0-9a-f]{32}$")),
    responses(
        (status = 200, description = "Released (or released before: the same answer)", body = HoldView),
        (status = 400, description = "invalid_argument: not a reservation id", body = ErrorBody),
        (status = 401, description = "unauthenticated: a check token is configured and this request has none or a wrong one", body = ErrorBody),
        (status = 404, description = "not_found: no such reservation", body = ErrorBody),
        (status = 409, description = "conflict: it was settled or expired", body = ErrorBody),
        (status = 503, description = "unavailable: the store did not answer; the reservation is as it was", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub async fn release(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let state = AppState::of(&req)?;
    let id = path_id(&req)?;
    let may = may_see(state, &req).await?;
    let h = state
        .holds
        .end(&id, None, may)
        .await
        .map_err(|e| refused(&id, e))?;
    Ok(HttpResponse::Ok().json(HoldView::of(&h)))
}
