//! Prometheus metrics. `Metrics` owns its registry (no global state, so tests can run many
//! instances in one process) and has one method per event.
//!
//! Tenant and client ids never become labels unless `metrics.tenant_labels` is on: label
//! cardinality would otherwise grow with every id a caller invents.
//!
//! The two metrics every check writes are kept per thread (`per_thread`), so that the actix
//! workers do not share their cache lines.

mod doubts;
mod fleet;
mod holds;
mod per_thread;

pub use doubts::DoubtMetrics;
pub use fleet::FleetMetrics;
pub use holds::HoldMetrics;

use per_thread::PerThread;
use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry, TextEncoder,
};

/// Buckets of the check duration, seconds: a check decided in memory takes microseconds.
const CHECK_SECONDS: [f64; 15] = [
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25,
];
/// Buckets of a store operation's duration, seconds.
const STORE_SECONDS: [f64; 14] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

// The names and help texts are fixed, so building a metric cannot fail.
fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("valid metric")
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).expect("valid metric")
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid metric")
}

pub struct Metrics {
    registry: Registry,
    /// `quotad_checks_total` by `DecisionLabel`, one vector per thread slot (`checks`, for
    /// the registry) with each copy's children resolved once (`decided`): a check hashes no
    /// label.
    checks: PerThread<IntCounterVec>,
    decided: PerThread<[IntCounter; 4]>,
    tenant_checks: Option<IntCounterVec>,
    check_duration: PerThread<Histogram>,
    store_ops: IntCounterVec,
    store_duration: HistogramVec,
    sync_pending: IntGauge,
    read_backlog: IntGauge,
    active_counters: IntGauge,
    store_failure_decisions: IntCounterVec,
    uncertain_hits: IntCounter,
    store_degraded: IntGauge,
    deferred_hits: IntCounter,
    unsynced_hits_at_exit: IntGauge,
    compensation_failures: IntCounter,
    memory_cap_checks: IntCounterVec,
    last_units_checks: IntCounter,
    unread_first_checks: IntCounter,
    clock_offset: Gauge,
    clock_uncertainty: Gauge,
    unrecorded_hits: IntCounter,
    unrecorded_history: IntCounter,
    unrecorded_audit: IntCounter,
    /// argon2 runs of bearer tokens, by outcome: each token that is not a configured one costs
    /// at most one per process (`auth`), so a rate of `refused` is someone trying tokens.
    token_hash_runs: IntCounterVec,
    fleet: FleetMetrics,
    doubts: DoubtMetrics,
    holds: HoldMetrics,
    /// The served certificate's not-after, and reloads by outcome: registered by
    /// [`Metrics::tls_on`] only, as a 0 without TLS would read as a certificate long expired.
    tls_expiry: IntGauge,
    tls_reloads: IntCounterVec,
}

/// [`Metrics::batch_checks`].
pub struct BatchChecks<'m> {
    metrics: &'m Metrics,
    decided: [u64; 4],
    duration: prometheus::local::LocalHistogram,
}

impl BatchChecks<'_> {
    /// [`Metrics::check_decided`], summed here.
    pub fn check_decided(&mut self, tenant: &str, decision: DecisionLabel, seconds: f64) {
        self.decided[decision as usize] += 1;
        if let Some(t) = &self.metrics.tenant_checks {
            t.with_label_values(&[tenant, decision.as_str()]).inc();
        }
        self.duration.observe(seconds);
    }
}

impl Drop for BatchChecks<'_> {
    fn drop(&mut self) {
        for (counter, n) in self.metrics.decided.mine().iter().zip(self.decided) {
            if n > 0 {
                counter.inc_by(n);
            }
        }
        self.duration.flush();
    }
}

/// What a check decided, as a label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionLabel {
    Allowed,
    Denied,
    DryRunDenied,
    NoLimit,
}

impl DecisionLabel {
    const ALL: [DecisionLabel; 4] = [
        DecisionLabel::Allowed,
        DecisionLabel::Denied,
        DecisionLabel::DryRunDenied,
        DecisionLabel::NoLimit,
    ];

    fn as_str(self) -> &'static str {
        match self {
            DecisionLabel::Allowed => "allowed",
            DecisionLabel::Denied => "denied",
            DecisionLabel::DryRunDenied => "dry_run_denied",
            DecisionLabel::NoLimit => "no_limit",
        }
    }
}

