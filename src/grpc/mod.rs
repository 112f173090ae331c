//! Envoy's rate limit service over gRPC (`envoy.service.ratelimit.v3.RateLimitService`), served on
//! `server.grpc_bind` beside the HTTP API, deciding through the same check service
//! (`crate::checks`) with the same tokens (`crate::auth`).
//!
//! Mapping: the request's `domain` is the tenant. In each descriptor, the entry whose key is
//! `grpc.client_key` names the client, and the other entries, in order, form the resource
//! `key=value/key=value` that limits match exactly or by prefix; a value that begins with `/` is
//! a path, normalised as forward-auth normalises paths. `hits_addend` is the cost (0
//! means 1, as Envoy does; a descriptor's own `hits_addend` wins over the request's).
//!
//! With `grpc.usage_after_the_fact` (Envoy AI Gateway's pattern: a call on the request, and one
//! at the stream's end carrying the tokens used), a `hits_addend` of 0 is a check that takes
//! nothing, refused once a limit is past its `max`, and one above 0 is usage already spent:
//! charged whatever the limits have left, so the request after the one that crossed a budget
//! is refused.
//!
//! The descriptors of one client are decided together as one check over every limit any of them
//! meets: all or nothing, so a request denied by one descriptor consumes nothing from the others
//! (where envoyproxy/ratelimit counts the request against every descriptor it checked). That one
//! check has one cost: when the descriptors of a client carry different `hits_addend`s, the
//! largest is taken for all of them.
//! Descriptors of several clients are decided client by client, in order. A tenant without a
//! quota, a descriptor without the client entry, or one no limit matches answers OK, as Envoy
//! expects of a service without a rule.
//!
//! Bounds, so that no caller can stall the service with one call: a request is at most
//! [`MAX_MESSAGE_BYTES`] and [`MAX_DESCRIPTORS`] descriptors of at most [`MAX_ENTRIES`]
//! entries each (refused `OUT_OF_RANGE` or `INVALID_ARGUMENT` before anything is decided),
//! grouped by client in linear time; the server gives each call `server.request_timeout_ms`,
//! each connection at most [`conn::MAX_STREAMS_PER_CONNECTION`] calls at once, and closes a
//! connection silent for `grpc.idle_timeout_ms` ([`conn`]).

pub mod conn;

use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tonic::{Request, Response, Status};

use crate::auth::{digest, Auth, Refusal};
use crate::checks::{ceil_secs, CheckService};
use crate::config::GrpcSettings;
use crate::domain::{
    normalize_target, resource_from_bytes, ClientId, FieldError, LimitKind, Period, Policy,
    TenantId, MAX_COST,
};
use crate::limiter::{Binding, Decision};

/// The service: the check service and the tokens the HTTP API shares.
pub struct RateLimiter {
    checks: Arc<CheckService>,
    auth: Arc<Auth>,
    client_key: String,
    /// `grpc.usage_after_the_fact`: 0 checks and takes nothing, above 0 is charged.
    after_the_fact: bool,
}

/// The largest request accepted, encoded: the HTTP API's body cap.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// The most descriptors in one request (Envoy sends one per matching rate limit action).
pub const MAX_DESCRIPTORS: usize = 256;
/// The most entries in one descriptor.
pub const MAX_ENTRIES: usize = 64;

impl RateLimiter {
    pub fn new(checks: Arc<CheckService>, auth: Arc<Auth>, grpc: &GrpcSettings) -> Self {
        RateLimiter {
            checks,
            auth,
            client_key: grpc.client_key.clone(),
            after_the_fact: grpc.usage_after_the_fact,
        }
    }

    /// As a tonic service.
    pub fn service(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }
}

/// Refuses a request past the bounds of the module comment.
fn within_bounds(req: &RateLimitRequest) -> Result<(), Status> {
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "descriptors: at most {MAX_DESCRIPTORS}, got {}",
            req.descriptors.len()
        )));
    }
    if let Some(i) = req
        .descriptors
        .iter()
        .position(|d| d.entries.len() > MAX_ENTRIES)
    {
        return Err(Status::invalid_argument(format!(
            "descriptors[{i}].entries: at most {MAX_ENTRIES}"
        )));
    }
    Ok(())
}

