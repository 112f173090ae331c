//! The usage history's writes, for the sync task: what checks were answered, summed in memory
//! (`crate::history`), written every `history.write_interval_ms` with the same rules as the
//! hits. A write costs a row per client active since the last one, so on a slow store it can
//! take seconds: the sync task runs it beside its rounds ([`HistoryWriter`] is shared with a
//! task of its own), so that a round's read back never waits on it.

use std::sync::Arc;
use std::time::Duration;

use crate::history::checks_in;
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::store::history::UsageDelta;
use crate::store::{DynHistoryStore, StoreError};

/// Most usage-history rows written in one store call.
const HISTORY_CHUNK: usize = 16_384;

/// Writes what the limiter summed for the usage history to the store.
pub struct HistoryWriter {
    limiter: Arc<Limiter>,
    store: DynHistoryStore,
    metrics: Arc<Metrics>,
    /// Deadline of one write, all its calls together (`sync.timeout`).
    timeout: Duration,
}

impl HistoryWriter {
    pub fn new(
        limiter: Arc<Limiter>,
        store: DynHistoryStore,
        metrics: Arc<Metrics>,
        timeout: Duration,
    ) -> Self {
        Self {
            limiter,
            store,
            metrics,
            timeout,
        }
    }

    /// Writes the answers checks got since the last write to the usage history. Refused with
    /// nothing written: they go back, to be tried at the next write. Outcome unknown: not resent
    /// (increments), counted in `quotad_history_unrecorded_checks_total`.
    pub(crate) async fn write(&self, answers: Vec<UsageDelta>) {
        let history = self.limiter.history();
        self.export_dropped();
        // The rows, and what the client entries summed (a row and an entry's sum may be of the
        // same client and hour: the store adds them up).
        let mut deltas = history.drain();
        deltas.extend(answers);
        // In calls of at most HISTORY_CHUNK rows: a call's time grows with its rows, and a
        // write interval's worth of distinct clients (a flood of new ids) in one call could
        // outlast `sync.timeout` while the store is fine. The calls together get one
        // `sync.timeout` too, so that counter writes (and shutdown) do not wait on a long
        // history: what is left waits for the next write.
        let deadline = std::time::Instant::now() + self.timeout;
        while !deltas.is_empty() {
            if std::time::Instant::now() >= deadline {
                history.restore(deltas);
                return;
            }
            // From the tail: nothing left is copied.
            let chunk = deltas.split_off(deltas.len().saturating_sub(HISTORY_CHUNK));
            if !self.write_chunk(chunk).await {
                // The store is failing or slow: what was not sent waits for the next write.
                if !deltas.is_empty() {
                    history.restore(deltas);
                }
                return;
            }
        }
    }

    /// Exports (and logs) the checks whose answers found no room in memory since the last time.
    pub(crate) fn export_dropped(&self) {
        let dropped = self.limiter.history().take_dropped();
        if dropped > 0 {
            self.metrics.unrecorded_history(dropped);
            tracing::warn!(
                checks = dropped,
                "usage history: no room in memory for these checks' answers"
            );
        }
    }

    async fn write_chunk(&self, deltas: Vec<UsageDelta>) -> bool {
        let started = std::time::Instant::now();
        let res = tokio::time::timeout(self.timeout, self.store.add_usage(&deltas)).await;
        let secs = started.elapsed().as_secs_f64();
        match res {
            Ok(Ok(())) => {
                self.metrics.store_op("add_usage", "ok", secs);
                true
            }
            Ok(Err(StoreError::Uncertain(e))) => {
                self.metrics.store_op("add_usage", "uncertain", secs);
                self.lost(&deltas, &e);
                false
            }
            Err(_) => {
                self.metrics.store_op("add_usage", "timeout", secs);
                self.lost(&deltas, "timed out");
                false
            }
            Ok(Err(e)) if e.is_transient() => {
                self.metrics.store_op("add_usage", "unavailable", secs);
                tracing::warn!(error = %e, "sync: writing usage history failed; kept for the next write");
                self.limiter.history().restore(deltas);
                false
            }
            Ok(Err(e)) => {
                // Not a passing outage (a schema or data error): retrying would fail alike.
                self.metrics.store_op("add_usage", "error", secs);
                self.lost(&deltas, &e.to_string());
                false
            }
        }
    }

    pub(crate) fn lost(&self, deltas: &[UsageDelta], why: &str) {
        let checks = checks_in(deltas);
        self.metrics.unrecorded_history(checks);
        tracing::warn!(
            checks,
            why,
            "sync: these checks' answers may be missing from the usage history; not resent"
        );
    }
}