impl Metrics {
    pub fn new(tenant_labels: bool) -> Self {
        let registry = Registry::new();
        let checks = PerThread::new(|| {
            counter_vec(
                "quotad_checks_total",
                "Checks decided, by decision.",
                &["decision"],
            )
        });
        let tenant_checks = tenant_labels.then(|| {
            counter_vec(
                "quotad_tenant_checks_total",
                "Checks decided, by tenant and decision (metrics.tenant_labels = true).",
                &["tenant", "decision"],
            )
        });
        let m = Self {
            decided: checks.map(|c| DecisionLabel::ALL.map(|d| c.with_label_values(&[d.as_str()]))),
            checks,
            tenant_checks,
            check_duration: PerThread::new(|| {
                histogram(
                    "quotad_check_duration_seconds",
                    "Time to decide one check, from parsed request to answer.",
                    CHECK_SECONDS.to_vec(),
                )
            }),
            store_ops: counter_vec(
                "quotad_store_operations_total",
                "Store operations, by operation and outcome (ok, unavailable, uncertain, error, timeout).",
                &["op", "outcome"],
            ),
            store_duration: HistogramVec::new(
                HistogramOpts::new(
                    "quotad_store_operation_duration_seconds",
                    "Store operation latency.",
                )
                .buckets(STORE_SECONDS.to_vec()),
                &["op"],
            )
            .expect("valid metric"),
            sync_pending: gauge(
                "quotad_sync_pending_hits",
                "Admitted hits held in memory, not yet written to the store.",
            ),
            read_backlog: gauge(
                "quotad_sync_read_backlog",
                "Counters far from their limits whose read back waits for a later sync round.",
            ),
            active_counters: gauge(
                "quotad_active_counters",
                "Counters (key x limit) held in memory.",
            ),
            store_failure_decisions: counter_vec(
                "quotad_store_failure_decisions_total",
                "Checks decided while the store failed, by the policy's on_store_failure rule and consistency.",
                &["rule", "consistency"],
            ),
            uncertain_hits: counter(
                "quotad_store_uncertain_hits_total",
                "Hits in increments whose outcome was unknown when answered (timed out after sending); sync writes among them are settled later (quotad_store_doubtful_hits).",
            ),
            store_degraded: gauge(
                "quotad_store_degraded",
                "1 while the last sync round's writes were refused or left in doubt, whole or in \
                 part (a node down with no quorum for some partitions, or one that stopped \
                 answering); 0 when the store took every write.",
            ),
            deferred_hits: counter(
                "quotad_sync_deferred_hits_total",
                "Hits a sync round could not send within sync.timeout, left pending for the next \
                 round: the store takes fewer writes than sync.max_delay_ms asks for.",
            ),
            unsynced_hits_at_exit: gauge(
                "quotad_unsynced_hits_at_exit",
                "Admitted hits that could not be written before shutdown gave up.",
            ),
            compensation_failures: counter(
                "quotad_strict_compensation_failures_total",
                "Strict-mode denials whose compensating decrement failed (the count errs high).",
            ),
            memory_cap_checks: counter_vec(
                "quotad_memory_cap_checks_total",
                "Checks decided through the store, without a counter in memory, because a memory \
                 cap was reached (cap = counters | tenant_clients).",
                &["cap"],
            ),
            last_units_checks: counter(
                "quotad_last_units_checks_total",
                "Checks of cached policies decided through the store because this instance's \
                 share of the headroom could not hold them while the window had room (the last \
                 units of a limit, in a fleet).",
            ),
            unread_first_checks: counter(
                "quotad_unread_first_checks_total",
                "First checks of a counter decided before its first read, within its unread \
                 budget (a limit too large for them to matter): the next sync round reads it.",
            ),
            clock_offset: Gauge::new(
                "quotad_clock_offset_seconds",
                "How far the store's clock, on which buckets are cut, is ahead of this host's \
                 wall clock (negative: behind); 0 on the embedded store and until it is read.",
            )
            .expect("valid metric"),
            clock_uncertainty: Gauge::new(
                "quotad_clock_offset_uncertainty_seconds",
                "How uncertain quotad_clock_offset_seconds is: half the round trip of the best \
                 reading and the drift since; NaN until the store's clock is read, 0 on the \
                 embedded store.",
            )
            .expect("valid metric"),
            unrecorded_hits: counter(
                "quotad_unrecorded_hits_total",
                "Hits admitted (on_store_failure = allow) that could be neither written to the \
                 failing store nor held in memory (at a memory cap); each is also logged.",
            ),
            unrecorded_history: counter(
                "quotad_history_unrecorded_checks_total",
                "Checks whose answers may be missing from the usage history: a history write \
                 with an unknown outcome (never resent), no room for one more row in memory, or \
                 a shutdown that gave up; each is also logged.",
            ),
            unrecorded_audit: counter(
                "quotad_audit_unrecorded_total",
                "Changes made but not appended to the audit log (the store failed after the \
                 change); each is logged in full at error level.",
            ),
            token_hash_runs: counter_vec(
                "quotad_token_hash_runs_total",
                "argon2 runs of a bearer token against a salted auth.tokens entry, by outcome \
                 (verified, refused): each token costs at most one per process, in a pool of \
                 one thread; refused ones are someone trying tokens.",
                &["outcome"],
            ),
            fleet: FleetMetrics::new(&registry),
            doubts: DoubtMetrics::new(&registry),
            holds: HoldMetrics::new(&registry),
            tls_expiry: gauge(
                "quotad_tls_cert_expiry_seconds",
                "Not-after of the certificate served on quotad's ports (server.tls), unix seconds.",
            ),
            tls_reloads: counter_vec(
                "quotad_tls_reloads_total",
                "Changes of the TLS files: served (ok), or refused and the current certificate \
                 kept (error: unreadable, unparsable or a key of another certificate).",
                &["outcome"],
            ),
            registry,
        };
        // Both caps, and each store-failure rule, are exported from the start, at zero, so an
        // alert (deploy/prometheus/alerts.yml) and the dashboard can watch them.
        for cap in ["counters", "tenant_clients"] {
            m.memory_cap_checks.with_label_values(&[cap]);
        }
        for outcome in ["verified", "refused"] {
            m.token_hash_runs.with_label_values(&[outcome]);
        }
        for rule in ["local", "allow", "deny"] {
            for consistency in ["cached", "strict"] {
                m.store_failure_decisions
                    .with_label_values(&[rule, consistency]);
            }
        }
        m.register();
        m
    }

