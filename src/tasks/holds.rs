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
/// Holds expired in one step of the store (one transaction on the embedded store).
const EXPIRY_BATCH: usize = 1_000;
/// How long one sweep goes on taking batches while it finds full ones; what is left waits for
/// the next, so a flood of holds cannot keep the sweep from its interval.
const SWEEP_TIME: Duration = Duration::from_millis(800);

/// Runs until `stop` says so.
pub async fn run(holds: Arc<HoldService>, mut stop: watch::Receiver<bool>) {
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(EXPIRY_INTERVAL) => {}
            _ = stop.changed() => return,
        }
        match sweep(&holds).await {
            Ok(()) => failing = false,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "expiring holds failed; trying again every second");
                }
                failing = true;
            }
        }
    }
}

/// Expires batches of due holds until one comes back short or [`SWEEP_TIME`] is spent.
async fn sweep(holds: &HoldService) -> Result<(), crate::store::StoreError> {
    let began = tokio::time::Instant::now();
    while holds.expire_due(EXPIRY_BATCH).await? == EXPIRY_BATCH {
        if began.elapsed() >= SWEEP_TIME {
            break;
        }
    }
    Ok(())
}
