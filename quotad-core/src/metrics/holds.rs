//! The metrics of holds (reservations): how many were taken and how each ended, and how far
//! settled costs were from their estimates.
//!
//! Holds open across a fleet: `sum(quotad_holds_total{event="taken"}) -
//! sum(quotad_holds_total{event!="taken"})`, as a hold may end on another instance than the
//! one that took it.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

/// Buckets of a settled cost over its estimate.
const RATIO_BUCKETS: [f64; 13] = [
    0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0, 10.0,
];

pub struct HoldMetrics {
    /// By event: `taken`, `settled`, `released`, `expired`.
    events: [IntCounter; 4],
    ratio: Histogram,
    /// Units the estimates took beyond the real cost (`over`) and short of it (`under`).
    error: [IntCounter; 2],
}

impl HoldMetrics {
    pub(super) fn new(registry: &Registry) -> Self {
        let events = IntCounterVec::new(
            Opts::new(
                "quotad_holds_total",
                "Holds (reservations) taken on this instance, and ended on it: settled at their \
                 real cost, released, or expired at their estimate.",
            ),
            &["event"],
        )
        .expect("valid metric");
        let ratio = Histogram::with_opts(
            HistogramOpts::new(
                "quotad_hold_cost_ratio",
                "A settled hold's real cost over its estimate (1: the estimate was exact).",
            )
            .buckets(RATIO_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        let error = IntCounterVec::new(
            Opts::new(
                "quotad_hold_estimate_error_total",
                "Units by which settled holds' estimates missed their real cost: `over` \
                 (given back at the settle) and `under` (charged at the settle, possibly past \
                 a limit's max).",
            ),
            &["direction"],
        )
        .expect("valid metric");
        for c in [
            Box::new(events.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(ratio.clone()),
            Box::new(error.clone()),
        ] {
            registry.register(c).expect("unique metric");
        }
        HoldMetrics {
            events: ["taken", "settled", "released", "expired"]
                .map(|e| events.with_label_values(&[e])),
            ratio,
            error: ["over", "under"].map(|d| error.with_label_values(&[d])),
        }
    }

    pub fn taken(&self) {
        self.events[0].inc();
    }

    /// A hold of `estimate` settled at `cost`.
    pub fn settled(&self, estimate: u64, cost: u64) {
        self.events[1].inc();
        if estimate > 0 {
            self.ratio.observe(cost as f64 / estimate as f64);
        }
        if estimate > cost {
            self.error[0].inc_by(estimate - cost);
        } else {
            self.error[1].inc_by(cost - estimate);
        }
    }

    pub fn released(&self) {
        self.events[2].inc();
    }

    pub fn expired(&self) {
        self.events[3].inc();
    }
}
