//! Usage history: what each client of a tenant was answered, by hour and by day, kept far beyond
//! any window (`history.retention`), for billing, disputes and audits.
//!
//! The sync task adds one [`UsageDelta`] per (tenant, client, hour) that saw checks since its
//! last round, in the same rounds that write the counters: no store call per check. A store
//! adds each delta to four points (the client's hour and day, the tenant's hour and day; the
//! embedded store keeps the client's hours only and sums its days when read) and notes the
//! client in the day's index of clients seen, which answers "top clients" without reading every
//! client's history.
//!
//! These are increments, like the counters: not idempotent, never resent after an uncertain
//! outcome (see [`super::StoreError::Uncertain`]).

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreResult;

pub const HOUR_MS: i64 = 3_600_000;
pub const DAY_MS: i64 = 86_400_000;

/// The width of a history point: a UTC hour or a UTC day.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    Hour,
    Day,
}

impl Step {
    pub fn ms(self) -> i64 {
        match self {
            Step::Hour => HOUR_MS,
            Step::Day => DAY_MS,
        }
    }

    /// The start of the point holding `t` (ms).
    pub fn floor(self, t: i64) -> i64 {
        t - t.rem_euclid(self.ms())
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Step::Hour => "hour",
            Step::Day => "day",
        }
    }
}

/// What checks were answered over some span: the figures of one point.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Checks answered "allowed" (200, batch items included).
    pub admitted: u64,
    /// The cost those checks took.
    pub cost: u64,
    /// Checks answered "denied" (429, batch items included).
    pub denied: u64,
    /// Denials by the id of the limit that bound them; they add up to `denied`.
    pub denied_by: BTreeMap<String, u64>,
}

impl Counts {
    pub fn is_empty(&self) -> bool {
        self.admitted == 0 && self.cost == 0 && self.denied == 0
    }

    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &Counts) {
        self.admitted += other.admitted;
        self.cost += other.cost;
        self.denied += other.denied;
        for (k, v) in &other.denied_by {
            *self.denied_by.entry(k.clone()).or_default() += v;
        }
    }
}

/// [`Counts`] from its figures, for the stores' unit tests.
#[cfg(any(test, feature = "test-support"))]
pub fn counts(admitted: u64, cost: u64, denied: u64, by: &[(&str, u64)]) -> Counts {
    Counts {
        admitted,
        cost,
        denied,
        denied_by: by.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

/// What one client of a tenant was answered in one UTC hour, as increments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageDelta {
    pub tenant: String,
    pub client: String,
    /// The hour's start, ms since the epoch (a multiple of [`HOUR_MS`]).
    pub hour: i64,
    pub counts: Counts,
    /// Cost given back in this hour: reservations taken in it that settled below their
    /// estimate or were released. A store takes it from the point's `cost` (and from the
    /// tenant's, and the client's line in the index), so that history counts settled cost;
    /// a point whose cost would go below 0 (its estimate's increment was lost) reads as 0.
    pub cost_returned: u64,
}

impl UsageDelta {
    /// The change to a point's cost: `counts.cost` less `cost_returned`.
    pub fn net_cost(&self) -> i64 {
        let net = i128::from(self.counts.cost) - i128::from(self.cost_returned);
        net.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }
}

/// One point of a history as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsagePoint {
    /// The hour's or day's start, ms.
    pub start: i64,
    pub counts: Counts,
}

/// A client's totals over some days, from the index of clients seen (`top`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientTotal {
    pub client: String,
    pub admitted: u64,
    pub cost: u64,
    pub denied: u64,
}

/// Usage history in the store.
#[async_trait]
pub trait HistoryStore: Send + Sync + 'static {
    /// Adds each delta to its client's hour and day, to its tenant's hour and day, and to the
    /// client's line in the day's index of clients seen. Deltas of the same (tenant, client,
    /// hour) in one call add up. On error, none or some may have landed.
    async fn add_usage(&self, deltas: &[UsageDelta]) -> StoreResult<()>;

    /// The points of one client (or, `client` None, the tenant's totals) at `step` whose start
    /// is in `[from, to)`, sorted by start, holding only points that exist.
    async fn usage_points(
        &self,
        tenant: &str,
        client: Option<&str>,
        step: Step,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<UsagePoint>>;

    /// The clients seen on the UTC days that start in `[from, to)`, each with its totals over
    /// those days, in no particular order.
    async fn clients_seen(&self, tenant: &str, from: i64, to: i64)
        -> StoreResult<Vec<ClientTotal>>;

    /// Deletes history (points and index) of the periods that ended at or before `before`
    /// (ms): whole days on the embedded store, whole months (a partition each) on the scylla
    /// store. At most about `budget` deletions; returns how many were made.
    async fn delete_history_before(&self, before: i64, budget: usize) -> StoreResult<u64>;
}
