//! What every handler shares, built once at start-up and handed over as `web::Data`.

use std::sync::Arc;
use std::time::Duration;

use super::auth::Auth;
use super::forward_auth::ForwardAuth;
use crate::fleet::Membership;
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::policy::PolicyCache;
use crate::store::DynStore;

/// What handlers share; built once, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub limiter: Arc<Limiter>,
    pub policies: Arc<PolicyCache>,
    pub store: DynStore,
    pub metrics: Arc<Metrics>,
    pub auth: Arc<Auth>,
    pub store_timeout: Duration,
    /// This instance's place in the fleet (`/readyz`).
    pub fleet: Arc<Membership>,
    /// Where `/v1/forward-auth` finds its inputs, and what it answers a denial with.
    pub forward_auth: Arc<ForwardAuth>,
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
