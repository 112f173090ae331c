//! The store: durable counters, policies, leases, usage history and the audit log.
//!
//! Seven narrow traits: [`CounterStore`] (the limiter and the sync task: increments, reads,
//! expiry), [`PolicyStore`] (the admin API and the policy cache), [`lease::LeaseStore`]
//! (fleet membership), [`history::HistoryStore`] (usage by hour and day),
//! [`audit::AuditStore`] (the log of changes), [`idempotency::IdempotencyStore`]
//! (`Idempotency-Key` answers) and [`hold::HoldStore`] (reservations). [`Store`] is all
//! seven, and is what a backend implements; the
//! backends live in the server crate: `embedded` (redb, one process) and `scylla`
//! (Cassandra/ScyllaDB counter tables, many instances). Both run the same contract suite
//! (`tests/store_contract/`). `kind` and `ping` are on [`CounterStore`]: readiness means
//! "counters answer", and the counters are the hot path.
//!
//! Counter writes are increments, never sets: Cassandra counters cannot be set, and increments
//! from many instances add up without coordination. Increments are not idempotent, so callers
//! never retry one that may have landed: [`StoreError::Uncertain`] says so.

pub mod audit;
pub mod history;
pub mod hold;
pub mod idempotency;
pub mod lease;

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::domain::{ClientId, Grain, TenantId};

/// Which counter: (tenant, subject, limit id, grain). Buckets of it are keyed by start time.
///
/// `subject` is a client id, or [`crate::domain::TENANT_SUBJECT`] for tenant-scoped limits. The
/// grain is part of the identity, so changing a limit's window to one with another bucket width
/// starts a fresh count, while changing its `max` keeps what was consumed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey {
    pub tenant: Arc<str>,
    pub subject: Arc<str>,
    pub limit: Arc<str>,
    pub grain: Grain,
}

impl CounterKey {
    /// Counters of the same (tenant, subject): one entry of the limiter's memory. (`Arc`'s
    /// equality compares the pointers before the strings, so the keys of one round, which share
    /// their strings, are told together without reading them.)
    pub fn same_subject(&self, o: &Self) -> bool {
        self.subject == o.subject && self.tenant == o.tenant
    }
}

/// An increment of one bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delta {
    pub key: CounterKey,
    pub start: i64,
    /// Usually positive; negative only to compensate a strict-mode increment that was denied.
    pub delta: i64,
}

/// A read of a counter's buckets that start in `[from, to]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterRange {
    pub key: CounterKey,
    pub from: i64,
    pub to: i64,
}

/// One bucket as read from the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketTotal {
    pub start: i64,
    /// The sum over all instances.
    pub total: i64,
    /// The part this instance wrote (its own shard); equal to `total` on the embedded store.
    pub mine: i64,
    /// The part this instance's region wrote (the shards of its slot, `lease`); equal to
    /// `total` where there is one region.
    pub region: i64,
}

impl BucketTotal {
    /// A bucket nobody counted in.
    pub fn empty(start: i64) -> Self {
        BucketTotal {
            start,
            total: 0,
            mine: 0,
            region: 0,
        }
    }

    /// A bucket of one region with one writer: every part is `total`.
    pub fn alone(start: i64, total: i64) -> Self {
        BucketTotal {
            start,
            total,
            mine: total,
            region: total,
        }
    }
}

/// Where a policy belongs: a tenant, or one client's override of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyKey {
    pub tenant: TenantId,
    pub client: Option<ClientId>,
}

/// A stored policy document with its bookkeeping.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyRecord {
    pub key: PolicyKey,
    /// The canonical JSON document (`domain::PolicyDoc`).
    pub body: String,
    /// 1 on create, +1 on each replace.
    pub version: u64,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or refused for now; nothing was written. Safe to retry.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The call ran out of time or was cut off after it was sent: a write may or may not have
    /// landed. Never resend a counter increment after this.
    #[error("store outcome uncertain: {0}")]
    Uncertain(String),
    /// Anything else: corrupt data, a bug, a schema mismatch. Not retried.
    #[error("store error: {0}")]
    Internal(String),
}

