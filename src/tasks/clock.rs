//! The fleet's time: reads the store's clock into the `FleetClock` every few seconds, so
//! that every instance cuts buckets, windows and periods on the same clock whatever its own
//! says, and reports what it found (`quotad_clock_offset_seconds`, its uncertainty, a log line
//! past `fleet.clock_warn_ms`, `/readyz`).
//!
//! A reading is timed on the monotonic clock; of a few readings, the one with the shortest
//! round trip is the most certain, and the clock keeps it unless the one it has is still
//! better (`FleetClock::observe`). On the embedded store (one process) there is no other clock:
//! the local one is the fleet's.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::{Clock, ClockState};
use crate::limiter::Membership;
use crate::metrics::Metrics;
use crate::store::DynCounterStore;

/// Readings at start-up, before the first check, and at each measurement after.
const FIRST_READINGS: usize = 5;
const READINGS: usize = 3;
/// How long one reading may take: a slower answer says little of the clock.
const READING_TIMEOUT: Duration = Duration::from_secs(1);

pub struct ClockTask {
    store: DynCounterStore,
    clock: Arc<dyn Clock>,
    /// Where the check path learns how uncertain the reading is (a sliding window is judged
    /// that much wider).
    fleet: Arc<Membership>,
    metrics: Arc<Metrics>,
    every: Duration,
    /// An offset past this (ms) is logged (once, until it comes back under).
    warn_ms: i64,
    warned: bool,
}

impl ClockTask {
    pub fn new(
        store: DynCounterStore,
        clock: Arc<dyn Clock>,
        fleet: Arc<Membership>,
        metrics: Arc<Metrics>,
        every: Duration,
        warn_ms: i64,
    ) -> Self {
        Self {
            store,
            clock,
            fleet,
            metrics,
            every,
            warn_ms,
            warned: false,
        }
    }

    /// The first readings, before any check: the fleet's time from the start.
    pub async fn start(&mut self) {
        self.measure(FIRST_READINGS).await;
    }

    /// Measures every interval until `shutdown` turns true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.every) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            self.measure(READINGS).await;
        }
    }

    /// Takes up to `readings` readings of the store's clock into the fleet clock, and
    /// reports the state.
    pub async fn measure(&mut self, readings: usize) {
        let Some(fleet) = self.clock.fleet() else {
            return;
        };
        for _ in 0..readings {
            let sent = fleet.monotonic_ms();
            match tokio::time::timeout(READING_TIMEOUT, self.store.clock_ms()).await {
                Ok(Ok(Some(shared))) => {
                    fleet.observe(sent, fleet.monotonic_ms(), shared);
                }
                Ok(Ok(None)) => {
                    fleet.set_alone();
                    break;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "reading the store's clock");
                    break;
                }
                Err(_) => break,
            }
        }
        self.report(fleet.state());
    }

    fn report(&mut self, state: ClockState) {
        self.metrics.clock(state);
        self.fleet.set_clock_uncertainty(match state {
            ClockState::Alone => 0,
            ClockState::Unknown => i64::MAX,
            ClockState::Measured { uncertainty_ms, .. } => uncertainty_ms,
        });
        let ClockState::Measured {
            offset_ms,
            uncertainty_ms,
        } = state
        else {
            return;
        };
        let far = offset_ms.abs() > self.warn_ms;
        if far && !self.warned {
            tracing::warn!(
                offset_ms,
                uncertainty_ms,
                "this host's clock is off the store's by more than fleet.clock_warn_ms: buckets are cut on the store's clock, but other software on the host is not corrected"
            );
        } else if !far && self.warned {
            tracing::info!(
                offset_ms,
                uncertainty_ms,
                "this host's clock agrees with the store's again"
            );
        }
        self.warned = far;
    }
}
