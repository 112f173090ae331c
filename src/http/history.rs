//! Usage history routes: a client's or a tenant's points by hour or day
//! (`GET /v1/usage/{tenant}/{client}/history`, `GET /v1/usage/{tenant}/history`) and the
//! clients with the most cost over whole UTC days (`GET /v1/usage/{tenant}/top`), as JSON or,
//! with `Accept: text/csv`, as CSV.
//!
//! Every hour or day of the span is a point, zero where nothing was answered. The figures are
//! what the store holds: what checks were answered up to the last sync round
//! (`sync.interval_ms`) of every instance.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::ApiError;
use super::params::{instant, page_size, query, Managed};
use super::responses::AdminErrors;
use super::state::AppState;
use crate::store::history::{Counts, Step};

/// The longest spans: 31 days of hours (744 points), 400 days of days, 31 days for `top`
/// (whose index holds one row per client and day).
const MAX_HOURS: i64 = 31 * 24;
const MAX_DAYS: i64 = 400;
const MAX_TOP_DAYS: i64 = 31;

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct HistoryParams {
    /// The first point is the hour or day holding this time (RFC 3339). Default: 23 hours or
    /// 29 days before the current one, so that the default span is a day of hours or 30 days.
    #[param(format = DateTime, example = "2026-11-23T00:00:00Z")]
    from: Option<String>,
    /// Points start before this time (RFC 3339); default: now (the current hour or day is the
    /// last point). At most 744 hourly or 400 daily points.
    #[param(format = DateTime, example = "2026-11-24T00:00:00Z")]
    to: Option<String>,
    /// `hour` (default) or `day` (UTC days).
    #[param(pattern = "^(hour|day)$", example = "hour")]
    step: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct TopParams {
    /// The first UTC day is the day holding this time (RFC 3339); default: today.
    #[param(format = DateTime, example = "2026-11-01T00:00:00Z")]
    from: Option<String>,
    /// Days start before this time (RFC 3339); default: now. At most 31 days.
    #[param(format = DateTime, example = "2026-11-24T00:00:00Z")]
    to: Option<String>,
    /// How many clients.
    #[param(value_type = u32, required = false, minimum = 1, maximum = 1000, default = 10)]
    limit: Option<String>,
}

/// One hour or day of a history.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoryPoint {
    /// Checks answered allowed (200; batch items included).
    admitted: u64,
    /// The cost those checks took.
    cost: u64,
    /// Checks answered denied (429; batch items included).
    denied: u64,
    /// Denials by the id of the limit that bound them (`-` when no limit was named); they add
    /// up to `denied`.
    #[schema(value_type = BTreeMap<String, u64>)]
    denied_by: BTreeMap<String, u64>,
    /// The hour's or day's start (UTC).
    #[schema(format = DateTime)]
    start: String,
}

/// What `history` answers.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UsageHistory)]
pub struct HistoryView {
    /// The client; absent in a tenant's history.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    client: Option<String>,
    /// The first point's start.
    #[schema(format = DateTime)]
    from: String,
    /// Every hour or day of the span, oldest first; zero where nothing was answered.
    points: Vec<HistoryPoint>,
    /// `hour` or `day`.
    #[schema(pattern = "^(hour|day)$")]
    step: &'static str,
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    tenant: String,
    /// The end of the last point.
    #[schema(format = DateTime)]
    to: String,
    /// The sum of the points.
    total: TotalCounts,
}

/// The sum of a history's points.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TotalCounts {
    admitted: u64,
    cost: u64,
    denied: u64,
    #[schema(value_type = BTreeMap<String, u64>)]
    denied_by: BTreeMap<String, u64>,
}

/// What `top` answers.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = TopClients)]
pub struct TopView {
    /// The clients with the most cost over the days, most first (ties: most admitted, then by
    /// name).
    clients: Vec<ClientUsage>,
    /// How many clients were seen over the days.
    clients_seen: u64,
    /// The first day's start (UTC midnight).
    #[schema(format = DateTime)]
    from: String,
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    tenant: String,
    /// The end of the last day.
    #[schema(format = DateTime)]
    to: String,
}