impl StoreError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Uncertain(_))
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// What became of the increments of one call that a store sends in several requests
/// ([`CounterStore::increment_parts`]), by their place in the call's slice. An increment in
/// neither list landed.
#[derive(Debug, Default)]
pub struct Increments {
    /// Never sent (no connection, refused before it ran): safe to send again.
    pub unsent: Vec<usize>,
    /// Sent, with an outcome nobody knows: it may have landed, and is never resent.
    pub doubtful: Vec<usize>,
    /// The first error of the requests that failed; None when every increment landed.
    pub error: Option<StoreError>,
}

impl Increments {
    /// The parts of a call that the store answered as a whole (`n` increments).
    pub fn whole(result: StoreResult<()>, n: usize) -> Self {
        match result {
            Ok(()) => Increments::default(),
            Err(e @ StoreError::Uncertain(_)) => Increments {
                doubtful: (0..n).collect(),
                error: Some(e),
                ..Increments::default()
            },
            Err(e) => Increments {
                unsent: (0..n).collect(),
                error: Some(e),
                ..Increments::default()
            },
        }
    }

    /// The call's outcome as one result, for a caller that cannot resend a part: once any
    /// part landed or is in doubt, resending the rest could count twice, so a failure is then
    /// `Uncertain` whatever the parts' errors were.
    pub fn into_result(self, n: usize) -> StoreResult<()> {
        let Some(e) = self.error else {
            return Ok(());
        };
        let failed = self.unsent.len() + self.doubtful.len();
        if self.doubtful.is_empty() && failed >= n {
            return Err(e);
        }
        Err(StoreError::Uncertain(format!(
            "{} of {n} increments landed, {} in doubt, {} not sent: {e}",
            n.saturating_sub(failed),
            self.doubtful.len(),
            self.unsent.len()
        )))
    }
}

/// The replicas a read that settles writes in doubt hears ([`CounterStore::read_final`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// Every replica (Cassandra's `ALL`): sees every write any replica took.
    Every,
    /// A quorum of the local data centre's replicas (`LOCAL_QUORUM`), taken only when a read
    /// of [`Heard::Every`] failed: with one replica of three down, that is every live one,
    /// which between them hold every write the live replicas led. A write the lost replica led
    /// and had not passed on is not seen, and comes back with it.
    LiveQuorum,
}

/// What a read of many ranges got ([`CounterStore::read_parts`]): each range's buckets, or
/// None where the part of the read that serves it failed.
#[derive(Debug, Default)]
pub struct Reads {
    pub totals: Vec<Option<Vec<BucketTotal>>>,
    /// The first error of the requests that failed; None when every range was read.
    pub error: Option<StoreError>,
}

impl Reads {
    /// The read of `n` ranges that the store answered as a whole.
    pub fn whole(result: StoreResult<Vec<Vec<BucketTotal>>>, n: usize) -> Self {
        match result {
            Ok(t) => Reads {
                totals: t.into_iter().map(Some).collect(),
                error: None,
            },
            Err(e) => Reads {
                totals: (0..n).map(|_| None).collect(),
                error: Some(e),
            },
        }
    }

    /// Every range's buckets, or the first error when any range went unread.
    pub fn into_result(self) -> StoreResult<Vec<Vec<BucketTotal>>> {
        let error = self.error;
        let all: Option<Vec<Vec<BucketTotal>>> = self.totals.into_iter().collect();
        match (all, error) {
            (Some(all), _) => Ok(all),
            (None, Some(e)) => Err(e),
            (None, None) => Err(StoreError::Unavailable("a part of the read failed".into())),
        }
    }
}

