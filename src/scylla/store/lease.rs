//! Leases on write shards in the `members` table (`migrations/0003_members.cql`), and the
//! region this instance joined ([`Leases`]: the part of the store that knows which shard it
//! writes and which shards a read sums).
//!
//! A lease is a row written with a lightweight transaction and a TTL: a claim is
//! `INSERT ... IF NOT EXISTS USING TTL`, a renewal `UPDATE ... USING TTL ... IF owner = ?`
//! (the row then lives through the cells the renewal wrote), a release
//! `DELETE ... IF owner = ?`. Paxos makes each of them one step against any other instance's,
//! so two instances never both hear "applied" for one shard while its row lives.
//! Every claimed shard is also recorded, without TTL, in `shards_used`, which reads sum.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use chrono::Utc;
use scylla::value::CqlTimestamp;

use super::connection::Cql;
use super::errors::{internal, map_exec, Op};
use super::statements::{
    BeatRegionValues, ClaimRegionSlotValues, ClaimShardValues, ListUsedValues, LogRegionBeatValues,
    MarkUsedValues, MemberRow, PutWrittenValues, ReadRegionBeatsValues, RegionBeatAtRow,
    RegionBeatRow, RegionSlotRow, ReleaseShardValues, RenewShardValues, UsedRow, WrittenRow,
    USED_PART,
};
use crate::store::lease::{pick_shard, ttl_secs, Claim, Member, RegionBeat, Roster, MAX_REGIONS};
use crate::store::{StoreError, StoreResult};

/// The heartbeat log's partitions are a minute each.
const MINUTE_MS: i64 = 60_000;

/// Claims tried in one call before answering: other instances may take each free shard
/// first, but not this many in a row unless the fleet is starting all at once.
const MAX_CLAIM_ATTEMPTS: usize = 16;

/// The shards this instance writes and reads, and its region.
pub(super) struct Leases {
    cql: Arc<Cql>,
    /// The shard this instance writes, from its lease; -1 while it holds none.
    shard: AtomicI32,
    /// The shards a read sums: every shard ever claimed.
    read_shards: ArcSwap<Vec<i16>>,
    /// This region's slot (`store::lease`): its shards are the ones a read counts as the
    /// region's part. 0 until the fleet joins a region.
    region_slot: AtomicI32,
    /// The region joined, and its slot: what heartbeats write.
    region: OnceLock<(String, i16)>,
    /// `store.local_dc`, else the data centre of the contact points.
    local_dc: Option<String>,
}

impl Leases {
    /// No lease held, no shard to read, no region joined yet.
    pub(super) fn new(cql: Arc<Cql>, local_dc: Option<String>) -> Self {
        Leases {
            cql,
            shard: AtomicI32::new(-1),
            read_shards: ArcSwap::from_pointee(Vec::new()),
            region_slot: AtomicI32::new(0),
            region: OnceLock::new(),
            local_dc,
        }
    }

    /// This instance's write shard, while it holds a lease.
    pub(super) fn shard(&self) -> Option<i16> {
        let s = self.shard.load(Ordering::Relaxed);
        (s >= 0).then_some(s as i16)
    }

    /// The shards a read sums.
    pub(super) fn read_shards(&self) -> Arc<Vec<i16>> {
        self.read_shards.load_full()
    }

    /// This region's slot: 0 until the fleet joins a region.
    pub(super) fn region_slot(&self) -> i16 {
        self.region_slot.load(Ordering::Relaxed) as i16
    }

    async fn members(&self) -> StoreResult<Vec<Member>> {
        let res = self
            .cql
            .session
            .execute_unpaged(&self.cql.st.list_members, ())
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let mut out = Vec::new();
        for row in rows.rows::<MemberRow>().map_err(internal)? {
            let (shard, owner) = row.map_err(internal)?;
            // A row whose owner cell expired but whose key is still visible is no lease.
            if let Some(owner) = owner {
                out.push(Member::new(shard, owner));
            }
        }
        out.sort_by_key(|m| m.shard);
        Ok(out)
    }