/// One client's totals over the days of `top`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientUsage {
    admitted: u64,
    #[schema(pattern = "^[A-Za-z0-9._~:@-]{1,128}$")]
    client: String,
    cost: u64,
    denied: u64,
}

fn rfc3339(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The starts of the points asked for: `[floor(from), to)` at `step`, within `max` points.
fn span(
    from: Option<i64>,
    to: Option<i64>,
    step: Step,
    default_points: i64,
    max: i64,
    now: i64,
) -> Result<(i64, i64), ApiError> {
    let to = to.unwrap_or(now);
    if from.is_some_and(|f| f >= to) {
        return Err(ApiError::invalid("to", "to must be after from"));
    }
    let from = match from {
        Some(f) => step.floor(f),
        None => step.floor(to - 1) - (default_points - 1) * step.ms(),
    };
    if from >= to {
        return Err(ApiError::invalid("to", "to must be after from"));
    }
    // The number of point starts in [from, to).
    let points = (to - from + step.ms() - 1) / step.ms();
    if points > max {
        let unit = step.as_str();
        return Err(ApiError::invalid(
            "to",
            format!("the span from..to holds {points} {unit}s; at most {max} are answered"),
        ));
    }
    Ok((from, from + points * step.ms()))
}

/// Whether the caller asked for CSV (`Accept: text/csv`).
fn wants_csv(req: &HttpRequest) -> bool {
    req.headers()
        .get_all(header::ACCEPT)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            range
                .split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/csv"))
        })
}

fn csv(body: String) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/csv; charset=utf-8")
        .insert_header((header::VARY, "Accept"))
        .body(body)
}

fn json<T: Serialize>(body: &T) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::VARY, "Accept"))
        .json(body)
}

/// A CSV cell as a spreadsheet will not run it: one that starts with `=`, `+`, `-` or `@` (a
/// client id may start with `-` or `@`) gets a leading `'`, as OWASP's CSV injection advice
/// says. Ids hold no comma, quote or line break, so nothing else needs quoting.
fn csv_cell(s: &str) -> std::borrow::Cow<'_, str> {
    if s.starts_with(['=', '+', '-', '@']) {
        format!("'{s}").into()
    } else {
        s.into()
    }
}

/// The history's points as CSV: `start,admitted,cost,denied`, then a `denied_by.<limit>`
/// column per limit that denied anything in the span.
fn history_csv(points: &[HistoryPoint]) -> String {
    let limits: BTreeSet<&str> = points
        .iter()
        .flat_map(|p| p.denied_by.keys().map(String::as_str))
        .collect();
    let mut out = String::from("start,admitted,cost,denied");
    for l in &limits {
        // Limit ids hold no comma, quote or line break: no quoting needed.
        let _ = write!(out, ",{}", csv_cell(&format!("denied_by.{l}")));
    }
    out.push('\n');
    for p in points {
        let _ = write!(out, "{},{},{},{}", p.start, p.admitted, p.cost, p.denied);
        for l in &limits {
            let _ = write!(out, ",{}", p.denied_by.get(*l).copied().unwrap_or(0));
        }
        out.push('\n');
    }
    out
}

