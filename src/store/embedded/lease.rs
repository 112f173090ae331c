//! Leases on write shards in redb: `members` maps a shard to its owner and the wall-clock
//! millisecond its lease ends; `shards_used` records every shard ever claimed. One write
//! transaction is one step, as a lightweight transaction is on the scylla store. Counters here
//! carry no shard (one process writes them all), so [`Leases::adopt`] has nothing to do.

use std::time::Duration;

use chrono::Utc;
use redb::{ReadableTable, TableDefinition};

use super::db::Db;
use super::err;
use crate::store::lease::{pick_shard, Claim, Member, Roster};
use crate::store::StoreResult;

/// shard -> (owner, lease end in ms since the epoch).
const MEMBERS: TableDefinition<i16, (&str, i64)> = TableDefinition::new("members");
const SHARDS_USED: TableDefinition<i16, ()> = TableDefinition::new("shards_used");
/// shard -> (owner, written before this ms, report end in ms since the epoch).
const MEMBERS_WRITTEN: TableDefinition<i16, (&str, i64, i64)> =
    TableDefinition::new("members_written");

pub(super) fn create_tables(tx: &redb::WriteTransaction) -> StoreResult<()> {
    tx.open_table(MEMBERS).map_err(err)?;
    tx.open_table(SHARDS_USED).map_err(err)?;
    tx.open_table(MEMBERS_WRITTEN).map_err(err)?;
    Ok(())
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

fn until(ttl: Duration) -> i64 {
    now_ms().saturating_add(ttl.as_millis().min(i64::MAX as u128) as i64)
}

/// The leases that have not ended at `now`.
fn live<T: ReadableTable<i16, (&'static str, i64)>>(t: &T, now: i64) -> StoreResult<Vec<Member>> {
    let mut out = Vec::new();
    for row in t.iter().map_err(err)? {
        let (k, v) = row.map_err(err)?;
        let (owner, end) = v.value();
        if end > now {
            out.push(Member::new(k.value(), owner));
        }
    }
    Ok(out)
}

/// The shard leases of the one process that writes this store.
pub(super) struct Leases {
    db: Db,
}

impl Leases {
    pub(super) fn new(db: Db) -> Self {
        Leases { db }
    }

    pub(super) async fn claim(
        &self,
        owner: &str,
        pin: Option<i16>,
        prefer: Option<i16>,
        ttl: Duration,
    ) -> StoreResult<Claim> {
        let owner = owner.to_owned();
        self.db
            .blocking(move |db| {
                let tx = db.begin_write().map_err(err)?;
                let claim = {
                    let mut members = tx.open_table(MEMBERS).map_err(err)?;
                    let held = live(&members, now_ms())?;
                    let shards: Vec<i16> = held.iter().map(|m| m.shard).collect();
                    match pick_shard(&shards, 0, pin, prefer) {
                        None => Claim::Full,
                        Some(s) => match held.into_iter().find(|m| m.shard == s) {
                            Some(m) if m.owner != owner => Claim::Taken {
                                shard: s,
                                owner: m.owner,
                            },
                            _ => {
                                members
                                    .insert(s, (owner.as_str(), until(ttl)))
                                    .map_err(err)?;
                                tx.open_table(SHARDS_USED)
                                    .map_err(err)?
                                    .insert(s, ())
                                    .map_err(err)?;
                                Claim::Held(s)
                            }
                        },
                    }
                };
                tx.commit().map_err(err)?;
                Ok(claim)
            })
            .await
    }

    pub(super) async fn renew(&self, shard: i16, owner: &str, ttl: Duration) -> StoreResult<bool> {
        let owner = owner.to_owned();
        self.db
            .blocking(move |db| {
                let tx = db.begin_write().map_err(err)?;
                let renewed = {
                    let mut members = tx.open_table(MEMBERS).map_err(err)?;
                    let current = members
                        .get(shard)
                        .map_err(err)?
                        .map(|v| (v.value().0.to_owned(), v.value().1));
                    match current {
                        Some((o, end)) if o == owner && end > now_ms() => {
                            members
                                .insert(shard, (owner.as_str(), until(ttl)))
                                .map_err(err)?;
                            true
                        }
                        _ => false,
                    }
                };
                tx.commit().map_err(err)?;
                Ok(renewed)
            })
            .await
    }

    pub(super) async fn release(&self, shard: i16, owner: &str) -> StoreResult<bool> {
        let owner = owner.to_owned();
        self.db
            .blocking(move |db| {
                let tx = db.begin_write().map_err(err)?;
                let released = {
                    let mut members = tx.open_table(MEMBERS).map_err(err)?;
                    let mine = members
                        .get(shard)
                        .map_err(err)?
                        .is_some_and(|v| v.value().0 == owner);
                    if mine {
                        members.remove(shard).map_err(err)?;
                    }
                    mine
                };
                tx.commit().map_err(err)?;
                Ok(released)
            })
            .await
    }

    pub(super) async fn report_written(
        &self,
        shard: i16,
        owner: &str,
        written_ms: i64,
        ttl: Duration,
    ) -> StoreResult<()> {
        let owner = owner.to_owned();
        self.db
            .blocking(move |db| {
                let tx = db.begin_write().map_err(err)?;
                tx.open_table(MEMBERS_WRITTEN)
                    .map_err(err)?
                    .insert(shard, (owner.as_str(), written_ms, until(ttl)))
                    .map_err(err)?;
                tx.commit().map_err(err)?;
                Ok(())
            })
            .await
    }

    pub(super) async fn roster(&self) -> StoreResult<Roster> {
        self.db
            .blocking(|db| {
                let tx = redb::ReadableDatabase::begin_read(db).map_err(err)?;
                let now = now_ms();
                let mut members = live(&tx.open_table(MEMBERS).map_err(err)?, now)?;
                let written = tx.open_table(MEMBERS_WRITTEN).map_err(err)?;
                for m in &mut members {
                    if let Some(v) = written.get(m.shard).map_err(err)? {
                        let (owner, at, end) = v.value();
                        if owner == m.owner && end > now {
                            m.written_ms = Some(at);
                        }
                    }
                }
                let mut used = Vec::new();
                for row in tx
                    .open_table(SHARDS_USED)
                    .map_err(err)?
                    .iter()
                    .map_err(err)?
                {
                    used.push(row.map_err(err)?.0.value());
                }
                Ok(Roster { members, used })
            })
            .await
    }

    /// Counters here carry no shard: nothing to adopt.
    pub(super) fn adopt(&self, _write: Option<i16>, _read: &[i16]) {}
}