    async fn try_claim(&self, shard: i16, owner: &str, ttl: Duration) -> StoreResult<bool> {
        let now = CqlTimestamp(Utc::now().timestamp_millis());
        let values: ClaimShardValues<'_> = (shard, owner, now, ttl_secs(ttl));
        let applied = self.cql.lwt(&self.cql.st.claim_shard, values).await?;
        if applied {
            let used: MarkUsedValues = (USED_PART, shard);
            self.cql
                .session
                .execute_unpaged(&self.cql.st.mark_used, used)
                .await
                .map_err(|e| map_exec(e, Op::Write))?;
        }
        Ok(applied)
    }

    pub(super) async fn claim(
        &self,
        owner: &str,
        pin: Option<i16>,
        prefer: Option<i16>,
        ttl: Duration,
    ) -> StoreResult<Claim> {
        for _ in 0..MAX_CLAIM_ATTEMPTS {
            let members = self.members().await?;
            let held: Vec<i16> = members.iter().map(|m| m.shard).collect();
            let slot = self.region_slot();
            let Some(shard) = pick_shard(&held, slot, pin, prefer) else {
                return Ok(Claim::Full);
            };
            if self.try_claim(shard, owner, ttl).await? {
                return Ok(Claim::Held(shard));
            }
            if pin.is_some() {
                let holder = self.members().await?.into_iter().find(|m| m.shard == shard);
                return Ok(match holder {
                    Some(m) if m.owner == owner => Claim::Held(shard),
                    Some(m) => Claim::Taken {
                        shard,
                        owner: m.owner,
                    },
                    // It expired between the claim and the read: try again.
                    None => continue,
                });
            }
        }
        Err(StoreError::Unavailable(
            "every free shard was taken by another instance while claiming; try again".into(),
        ))
    }

    pub(super) async fn renew(&self, shard: i16, owner: &str, ttl: Duration) -> StoreResult<bool> {
        let now = CqlTimestamp(Utc::now().timestamp_millis());
        let values: RenewShardValues<'_> = (ttl_secs(ttl), owner, now, shard, owner);
        self.cql.lwt(&self.cql.st.renew_shard, values).await
    }

    pub(super) async fn release(&self, shard: i16, owner: &str) -> StoreResult<bool> {
        let values: ReleaseShardValues<'_> = (shard, owner);
        self.cql.lwt(&self.cql.st.release_shard, values).await
    }