/// Durable counters: what the limiter and the sync task need.
#[async_trait]
pub trait CounterStore: Send + Sync + 'static {
    /// A short name for logs and metrics (`embedded`, `scylla`).
    fn kind(&self) -> &'static str;

    /// Applies the increments. On error, none or some may have landed (see [`StoreError`]).
    /// A bucket is kept at least [`Grain::retention_ms`] past its start; a store may drop it
    /// as soon as a later increment of its counter is for a bucket that starts that much later
    /// (increments are for buckets the clock has reached).
    async fn increment(&self, deltas: &[Delta]) -> StoreResult<()>;

    /// [`CounterStore::increment`], telling apart the increments that were never sent from
    /// those in doubt, for a store that sends a call in several requests that can fail apart
    /// (a cluster with a node down). A request not answered by `deadline` is given up on,
    /// its increments in doubt, while the others keep what they got: one node that stopped
    /// answering does not hold up a whole call. The default answers for the call as a whole.
    async fn increment_parts(&self, deltas: &[Delta], deadline: Option<Instant>) -> Increments {
        let _ = deadline;
        Increments::whole(self.increment(deltas).await, deltas.len())
    }

    /// Reads the buckets of each range; one vector per range, in order, sorted by start,
    /// holding only buckets that exist.
    async fn read(&self, ranges: &[CounterRange]) -> StoreResult<Vec<Vec<BucketTotal>>>;

    /// [`CounterStore::read`], keeping what was read when a part of it fails, or is not
    /// answered by `deadline`. The default answers for the read as a whole.
    async fn read_parts(&self, ranges: &[CounterRange], deadline: Option<Instant>) -> Reads {
        let _ = deadline;
        Reads::whole(self.read(ranges).await, ranges.len())
    }

    /// [`CounterStore::read_parts`] at a consistency that sees every write the replicas
    /// `heard` took, to settle increments of unknown outcome: once no write of them can still
    /// apply, this instance's own part (`mine`) of each bucket says whether they landed.
    /// [`Heard::Every`] fails, rather than answer from fewer replicas, while one is down. The
    /// default is [`CounterStore::read_parts`] (a store of one copy, whose reads see every
    /// write).
    async fn read_final(
        &self,
        ranges: &[CounterRange],
        deadline: Option<Instant>,
        heard: Heard,
    ) -> Reads {
        let _ = heard;
        self.read_parts(ranges, deadline).await
    }

    /// Increments, then reads back the ranges, as one step where the store can (strict mode).
    /// The default is `increment` followed by `read`.
    async fn increment_and_read(
        &self,
        deltas: &[Delta],
        ranges: &[CounterRange],
    ) -> StoreResult<Vec<Vec<BucketTotal>>> {
        self.increment(deltas).await?;
        // The increments landed: a read that fails now must not say "nothing written", or
        // the caller would write again what the store has counted.
        self.read(ranges).await.map_err(|e| match e {
            StoreError::Unavailable(m) => {
                StoreError::Uncertain(format!("counted, but the read back failed: {m}"))
            }
            e => e,
        })
    }

    /// Deletes buckets no window can need any more at `now_ms` (see
    /// [`Grain::retention_ms`]), about `budget` of them (a store may finish the row or
    /// partition it is in); returns how many went, counted in the store's unit (buckets on the
    /// embedded store, partitions on scylla). Less than `budget` says the call found no more
    /// to do for now.
    async fn delete_expired(&self, now_ms: i64, budget: usize) -> StoreResult<u64>;

    /// Succeeds while the store answers (`/readyz`).
    async fn ping(&self) -> StoreResult<()>;

    /// The store's own clock (ms since the epoch), which every instance of a fleet reads alike
    /// ([`crate::clock::FleetClock`]); None where no other process shares the counts (the
    /// embedded store), whose clock is then the only one.
    async fn clock_ms(&self) -> StoreResult<Option<i64>> {
        Ok(None)
    }

    /// Makes everything written so far durable before shutdown.
    async fn flush(&self) -> StoreResult<()> {
        Ok(())
    }
}

