//! What every handler shares, built once at start-up and handed over as `web::Data`.

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::HeaderName;
use actix_web::http::StatusCode;

use crate::auth::Auth;
use crate::checks::CheckService;
use crate::config::{ForwardAuthSettings, ResourceSource};
use crate::limiter::{Limiter, Membership};
use crate::metrics::Metrics;
use crate::policy::PolicyCache;
use crate::store::DynStore;

/// What handlers share; built once, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Decides every check (`crate::checks`).
    pub checks: Arc<CheckService>,
    /// Takes and ends reservations (`crate::holds`).
    pub holds: Arc<crate::holds::HoldService>,
    pub limiter: Arc<Limiter>,
    pub policies: Arc<PolicyCache>,
    pub store: DynStore,
    pub metrics: Arc<Metrics>,
    pub auth: Arc<Auth>,
    pub store_timeout: Duration,
    /// `server.request_timeout_ms`: a request body must arrive whole, and a gRPC call finish,
    /// within this.
    pub request_timeout: Duration,
    /// This instance's place in the fleet (`/readyz`).
    pub fleet: Arc<Membership>,
    /// Where `/v1/forward-auth` finds its inputs, and what it answers a denial with.
    pub forward_auth: Arc<ForwardAuth>,
    /// OpenTelemetry traces, when `traces.otlp_endpoint` is set.
    pub traces: Option<Arc<crate::traces::Traces>>,
}

impl AppState {
    /// The state, lent by the request, for the check routes: the `web::Data` extractor clones
    /// an `Arc` whose count every worker writes, twice a request, on a cache line that then
    /// moves between the cores.
    pub(super) fn of(req: &actix_web::HttpRequest) -> Result<&AppState, super::error::ApiError> {
        req.app_data::<actix_web::web::Data<AppState>>()
            .map(|d| d.get_ref())
            .ok_or_else(|| super::error::ApiError::Internal("the app state is not set".into()))
    }
}

/// The forward-auth settings, parsed once: where `/v1/forward-auth` finds its inputs, and what
/// it answers a denial with.
#[derive(Clone, Debug)]
pub struct ForwardAuth {
    pub(super) tenant: HeaderName,
    pub(super) client: HeaderName,
    /// None: the cost is 1 and no header is read (`forward_auth.cost_header` unset).
    pub(super) cost: Option<HeaderName>,
    /// Where the original request's method and URI are looked for, in order.
    pub(super) resource_from: Vec<ResourceSource>,
    pub token: HeaderName,
    pub(super) deny: StatusCode,
}

impl ForwardAuth {
    /// From settings that `Settings::validate` has checked.
    pub fn new(s: &ForwardAuthSettings) -> Self {
        let name =
            |n: &str| HeaderName::from_bytes(n.as_bytes()).expect("checked by the configuration");
        ForwardAuth {
            tenant: name(&s.tenant_header),
            client: name(&s.client_header),
            cost: s.cost_header.as_deref().map(name),
            resource_from: s
                .resource_from
                .iter()
                .filter_map(|n| ResourceSource::parse(n))
                .collect(),
            token: name(&s.token_header),
            deny: StatusCode::from_u16(s.deny_status).unwrap_or(StatusCode::TOO_MANY_REQUESTS),
        }
    }
}