    pub(super) async fn report_written(
        &self,
        shard: i16,
        owner: &str,
        written_ms: i64,
        ttl: Duration,
    ) -> StoreResult<()> {
        let values: PutWrittenValues<'_> = (
            USED_PART,
            shard,
            owner,
            CqlTimestamp(written_ms),
            ttl_secs(ttl),
        );
        self.cql
            .session
            .execute_unpaged(&self.cql.st.put_written, values)
            .await
            .map_err(|e| map_exec(e, Op::Write))?;
        Ok(())
    }

    /// What each live member last reported of its writes, into `members`.
    async fn read_written(&self, members: &mut [Member]) -> StoreResult<()> {
        let res = self
            .cql
            .session
            .execute_unpaged(
                &self.cql.st.list_written,
                ListUsedValues::from((USED_PART,)),
            )
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        for row in rows.rows::<WrittenRow>().map_err(internal)? {
            let (shard, owner, at) = row.map_err(internal)?;
            let m = members.iter_mut().find(|m| m.shard == shard);
            if let (Some(m), Some(owner), Some(at)) = (m, owner, at) {
                if m.owner == owner {
                    m.written_ms = Some(at.0);
                }
            }
        }
        Ok(())
    }

    pub(super) async fn roster(&self) -> StoreResult<Roster> {
        let mut members = self.members().await?;
        self.read_written(&mut members).await?;
        let res = self
            .cql
            .session
            .execute_unpaged(&self.cql.st.list_used, ListUsedValues::from((USED_PART,)))
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let mut used = Vec::new();
        for row in rows.rows::<UsedRow>().map_err(internal)? {
            used.push(row.map_err(internal)?.0);
        }
        used.sort_unstable();
        Ok(Roster { members, used })
    }

    /// Takes `write` as this instance's shard (none: it writes nothing) and `read` as the
    /// shards reads sum.
    pub(super) fn adopt(&self, write: Option<i16>, read: &[i16]) {
        self.shard
            .store(write.map_or(-1, i32::from), Ordering::Relaxed);
        self.read_shards.store(Arc::new(read.to_vec()));
    }

    pub(super) async fn local_region(&self) -> StoreResult<Option<String>> {
        Ok(self.local_dc.clone())
    }

    pub(super) async fn join_region(&self, region: &str) -> StoreResult<i16> {
        let mut tried = Vec::new();
        for _ in 0..MAX_CLAIM_ATTEMPTS {
            let slots = self.region_slots().await?;
            // The lowest slot naming the region: two of its instances starting at once may
            // both have claimed one, and all of them then agree on the lowest.
            let slot = match slots.iter().find(|(_, r)| r == region) {
                Some(&(slot, _)) => slot,
                None => {
                    let taken = |s: &i16| slots.iter().any(|(t, _)| t == s) || tried.contains(s);
                    let Some(free) = (0..MAX_REGIONS).find(|s| !taken(s)) else {
                        return Err(StoreError::Internal(format!(
                            "no free region slot: {MAX_REGIONS} regions hold them all"
                        )));
                    };
                    let values: ClaimRegionSlotValues<'_> = (free, region);
                    if !self.cql.lwt(&self.cql.st.claim_region_slot, values).await? {
                        tried.push(free);
                        continue;
                    }
                    match self.region_slots().await?.iter().find(|(_, r)| r == region) {
                        Some(&(slot, _)) => slot,
                        None => free,
                    }
                }
            };
            self.region_slot.store(i32::from(slot), Ordering::Relaxed);
            let _ = self.region.set((region.to_owned(), slot));
            return Ok(slot);
        }
        Err(StoreError::Unavailable(
            "every free region slot was taken by another region while claiming; try again".into(),
        ))
    }

    pub(super) async fn beat(&self, at_ms: i64) -> StoreResult<()> {
        let Some((region, slot)) = self.region.get() else {
            return Ok(());
        };
        let values: BeatRegionValues<'_> = (region, *slot, CqlTimestamp(at_ms));
        let logged: LogRegionBeatValues<'_> =
            (region, at_ms.div_euclid(MINUTE_MS), CqlTimestamp(at_ms));
        let (row, log) = futures::join!(
            self.cql
                .session
                .execute_unpaged(&self.cql.st.beat_region, values),
            self.cql
                .session
                .execute_unpaged(&self.cql.st.log_region_beat, logged),
        );
        row.and(log).map(|_| ()).map_err(|e| map_exec(e, Op::Write))
    }

    pub(super) async fn beats_between(
        &self,
        region: &str,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<i64>> {
        let mut out = Vec::new();
        if from >= to {
            return Ok(out);
        }
        for minute in from.div_euclid(MINUTE_MS)..=(to - 1).div_euclid(MINUTE_MS) {
            let values: ReadRegionBeatsValues<'_> =
                (region, minute, CqlTimestamp(from), CqlTimestamp(to));
            let rows: Vec<RegionBeatAtRow> = self
                .cql
                .read_rows(&self.cql.st.read_region_beats, values)
                .await?;
            out.extend(rows.into_iter().map(|(at,)| at.0));
        }
        Ok(out)
    }

    pub(super) async fn regions(&self) -> StoreResult<Vec<RegionBeat>> {
        let res = self
            .cql
            .session
            .execute_unpaged(&self.cql.st.list_region_beats, ())
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let mut out = Vec::new();
        for row in rows.rows::<RegionBeatRow>().map_err(internal)? {
            if let (region, Some(slot), Some(at)) = row.map_err(internal)? {
                out.push(RegionBeat {
                    region,
                    slot,
                    at_ms: at.0,
                });
            }
        }
        out.sort_by_key(|r| r.slot);
        Ok(out)
    }

    /// Every claimed region slot, by slot.
    async fn region_slots(&self) -> StoreResult<Vec<(i16, String)>> {
        let res = self
            .cql
            .session
            .execute_unpaged(&self.cql.st.list_region_slots, ())
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let mut out = Vec::new();
        for row in rows.rows::<RegionSlotRow>().map_err(internal)? {
            if let (slot, Some(region)) = row.map_err(internal)? {
                out.push((slot, region));
            }
        }
        out.sort_unstable();
        Ok(out)
    }
}