/// Stored policies: what the admin API and the policy cache need.
#[async_trait]
pub trait PolicyStore: Send + Sync + 'static {
    /// Creates or replaces a policy; returns the record written (version bumped).
    async fn put_policy(
        &self,
        key: &PolicyKey,
        body: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<PolicyRecord>;

    async fn get_policy(&self, key: &PolicyKey) -> StoreResult<Option<PolicyRecord>>;

    /// Deletes a policy; returns whether it existed. Deleting a tenant's policy leaves its
    /// client overrides in place (they apply again if the tenant's policy comes back).
    async fn delete_policy(&self, key: &PolicyKey) -> StoreResult<bool>;

    /// Tenant policies (no overrides) with tenant > `after`, by tenant, at most `limit`.
    async fn list_policies(
        &self,
        after: Option<&TenantId>,
        limit: usize,
    ) -> StoreResult<Vec<PolicyRecord>>;

    /// The client overrides of `tenant` with client > `after`, by client, at most `limit`.
    async fn list_overrides(
        &self,
        tenant: &TenantId,
        after: Option<&ClientId>,
        limit: usize,
    ) -> StoreResult<Vec<PolicyRecord>>;

    /// Every policy and override, for the policy cache.
    async fn load_policies(&self) -> StoreResult<Vec<PolicyRecord>>;

    /// A number that changes whenever any policy changes, so instances can poll cheaply.
    async fn policies_generation(&self) -> StoreResult<u64>;
}

/// A whole backend: counters, policies, leases, usage history, the audit log, idempotency
/// keys and holds. Implemented by every type that implements the seven.
pub trait Store:
    CounterStore
    + PolicyStore
    + lease::LeaseStore
    + history::HistoryStore
    + audit::AuditStore
    + idempotency::IdempotencyStore
    + hold::HoldStore
{
}

impl<T> Store for T where
    T: CounterStore
        + PolicyStore
        + lease::LeaseStore
        + history::HistoryStore
        + audit::AuditStore
        + idempotency::IdempotencyStore
        + hold::HoldStore
{
}

/// The handle everyone shares.
pub type DynStore = Arc<dyn Store>;
/// The counter half of a [`DynStore`] (`Arc<dyn Store>` upcasts to it).
pub type DynCounterStore = Arc<dyn CounterStore>;
/// The policy half of a [`DynStore`].
pub type DynPolicyStore = Arc<dyn PolicyStore>;
/// The usage history of a [`DynStore`].
pub type DynHistoryStore = Arc<dyn history::HistoryStore>;

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> StoreError {
        StoreError::Unavailable("no connection".into())
    }

    #[test]
    fn a_call_with_parts_landed_or_in_doubt_fails_as_uncertain_for_a_caller_that_cannot_resend() {
        assert!(Increments::whole(Ok(()), 3).into_result(3).is_ok());
        let none_sent = Increments::whole(Err(unavailable()), 3);
        assert_eq!(none_sent.unsent, [0, 1, 2]);
        assert!(matches!(
            none_sent.into_result(3),
            Err(StoreError::Unavailable(_))
        ));
        let some_sent = Increments {
            unsent: vec![1],
            doubtful: vec![],
            error: Some(unavailable()),
        };
        assert!(matches!(
            some_sent.into_result(3),
            Err(StoreError::Uncertain(_))
        ));
        let in_doubt = Increments::whole(Err(StoreError::Uncertain("timed out".into())), 2);
        assert_eq!(in_doubt.doubtful, [0, 1]);
        assert!(matches!(
            in_doubt.into_result(2),
            Err(StoreError::Uncertain(_))
        ));
    }

    #[test]
    fn a_read_with_a_part_unread_is_an_error_as_a_whole() {
        let t = vec![BucketTotal::alone(0, 4)];
        let read = Reads {
            totals: vec![Some(t.clone()), None],
            error: Some(unavailable()),
        };
        assert!(matches!(
            read.into_result(),
            Err(StoreError::Unavailable(_))
        ));
        let all = Reads::whole(Ok(vec![t.clone(), vec![]]), 2);
        assert_eq!(all.into_result().unwrap(), vec![t, vec![]]);
    }
}