async fn history(
    Managed { tenant, client, .. }: Managed,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let q: HistoryParams = query(&req)?;
    let (step, default_points, max) = match q.step.as_deref() {
        None | Some("hour") => (Step::Hour, 24, MAX_HOURS),
        Some("day") => (Step::Day, 30, MAX_DAYS),
        Some(_) => return Err(ApiError::invalid("step", "step must be hour or day")),
    };
    let (from, to) = span(
        instant("from", q.from.as_deref())?,
        instant("to", q.to.as_deref())?,
        step,
        default_points,
        max,
        state.limiter.clock().now_ms(),
    )?;
    let stored = state
        .store
        .usage_points(
            tenant.as_str(),
            client.as_ref().map(|c| c.as_str()),
            step,
            from,
            to,
        )
        .await?;
    let mut stored = stored.into_iter().peekable();
    let mut total = Counts::default();
    let mut points = Vec::new();
    let mut start = from;
    while start < to {
        let counts = match stored.peek() {
            Some(p) if p.start == start => stored.next().map(|p| p.counts).unwrap_or_default(),
            _ => Counts::default(),
        };
        total.add(&counts);
        points.push(HistoryPoint {
            start: rfc3339(start),
            admitted: counts.admitted,
            cost: counts.cost,
            denied: counts.denied,
            denied_by: counts.denied_by,
        });
        start += step.ms();
    }
    if wants_csv(&req) {
        return Ok(csv(history_csv(&points)));
    }
    Ok(json(&HistoryView {
        tenant: tenant.to_string(),
        client: client.map(|c| c.to_string()),
        step: step.as_str(),
        from: rfc3339(from),
        to: rfc3339(to),
        points,
        total: TotalCounts {
            admitted: total.admitted,
            cost: total.cost,
            denied: total.denied,
            denied_by: total.denied_by,
        },
    }))
}