fn refused(r: Refusal) -> Status {
    match r {
        Refusal::Unauthenticated(m) => Status::unauthenticated(m),
        Refusal::PermissionDenied(m) => Status::permission_denied(m),
    }
}

fn invalid(e: FieldError) -> Status {
    Status::invalid_argument(format!("{}: {}", e.field, e.message))
}

/// One descriptor, read: its client (None without the client entry) and resource.
struct Read {
    client: Option<ClientId>,
    resource: Option<String>,
    cost: u64,
}

fn read(d: &RateLimitDescriptor, client_key: &str, i: usize, cost: u64) -> Result<Read, Status> {
    let mut client = None;
    let mut parts: Vec<String> = Vec::new();
    for e in &d.entries {
        if e.key == client_key && client.is_none() {
            client = Some(client_id(&e.value));
        } else if e.value.starts_with('/') {
            parts.push(format!("{}={}", e.key, path_value(&e.value)));
        } else {
            parts.push(format!("{}={}", e.key, e.value));
        }
    }
    // Values with bytes a resource may not hold (raw UTF-8) are percent-encoded and long ones
    // cut, not refused: refusing fails the request, which a fail-open Envoy lets through.
    let resource = (!parts.is_empty()).then(|| resource_from_bytes(parts.join("/").as_bytes()));
    let cost = match d.hits_addend.as_ref().map(|h| h.value) {
        Some(0) | None => cost,
        Some(n) => n,
    };
    if cost > MAX_COST {
        return Err(Status::invalid_argument(format!(
            "descriptors[{i}]: hits_addend must be 0..={MAX_COST}"
        )));
    }
    Ok(Read {
        client,
        resource,
        cost,
    })
}

/// A descriptor value that begins with `/`, as a request path: its bytes kept as
/// [`resource_from_bytes`] keeps them, the path before `?` or `#` normalised as forward-auth
/// normalises paths ([`normalize_target`]), the query kept as given. Envoy passes a path as it
/// came (`request_headers` of `:path`), so without this `//api`, `/API` or `/%61pi` would walk
/// past a limit on `path=/api*`.
fn path_value(value: &str) -> String {
    normalize_target(&resource_from_bytes(value.as_bytes())).into_owned()
}

/// The client a descriptor names. A value that is not a valid client id (a header with spaces,
/// longer than 128) is not refused, which would fail the whole request and, with Envoy's
/// `failure_mode_deny: false`, let it through unlimited: it becomes `h-` and 32 hex digits of
/// its SHA-256, the same for the same value.
fn client_id(value: &str) -> ClientId {
    ClientId::parse(value).unwrap_or_else(|_| {
        let d = digest(value);
        ClientId::parse(&format!("h-{}", hex::encode(&d[..16]))).expect("hex is a valid id")
    })
}

/// Envoy's `current_limit` of a limit: its max per one of Envoy's units. A window of exactly a
/// second, minute, hour or day, or a calendar period, maps as it is; another window gets the
/// nearest unit (the limit's id in `name` says which limit it is). A token bucket gives its
/// refill: `rate` per the unit of `per`, found the same way.
fn current_limit(id: &str, max: u64, kind: LimitKind) -> RateLimit {
    let by_length = |ms: i64| match ms {
        ms if ms < 60_000 => Unit::Second,
        ms if ms < 3_600_000 => Unit::Minute,
        ms if ms < 86_400_000 => Unit::Hour,
        _ => Unit::Day,
    };
    let per_unit = match kind {
        LimitKind::Tokens { rate, .. } => rate,
        _ => max,
    };
    let unit = match kind {
        LimitKind::Calendar(p) => match p {
            Period::Second => Unit::Second,
            Period::Minute => Unit::Minute,
            Period::Hour => Unit::Hour,
            Period::Day => Unit::Day,
            Period::Month => Unit::Month,
        },
        LimitKind::Sliding { window_ms, .. } => by_length(window_ms),
        LimitKind::Tokens { per_ms, .. } => by_length(per_ms.into()),
    };
    RateLimit {
        name: id.to_owned(),
        requests_per_unit: u32::try_from(per_unit).unwrap_or(u32::MAX),
        unit: unit as i32,
    }
}