    /// Registers every metric.
    fn register(&self) {
        let mut all: Vec<Box<dyn Collector>> = vec![
            Box::new(self.checks.clone()),
            Box::new(self.check_duration.clone()),
            Box::new(self.store_ops.clone()),
            Box::new(self.store_duration.clone()),
            Box::new(self.sync_pending.clone()),
            Box::new(self.read_backlog.clone()),
            Box::new(self.active_counters.clone()),
            Box::new(self.store_failure_decisions.clone()),
            Box::new(self.uncertain_hits.clone()),
            Box::new(self.store_degraded.clone()),
            Box::new(self.deferred_hits.clone()),
            Box::new(self.unsynced_hits_at_exit.clone()),
            Box::new(self.compensation_failures.clone()),
            Box::new(self.memory_cap_checks.clone()),
            Box::new(self.last_units_checks.clone()),
            Box::new(self.unread_first_checks.clone()),
            Box::new(self.clock_offset.clone()),
            Box::new(self.clock_uncertainty.clone()),
            Box::new(self.unrecorded_hits.clone()),
            Box::new(self.unrecorded_history.clone()),
            Box::new(self.unrecorded_audit.clone()),
            Box::new(self.token_hash_runs.clone()),
        ];
        if let Some(t) = &self.tenant_checks {
            all.push(Box::new(t.clone()));
        }
        for c in all {
            self.registry.register(c).expect("unique metric");
        }
    }

    /// TLS is on, with a certificate expiring at `not_after` (unix seconds).
    pub fn tls_on(&self, not_after: i64) {
        self.tls_expiry.set(not_after);
        for outcome in ["ok", "error"] {
            self.tls_reloads.with_label_values(&[outcome]);
        }
        for c in [
            Box::new(self.tls_expiry.clone()) as Box<dyn Collector>,
            Box::new(self.tls_reloads.clone()),
        ] {
            // Twice (a second application on these metrics) is no harm: one series each.
            let _ = self.registry.register(c);
        }
    }

    /// A changed certificate is served from now on.
    pub fn tls_reloaded(&self, not_after: i64) {
        self.tls_expiry.set(not_after);
        self.tls_reloads.with_label_values(&["ok"]).inc();
    }

    /// Changed TLS files could not be served; the current certificate stays.
    pub fn tls_reload_refused(&self) {
        self.tls_reloads.with_label_values(&["error"]).inc();
    }

    /// Fleet membership: N, this instance's shard, its regions, lease trouble.
    pub fn fleet(&self) -> &FleetMetrics {
        &self.fleet
    }

    /// Sync writes of unknown outcome and how they were settled.
    pub fn doubts(&self) -> &DoubtMetrics {
        &self.doubts
    }

