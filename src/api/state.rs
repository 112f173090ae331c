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