/// A descriptor's status from the limit that binds it: `current_limit`, `limit_remaining` and
/// `duration_until_reset` (the code is the caller's).
fn describe(st: &mut DescriptorStatus, b: &Binding, policy: &Policy) {
    let kind = policy
        .limits
        .iter()
        .find(|l| l.id.as_str() == b.limit_id)
        .map(|l| l.kind);
    st.current_limit = kind.map(|k| current_limit(b.limit_id.as_str(), b.limit, k));
    st.limit_remaining = u32::try_from(b.remaining).unwrap_or(u32::MAX);
    st.duration_until_reset = Some(duration(b.reset_after_ms));
}

fn duration(ms: i64) -> PbDuration {
    let ms = ms.max(0);
    PbDuration {
        seconds: ms / 1000,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    }
}

impl RateLimiter {
    /// The decision of one `ShouldRateLimit` call.
    async fn rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim().to_owned());
        let who = self
            .auth
            .checker_with(token.as_deref())
            .await
            .map_err(refused)?;
        let req = request.into_inner();
        within_bounds(&req)?;
        let tenant = TenantId::parse_field(&req.domain, "domain").map_err(invalid)?;
        if let Some(w) = &who {
            w.may_check(tenant.as_str()).map_err(refused)?;
        }
        // Envoy's meaning: 0 (unset) is 1. Reported after the fact: 0 is a check of nothing.
        let cost = match self.after_the_fact {
            true => u64::from(req.hits_addend),
            false => u64::from(req.hits_addend.max(1)),
        };
        let read: Vec<Read> = req
            .descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| read(d, &self.client_key, i, cost))
            .collect::<Result<_, _>>()?;

        let mut statuses: Vec<DescriptorStatus> = read
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            })
            .collect();
        let mut over = false;
        // The binding limit of the answer's headers: the first denial, else the least remaining.
        let mut headline: Option<Decision> = None;
        // Clients in order of first appearance, each with its descriptors: found by hash, so
        // that grouping stays linear in the descriptors.
        let mut groups: Vec<(&ClientId, Vec<usize>)> = Vec::new();
        let mut seen: HashMap<&ClientId, usize> = HashMap::with_capacity(read.len());
        for (i, r) in read.iter().enumerate() {
            if let Some(c) = &r.client {
                match seen.get(c) {
                    Some(&g) => groups[g].1.push(i),
                    None => {
                        seen.insert(c, groups.len());
                        groups.push((c, vec![i]));
                    }
                }
            }
        }
        for (client, idx) in groups {
            let resources: Vec<Option<&str>> =
                idx.iter().map(|&i| read[i].resource.as_deref()).collect();
            let cost = idx.iter().map(|&i| read[i].cost).max().unwrap_or(cost);
            let several = if self.after_the_fact && cost > 0 {
                self.checks
                    .charge_several(&tenant, client, cost, &resources)
                    .await
            } else {
                self.checks
                    .decide_several(&tenant, client, cost, &resources)
                    .await
            };
            let Some(several) = several else {
                continue;
            };
            let (d, policy) = (several.decision, several.policy);
            let denied = !d.allowed;
            let mut marked = false;
            // While the store fails, a peek per descriptor would be decided by the failure rule
            // again (and counted and logged as such): the decision's own binding stands for all.
            if d.store_failure.is_some() {
                if let Some(b) = &d.binding {
                    for &i in &idx {
                        describe(&mut statuses[i], b, &policy);
                        if denied {
                            statuses[i].code = Code::OverLimit as i32;
                        }
                    }
                }
                marked = true;
            }
            for (&i, b) in idx.iter().zip(&several.each) {
                let Some(b) = b else { continue };
                describe(&mut statuses[i], b, &policy);
                let st = &mut statuses[i];
                // Over: this descriptor's own limits cannot take the cost now.
                if denied && b.remaining < cost {
                    st.code = Code::OverLimit as i32;
                    marked = true;
                }
            }
            if denied && !marked {
                // Denied by this instance's share of a limit, not its count: name the binding
                // limit's descriptors.
                let id = d.binding.as_ref().map(|b| b.limit_id.clone());
                for &i in &idx {
                    if statuses[i].current_limit.as_ref().map(|l| l.name.as_str())
                        == id.as_ref().map(|id| id.as_str())
                    {
                        statuses[i].code = Code::OverLimit as i32;
                    }
                }
            }
            if denied && !over {
                over = true;
                headline = Some(d);
            } else if !over && d.binding.is_some() {
                let less = match (&headline, &d.binding) {
                    (Some(h), Some(b)) => h
                        .binding
                        .as_ref()
                        .is_none_or(|hb| b.remaining < hb.remaining),
                    _ => true,
                };
                if less {
                    headline = Some(d);
                }
            }
        }

        let mut headers = Vec::new();
        if let Some(d) = &headline {
            if let Some(b) = &d.binding {
                headers.push(header("RateLimit-Limit", b.limit.to_string()));
                headers.push(header("RateLimit-Remaining", b.remaining.to_string()));
                headers.push(header(
                    "RateLimit-Reset",
                    ceil_secs(b.reset_after_ms).to_string(),
                ));
            }
            if over {
                if let Some(ms) = d.retry_after_ms {
                    headers.push(header("Retry-After", ceil_secs(ms).max(1).to_string()));
                }
            }
        }
        Ok(Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers,
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let Some(traces) = self.checks.traces() else {
            return self.rate_limit(request).await;
        };
        // The caller's trace, from the W3C `traceparent` (and `tracestate`) metadata.
        let meta = |k: &str| {
            request
                .metadata()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (parent, state) = (meta("traceparent"), meta("tracestate"));
        let tenant = request.get_ref().domain.clone();
        let span = traces.start_span("should_rate_limit", parent.as_deref(), state.as_deref());
        let res = self.rate_limit(request).await;
        let allowed = res
            .as_ref()
            .ok()
            .map(|r| r.get_ref().overall_code == Code::Ok as i32);
        traces.end_call(span, &tenant, allowed);
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_units_map_as_they_are_and_others_to_the_nearest() {
        let w = |ms| LimitKind::Sliding {
            window_ms: ms,
            grain_ms: 100,
        };
        let unit = |k| current_limit("x", 5, k).unit;
        assert_eq!(unit(w(1_000)), Unit::Second as i32);
        assert_eq!(unit(w(60_000)), Unit::Minute as i32);
        assert_eq!(unit(w(3_600_000)), Unit::Hour as i32);
        assert_eq!(unit(w(86_400_000)), Unit::Day as i32);
        assert_eq!(unit(w(10_000)), Unit::Second as i32);
        assert_eq!(unit(w(600_000)), Unit::Minute as i32);
        assert_eq!(unit(LimitKind::Calendar(Period::Month)), Unit::Month as i32);
        assert_eq!(
            current_limit("x", u64::MAX, w(1_000)).requests_per_unit,
            u32::MAX
        );
    }

    #[test]
    fn invalid_client_values_become_stable_hashed_ids() {
        assert_eq!(client_id("10.0.0.1").as_str(), "10.0.0.1");
        let a = client_id("Mozilla/5.0 (X11)");
        assert_eq!(a, client_id("Mozilla/5.0 (X11)"));
        assert!(
            a.as_str().starts_with("h-") && a.as_str().len() == 34,
            "{a}"
        );
        assert_ne!(a, client_id("Mozilla/5.0 (X12)"));
    }

    #[test]
    fn durations_split_into_seconds_and_nanos() {
        let d = duration(1_250);
        assert_eq!((d.seconds, d.nanos), (1, 250_000_000));
        assert_eq!(duration(-5).seconds, 0);
    }
}
