//! Fleet membership in the store: one lease per write shard.
//!
//! Every counter cell carries the shard of the instance that increments it, so no two
//! instances increment the same cell and each one can see its own part of a count (the demand
//! that weights its share). Which shard is whose is not configured: at start an instance claims
//! a free shard under a lease with a time to live, renews it on a heartbeat well inside that
//! time, and gives it back after its drain at SIGTERM. An instance that is killed stops renewing
//! and its lease expires. The live leases are the fleet: their number is N in the share formula.
//!
//! Reads sum every shard that was ever claimed, live or not ([`Roster::used`]), so a dead
//! instance's hits count until their buckets leave the window; claims take the lowest free shard,
//! so that set stays as small as the largest fleet that ever ran.
//!
//! Two instances can still write one shard for a while: one that paused past its lease's end
//! while another claimed the shard. Counter increments commute, so counts stay exact; what
//! suffers is the split of demand between the two (each sees the other's hits as its own), so
//! both take a larger share than they should until the paused one renews, finds the lease
//! gone and claims another ([`LeaseEvent::Lost`]).

use std::time::Duration;

use async_trait::async_trait;

use super::StoreResult;

/// The shard space of one region: its shards are `slot x MAX_SHARDS` and the `MAX_SHARDS - 1`
/// after it (a fleet in one region writes `0..MAX_SHARDS`). A read sums the used ones, so the
/// bound keeps a read's cost bounded too.
pub const MAX_SHARDS: i16 = 256;

/// Most regions one keyspace serves: their shard ranges fill the `smallint` of a shard.
pub const MAX_REGIONS: i16 = 128;

/// The region (slot) a shard belongs to.
#[inline]
pub fn slot_of(shard: i16) -> i16 {
    shard.div_euclid(MAX_SHARDS)
}

/// One region's last heartbeat, as this region's replicas hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionBeat {
    pub region: String,
    pub slot: i16,
    /// When it was written, Unix ms (the writer's clock).
    pub at_ms: i64,
}

/// What a claim came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The owner holds this shard now.
    Held(i16),
    /// The pinned shard is held by another live instance.
    Taken { shard: i16, owner: String },
    /// Every shard below [`MAX_SHARDS`] is held.
    Full,
}

/// One live lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub shard: i16,
    pub owner: String,
    /// Before when (Unix ms, the writer's fleet clock) every hit it admitted was acknowledged
    /// by the store, as it last reported ([`LeaseStore::report_written`]); `None` before its
    /// first report.
    pub written_ms: Option<i64>,
}

impl Member {
    /// A lease with no report of its writes yet.
    pub fn new(shard: i16, owner: impl Into<String>) -> Self {
        Member {
            shard,
            owner: owner.into(),
            written_ms: None,
        }
    }
}

/// The fleet as the store sees it now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roster {
    /// The live leases, by shard.
    pub members: Vec<Member>,
    /// Every shard ever claimed, by shard: what a read sums.
    pub used: Vec<i16>,
}

