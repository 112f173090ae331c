//! Hold expiry: every second, the holds (reservations) whose time is over and that nobody
//! ended are expired: their estimate stays charged, and what they held of in-flight limits
//! comes back. Every instance of a fleet sweeps; a hold is expired once, by the instance whose
//! conditional write wins (`crate::holds`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::holds::HoldService;

/// How often the sweep runs.
pub const EXPIRY_INTERVAL: Duration = Duration::from_secs(1);
/// Most holds one sweep expires; more wait for the next.
const EXPIRY_BUDGET: usize = 1_000;

/// Runs until `stop` says so.
pub async fn run(holds: Arc<HoldService>, mut stop: watch::Receiver<bool>) {
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(EXPIRY_INTERVAL) => {}
            _ = stop.changed() => return,
        }
        match holds.expire_due(EXPIRY_BUDGET).await {
            Ok(_) => failing = false,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "expiring holds failed; trying again every second");
                }
                failing = true;
            }
        }
    }
}