#[utoipa::path(
    get,
    path = "/v1/usage/{tenant}/{client}/history",
    tag = "usage",
    operation_id = "get_client_history",
    summary = "A client's checks by hour or day: admitted, cost, denied and denials by limit",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), ("client" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "A client of the tenant", example = "key-123"), HistoryParams),
    responses(
        (status = 200, description = "One point per hour or day of the span, zero where nothing was answered", content(
            (HistoryView = "application/json"),
            (String = "text/csv", example = "start,admitted,cost,denied,denied_by.per-minute\n2026-11-23T14:00:00Z,120,130,7,7\n"),
        )),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn client_history(
    m: Managed,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    history(m, req, state).await
}

#[utoipa::path(
    get,
    path = "/v1/usage/{tenant}/history",
    tag = "usage",
    operation_id = "get_tenant_history",
    summary = "A tenant's checks (all its clients) by hour or day",
    description = "This literal path takes precedence over `/v1/usage/{tenant}/{client}`, as `/v1/usage/{tenant}/top` does: the current usage of a client named `history` or `top` cannot be read there (its history can, at `/v1/usage/{tenant}/{client}/history`).",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), HistoryParams),
    responses(
        (status = 200, description = "One point per hour or day of the span, zero where nothing was answered", content(
            (HistoryView = "application/json"),
            (String = "text/csv", example = "start,admitted,cost,denied\n2026-11-23T14:00:00Z,1200,1300,70\n"),
        )),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn tenant_history(
    m: Managed,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    history(m, req, state).await
}

#[utoipa::path(
    get,
    path = "/v1/usage/{tenant}/top",
    tag = "usage",
    operation_id = "get_top_clients",
    summary = "The clients with the most cost over whole UTC days",
    description = "Read from a per-day index of the clients seen, never a scan of every client's history.",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9._~:@-]{1,128}$", description = "The tenant", example = "acme"), TopParams),
    responses(
        (status = 200, description = "The clients, most cost first", content(
            (TopView = "application/json"),
            (String = "text/csv", example = "client,admitted,cost,denied\nkey-123,1200,1300,70\n"),
        )),
        AdminErrors,
    ),
    security(("bearer" = [])),
)]
pub async fn top(
    Managed { tenant, .. }: Managed,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let q: TopParams = query(&req)?;
    let limit = page_size(q.limit.as_deref(), 10, 1000)?;
    let (from, to) = span(
        instant("from", q.from.as_deref())?,
        instant("to", q.to.as_deref())?,
        Step::Day,
        1,
        MAX_TOP_DAYS,
        state.limiter.clock().now_ms(),
    )?;
    let mut seen = state.store.clients_seen(tenant.as_str(), from, to).await?;
    let clients_seen = seen.len() as u64;
    seen.sort_unstable_by(|a, b| {
        (b.cost, b.admitted)
            .cmp(&(a.cost, a.admitted))
            .then_with(|| a.client.cmp(&b.client))
    });
    seen.truncate(limit);
    if wants_csv(&req) {
        let mut out = String::from("client,admitted,cost,denied\n");
        for c in &seen {
            let client = csv_cell(&c.client);
            let _ = writeln!(out, "{client},{},{},{}", c.admitted, c.cost, c.denied);
        }
        return Ok(csv(out));
    }
    Ok(json(&TopView {
        tenant: tenant.to_string(),
        from: rfc3339(from),
        to: rfc3339(to),
        clients_seen,
        clients: seen
            .into_iter()
            .map(|c| ClientUsage {
                client: c.client,
                admitted: c.admitted,
                cost: c.cost,
                denied: c.denied,
            })
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::history::{DAY_MS, HOUR_MS};

    const T0: i64 = 1_795_392_000_000; // 2026-11-23T00:00:00Z

    #[test]
    fn spans_start_at_the_step_and_end_after_the_last_point() {
        // 14:30 to 17:10: the hours starting 14:00, 15:00, 16:00 and 17:00.
        let (from, to) = span(
            Some(T0 + 14 * HOUR_MS + 1_800_000),
            Some(T0 + 17 * HOUR_MS + 600_000),
            Step::Hour,
            24,
            MAX_HOURS,
            0,
        )
        .unwrap();
        assert_eq!((from, to), (T0 + 14 * HOUR_MS, T0 + 18 * HOUR_MS));
        // Aligned `to` is excluded.
        let (_, to) = span(Some(T0), Some(T0 + DAY_MS), Step::Hour, 24, MAX_HOURS, 0).unwrap();
        assert_eq!(to, T0 + DAY_MS);
        // The default `from`: `default_points` points ending with the one holding `to`.
        let (from, to) = span(None, Some(T0 + 5 * DAY_MS + 1), Step::Day, 30, MAX_DAYS, 0).unwrap();
        assert_eq!((to - from) / DAY_MS, 30);
    }

    #[test]
    fn empty_and_too_long_spans_are_refused() {
        assert!(span(Some(T0), Some(T0), Step::Hour, 24, MAX_HOURS, 0).is_err());
        assert!(span(Some(T0 + 1), Some(T0), Step::Hour, 24, MAX_HOURS, 0).is_err());
        // 14:30 to 14:10: refused, though both fall in the hour starting 14:00.
        let (a, b) = (T0 + 14 * HOUR_MS + 1_800_000, T0 + 14 * HOUR_MS + 600_000);
        assert!(span(Some(a), Some(b), Step::Hour, 24, MAX_HOURS, 0).is_err());
        let hours = |n| {
            span(
                Some(T0),
                Some(T0 + n * HOUR_MS),
                Step::Hour,
                24,
                MAX_HOURS,
                0,
            )
        };
        assert!(hours(MAX_HOURS).is_ok());
        let e = hours(MAX_HOURS + 1).unwrap_err();
        assert!(e.to_string().contains("745 hours"), "{e}");
    }

    #[test]
    fn csv_cells_that_a_spreadsheet_would_run_are_quoted() {
        for (id, cell) in [
            ("-1+1", "'-1+1"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("key-123", "key-123"),
        ] {
            assert_eq!(csv_cell(id), cell);
        }
    }

    #[test]
    fn csv_has_a_column_per_limit_that_denied() {
        let p = |start: &str, denied_by: &[(&str, u64)]| HistoryPoint {
            start: start.into(),
            admitted: 3,
            cost: 4,
            denied: denied_by.iter().map(|d| d.1).sum(),
            denied_by: denied_by.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        };
        let out = history_csv(&[p("a", &[("rps", 2)]), p("b", &[("day", 1)])]);
        assert_eq!(
            out,
            "start,admitted,cost,denied,denied_by.day,denied_by.rps\n\
             a,3,4,2,0,2\nb,3,4,1,1,0\n"
        );
    }
}