    /// Check metrics for the items of one batch, added to the shared ones once, when it is
    /// dropped: a batch's checks do not each write the atomics that every worker shares.
    pub fn batch_checks(&self) -> BatchChecks<'_> {
        BatchChecks {
            metrics: self,
            decided: [0; 4],
            duration: self.check_duration.mine().local(),
        }
    }

    pub fn check_decided(&self, tenant: &str, decision: DecisionLabel, seconds: f64) {
        self.decided.mine()[decision as usize].inc();
        if let Some(t) = &self.tenant_checks {
            t.with_label_values(&[tenant, decision.as_str()]).inc();
        }
        self.check_duration.mine().observe(seconds);
    }

    pub fn store_op(&self, op: &str, outcome: &str, seconds: f64) {
        // The duration first: a scrape that sees an operation counted sees its duration too
        // (the first of an `op` creates both series).
        self.store_duration
            .with_label_values(&[op])
            .observe(seconds);
        self.store_ops.with_label_values(&[op, outcome]).inc();
    }

    pub fn set_pending(&self, hits: u64) {
        self.sync_pending.set(hits.min(i64::MAX as u64) as i64);
    }

    pub fn set_read_backlog(&self, counters: usize) {
        self.read_backlog
            .set(counters.min(i64::MAX as usize) as i64);
    }

    pub fn set_active_counters(&self, n: usize) {
        self.active_counters.set(n as i64);
    }

    pub fn store_failure_decision(&self, rule: &str, consistency: &str) {
        self.store_failure_decisions
            .with_label_values(&[rule, consistency])
            .inc();
    }

    /// Whether the last sync round's writes were refused or left in doubt, in part or whole
    /// (`/readyz` says so).
    pub fn set_store_degraded(&self, degraded: bool) {
        self.store_degraded.set(i64::from(degraded));
    }

    pub fn store_degraded(&self) -> bool {
        self.store_degraded.get() != 0
    }

    pub fn uncertain_hits(&self, hits: u64) {
        self.uncertain_hits.inc_by(hits);
    }

    /// Hits counted by [`Metrics::uncertain_hits`] since start.
    pub fn uncertain_hits_seen(&self) -> u64 {
        self.uncertain_hits.get()
    }

    /// A round's writes outlasted `sync.timeout`: these hits wait for the next round.
    pub fn deferred_hits(&self, hits: u64) {
        self.deferred_hits.inc_by(hits);
    }

    pub fn unsynced_at_exit(&self, hits: u64) {
        self.unsynced_hits_at_exit.set(hits as i64);
    }

    /// The metrics of holds (reservations).
    pub fn holds(&self) -> &HoldMetrics {
        &self.holds
    }

    pub fn compensation_failed(&self) {
        self.compensation_failures.inc();
    }

    pub fn memory_cap_check(&self, cap: &str) {
        self.memory_cap_checks.with_label_values(&[cap]).inc();
    }

    /// A cached check decided through the store at the last units of a limit.
    pub fn last_units_check(&self) {
        self.last_units_checks.inc();
    }

    /// What the fleet's clock knows of this host's (`tasks::clock`).
    pub fn clock(&self, state: crate::clock::ClockState) {
        use crate::clock::ClockState;
        let (offset, uncertainty) = match state {
            ClockState::Alone => (0.0, 0.0),
            ClockState::Unknown => (0.0, f64::NAN),
            ClockState::Measured {
                offset_ms,
                uncertainty_ms,
            } => (offset_ms as f64 / 1e3, uncertainty_ms as f64 / 1e3),
        };
        self.clock_offset.set(offset);
        self.clock_uncertainty.set(uncertainty);
    }

    /// A first check admitted before its counters' read (`limiter::first`).
    pub fn unread_first_check(&self) {
        self.unread_first_checks.inc();
    }

    pub fn unrecorded_hits(&self, hits: u64) {
        self.unrecorded_hits.inc_by(hits);
    }

    /// Checks whose answers may be missing from the usage history (a write with an unknown
    /// outcome, the row cap, or a shutdown that gave up).
    pub fn unrecorded_history(&self, checks: u64) {
        self.unrecorded_history.inc_by(checks);
    }

    /// A change that the audit log could not take.
    pub fn unrecorded_audit(&self) {
        self.unrecorded_audit.inc();
    }

    /// A bearer token was run through argon2: `verified` or not.
    pub fn token_hash_run(&self, verified: bool) {
        let outcome = if verified { "verified" } else { "refused" };
        self.token_hash_runs.with_label_values(&[outcome]).inc();
    }

    /// The argon2 runs of bearer tokens so far, verified and refused.
    pub fn token_hash_runs(&self) -> (u64, u64) {
        let n = |o: &str| self.token_hash_runs.with_label_values(&[o]).get();
        (n("verified"), n("refused"))
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).unwrap_or_default()
    }
}