/// Leases on write shards. Both stores implement it; the store contract suite tests it.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Claims `pin` (a shard of this region's range, counted from its start) if given, else
    /// `prefer` if it is free, else the lowest free shard of the region's range, for `ttl`;
    /// records the shard as used. The range is slot 0's until [`LeaseStore::join_region`].
    async fn claim(
        &self,
        owner: &str,
        pin: Option<i16>,
        prefer: Option<i16>,
        ttl: Duration,
    ) -> StoreResult<Claim>;

    /// Extends `owner`'s lease on `shard` by `ttl` from now. `Ok(false)`: the owner does not
    /// hold it any more (it expired, and perhaps another instance holds it now).
    async fn renew(&self, shard: i16, owner: &str, ttl: Duration) -> StoreResult<bool>;

    /// Records, for `ttl` (the lease's), that every hit `owner` admitted before `written_ms`
    /// (Unix ms) was acknowledged by the store: the roster shows it in `owner`'s
    /// [`Member::written_ms`]. An instance whose report stays old has writes failing or
    /// unanswered; the others take no bucket after it as complete (`limiter::share`).
    async fn report_written(
        &self,
        shard: i16,
        owner: &str,
        written_ms: i64,
        ttl: Duration,
    ) -> StoreResult<()>;

    /// Gives the lease back; `Ok(false)` if `owner` did not hold it.
    async fn release(&self, shard: i16, owner: &str) -> StoreResult<bool>;

    /// The live leases and the used shards.
    async fn roster(&self) -> StoreResult<Roster>;

    /// Tells the store which shard this instance writes now (`None`: it holds no lease, so
    /// increments must fail as unavailable and stay pending) and which shards a read sums.
    fn adopt(&self, write: Option<i16>, read: &[i16]);

    /// The region (data centre) this store's session is local to: the configured one, else the
    /// data centre of its contact points. `None`: the store has no regions (embedded).
    async fn local_region(&self) -> StoreResult<Option<String>> {
        Ok(None)
    }

    /// Finds `region`'s slot, claiming the lowest free one the first time any instance of it
    /// starts, and makes claims and reads use it.
    async fn join_region(&self, _region: &str) -> StoreResult<i16> {
        Ok(0)
    }

    /// Writes this region's heartbeat (`at_ms`), which the store replicates to the others.
    async fn beat(&self, _at_ms: i64) -> StoreResult<()> {
        Ok(())
    }

    /// Every region's last heartbeat as this region's replicas hold it, this one's included.
    async fn regions(&self) -> StoreResult<Vec<RegionBeat>> {
        Ok(Vec::new())
    }

    /// The heartbeats `region` wrote in `[from, to)` (Unix ms) that this region's replicas
    /// hold, in order (every heartbeat is kept a day).
    async fn beats_between(&self, _region: &str, _from: i64, _to: i64) -> StoreResult<Vec<i64>> {
        Ok(Vec::new())
    }
}

/// The shard a claim should try first, in region `slot`'s range: the pin (counted from the
/// range's start), else the preferred one if free and in the range, else the lowest shard of
/// the range not held. `None`: every shard of the range is held.
pub fn pick_shard(held: &[i16], slot: i16, pin: Option<i16>, prefer: Option<i16>) -> Option<i16> {
    let base = slot * MAX_SHARDS;
    if let Some(p) = pin {
        return Some(base + p);
    }
    let free = |s: &i16| !held.contains(s);
    prefer
        .filter(|s| slot_of(*s) == slot)
        .filter(free)
        .or_else(|| (0..MAX_SHARDS).map(|i| base + i).find(|s| free(s)))
}

/// A lease's time to live in whole seconds, as CQL's `USING TTL` takes it: rounded up, so a
/// lease never ends before the caller thinks.
pub fn ttl_secs(ttl: Duration) -> i32 {
    ttl.as_millis().div_ceil(1000).clamp(1, i32::MAX as u128) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_takes_the_pin_then_the_preferred_free_shard_then_the_lowest_free() {
        assert_eq!(pick_shard(&[3], 0, Some(3), None), Some(3));
        assert_eq!(pick_shard(&[0, 1], 0, None, Some(5)), Some(5));
        assert_eq!(pick_shard(&[0, 1], 0, None, Some(1)), Some(2));
        assert_eq!(pick_shard(&[0, 2], 0, None, None), Some(1));
        let all: Vec<i16> = (0..MAX_SHARDS).collect();
        assert_eq!(pick_shard(&all, 0, None, Some(4)), None);
    }

    #[test]
    fn each_region_claims_in_its_own_range() {
        // Region 1's range starts at 256: region 0's shards do not fill it.
        let held: Vec<i16> = (0..MAX_SHARDS).collect();
        assert_eq!(pick_shard(&held, 1, None, None), Some(256));
        assert_eq!(pick_shard(&[256], 1, Some(3), None), Some(259));
        // A preferred shard of another region's range is not taken.
        assert_eq!(pick_shard(&[], 1, None, Some(4)), Some(256));
        assert_eq!(slot_of(259), 1);
        assert_eq!(slot_of(255), 0);
        // The last region's range ends at the largest smallint.
        let last = MAX_REGIONS - 1;
        let held: Vec<i16> = (last * MAX_SHARDS..i16::MAX).collect();
        assert_eq!(pick_shard(&held, last, None, None), Some(i16::MAX));
    }

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(5_000)), 5);
        assert_eq!(ttl_secs(Duration::from_millis(5_001)), 6);
    }
}
