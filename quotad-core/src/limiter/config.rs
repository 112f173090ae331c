//! The limiter's tuning, and a check as the limiter sees it.

use std::sync::Arc;
use std::time::Duration;

use super::membership::Membership;
use crate::domain::{ClientId, TenantId};

/// Tuning of the in-memory state.
#[derive(Clone, Debug)]
pub struct LimiterConfig {
    /// Number of lock shards; more shards, less contention.
    pub shards: usize,
    /// An entry untouched this long, with nothing pending, leaves memory (re-read on next use).
    pub idle_ms: i64,
    /// Deadline of a store call made on the check path (first touch, strict mode).
    pub store_timeout: Duration,
    /// The fleet: how many instances share the store now (N in the shares), and whether this
    /// one holds its shard lease. Alone unless the fleet task says otherwise.
    pub fleet: Arc<Membership>,
    /// The sync interval: how long a denial for an exhausted share lasts at most.
    pub sync_interval_ms: i64,
    /// The longest a counter's admitted hits wait in memory before they are written, when
    /// nothing presses for sooner (`sync.max_delay_ms`): what a crash can lose.
    pub max_sync_delay_ms: i64,
    /// Most counters (key x limit) held in memory. A check that needs one more is decided
    /// through the store instead (as in strict mode), holding nothing.
    pub max_counters: usize,
    /// Most distinct clients of one tenant held in memory; the same applies beyond it.
    pub max_clients_per_tenant: usize,
    /// Most (tenant, client, hour) rows of usage history waiting for the sync task; 0 records
    /// no history at all.
    pub max_history_rows: usize,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        Self {
            shards: 64,
            idle_ms: 60_000,
            store_timeout: Duration::from_millis(50),
            fleet: Arc::new(Membership::alone()),
            sync_interval_ms: 250,
            max_sync_delay_ms: 250,
            max_counters: 1_000_000,
            max_clients_per_tenant: 100_000,
            max_history_rows: 1_000_000,
        }
    }
}

/// A check as the limiter sees it.
#[derive(Clone, Copy, Debug)]
pub struct CheckInput<'a> {
    pub tenant: &'a TenantId,
    pub client: &'a ClientId,
    pub resource: Option<&'a str>,
    pub cost: u64,
    /// The check takes a hold (a reservation): in-flight limits apply to it.
    pub reserve: bool,
}
