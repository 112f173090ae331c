//! The metrics of increments of unknown outcome: how many hits are in doubt now, and how the
//! doubts were settled (the server's `tasks::doubts`).

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

/// Hits whose writes had no answer, until they are settled by reading them back.
pub struct DoubtMetrics {
    in_doubt: IntGauge,
    /// By outcome: `landed` (in the store, not resent), `resent` (missing, or a counter near
    /// its limit: sent again), `unknown` (given up: too many doubts held, or shutdown came
    /// first), `taken_back` (sent again and found to have landed twice).
    settled: IntCounterVec,
}

impl DoubtMetrics {
    pub(super) fn new(registry: &Registry) -> Self {
        let in_doubt = IntGauge::new(
            "quotad_store_doubtful_hits",
            "Hits whose sync writes had no answer and are not settled yet: each is read back \
             at consistency ALL once no replica can still apply it, then resent if it did not \
             land.",
        )
        .expect("valid metric");
        let settled = IntCounterVec::new(
            Opts::new(
                "quotad_store_doubtful_hits_settled_total",
                "Hits in doubt that were settled, by outcome: landed (found in the store), \
                 resent (missing, or of a counter near its limit: sent again), unknown (given \
                 up on, never resent), taken_back (sent again, had landed twice).",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        for outcome in ["landed", "resent", "unknown", "taken_back"] {
            settled.with_label_values(&[outcome]);
        }
        registry
            .register(Box::new(in_doubt.clone()))
            .expect("metric registered once");
        registry
            .register(Box::new(settled.clone()))
            .expect("metric registered once");
        DoubtMetrics { in_doubt, settled }
    }

    /// Hits in doubt now.
    pub fn set_in_doubt(&self, hits: u64) {
        self.in_doubt.set(hits.min(i64::MAX as u64) as i64);
    }

    pub fn in_doubt(&self) -> u64 {
        self.in_doubt.get().max(0) as u64
    }

    /// Hits settled: found in the store, sent again, or given up on.
    pub fn settled(&self, landed: u64, resent: u64, unknown: u64) {
        for (outcome, n) in [("landed", landed), ("resent", resent), ("unknown", unknown)] {
            if n > 0 {
                self.settled.with_label_values(&[outcome]).inc_by(n);
            }
        }
    }

    /// Hits sent again that had landed the first time too, taken back.
    pub fn taken_back(&self, hits: u64) {
        if hits > 0 {
            self.settled.with_label_values(&["taken_back"]).inc_by(hits);
        }
    }

    /// Hits given up on since start (`unknown`).
    pub fn unknown(&self) -> u64 {
        self.settled.with_label_values(&["unknown"]).get()
    }
}
