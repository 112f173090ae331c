//! Holds (reservations) in redb: `holds` maps a hold's id to its record (JSON);
//! `hold_expiry` indexes the open ones by when they expire, and `hold_forget` every one by
//! when its record is dropped ([`HOLD_RETENTION_MS`] after it expires). Ending a hold is one
//! write transaction: the check of its state and the change are one step, as the lightweight
//! transaction is on the scylla store.

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::db::Db;
use super::{enc_i64, err};
use crate::domain::HoldState;
use crate::store::hold::{Ended, Hold, HOLD_RETENTION_MS};
use crate::store::{StoreError, StoreResult};

const HOLDS: TableDefinition<&str, &[u8]> = TableDefinition::new("holds");
const HOLD_EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("hold_expiry");
const HOLD_FORGET: TableDefinition<&[u8], ()> = TableDefinition::new("hold_forget");

pub(super) fn create_tables(tx: &redb::WriteTransaction) -> StoreResult<()> {
    tx.open_table(HOLDS).map_err(err)?;
    tx.open_table(HOLD_EXPIRY).map_err(err)?;
    tx.open_table(HOLD_FORGET).map_err(err)?;
    Ok(())
}

/// An index key: the instant, in byte order, then the id.
fn at_key(ms: i64, id: &str) -> Vec<u8> {
    let mut k = enc_i64(ms).to_vec();
    k.extend_from_slice(id.as_bytes());
    k
}

fn encode(h: &Hold) -> StoreResult<Vec<u8>> {
    serde_json::to_vec(h).map_err(|e| StoreError::Internal(format!("encoding a hold: {e}")))
}

fn decode(b: &[u8]) -> StoreResult<Hold> {
    serde_json::from_slice(b).map_err(|e| StoreError::Internal(format!("corrupt hold: {e}")))
}

/// The holds part of the store.
pub(super) struct Holds {
    db: Db,
}

impl Holds {
    pub(super) fn new(db: Db) -> Self {
        Holds { db }
    }

    pub(super) async fn put(&self, h: &Hold) -> StoreResult<()> {
        let h = h.clone();
        self.db.blocking(move |db| put(db, &h)).await
    }

    pub(super) async fn get(&self, id: &str) -> StoreResult<Option<Hold>> {
        let id = id.to_owned();
        self.db.blocking(move |db| get(db, &id)).await
    }

    pub(super) async fn end(
        &self,
        id: &str,
        state: HoldState,
        cost: Option<u64>,
        now_ms: i64,
    ) -> StoreResult<Ended> {
        let id = id.to_owned();
        self.db
            .blocking(move |db| end(db, &id, state, cost, now_ms))
            .await
    }

    pub(super) async fn expired(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<Hold>> {
        self.db.blocking(move |db| expired(db, now_ms, limit)).await
    }

    /// Expires those of `ids` still open, in one write transaction.
    pub(super) async fn expire(&self, ids: &[String], now_ms: i64) -> StoreResult<Vec<Hold>> {
        let ids = ids.to_vec();
        self.db.blocking(move |db| expire(db, &ids, now_ms)).await
    }
}

fn put(db: &Database, h: &Hold) -> StoreResult<()> {
    let tx = db.begin_write().map_err(err)?;
    {
        tx.open_table(HOLDS)
            .map_err(err)?
            .insert(h.id.as_str(), encode(h)?.as_slice())
            .map_err(err)?;
        tx.open_table(HOLD_EXPIRY)
            .map_err(err)?
            .insert(at_key(h.expires_ms, &h.id).as_slice(), ())
            .map_err(err)?;
        let forget = h.expires_ms.saturating_add(HOLD_RETENTION_MS);
        tx.open_table(HOLD_FORGET)
            .map_err(err)?
            .insert(at_key(forget, &h.id).as_slice(), ())
            .map_err(err)?;
    }
    tx.commit().map_err(err)
}

fn get(db: &Database, id: &str) -> StoreResult<Option<Hold>> {
    let tx = db.begin_read().map_err(err)?;
    let t = tx.open_table(HOLDS).map_err(err)?;
    let row = t.get(id).map_err(err)?;
    row.map(|v| decode(v.value())).transpose()
}

fn end(
    db: &Database,
    id: &str,
    state: HoldState,
    cost: Option<u64>,
    now_ms: i64,
) -> StoreResult<Ended> {
    let tx = db.begin_write().map_err(err)?;
    let out = end_in(&tx, id, state, cost, now_ms)?;
    tx.commit().map_err(err)?;
    Ok(out)
}

/// Expires those of `ids` still open, all in one transaction; the holds it ended.
fn expire(db: &Database, ids: &[String], now_ms: i64) -> StoreResult<Vec<Hold>> {
    let tx = db.begin_write().map_err(err)?;
    let mut ended = Vec::new();
    for id in ids {
        if let Ended::Now(h) = end_in(&tx, id, HoldState::Expired, None, now_ms)? {
            ended.push(h);
        }
    }
    tx.commit().map_err(err)?;
    Ok(ended)
}

/// Ends the hold `id` in `tx` if it is still open.
fn end_in(
    tx: &redb::WriteTransaction,
    id: &str,
    state: HoldState,
    cost: Option<u64>,
    now_ms: i64,
) -> StoreResult<Ended> {
    let mut holds = tx.open_table(HOLDS).map_err(err)?;
    let found = holds.get(id).map_err(err)?.map(|v| decode(v.value()));
    Ok(match found.transpose()? {
        None => Ended::Unknown,
        Some(h) if h.state != HoldState::Open => Ended::Before(h),
        Some(mut h) => {
            h.state = state;
            h.cost = cost;
            h.ended_ms = Some(now_ms);
            holds.insert(id, encode(&h)?.as_slice()).map_err(err)?;
            tx.open_table(HOLD_EXPIRY)
                .map_err(err)?
                .remove(at_key(h.expires_ms, id).as_slice())
                .map_err(err)?;
            Ended::Now(h)
        }
    })
}

/// Open holds past their time, oldest first; drops the records past their retention on the way.
fn expired(db: &Database, now_ms: i64, limit: usize) -> StoreResult<Vec<Hold>> {
    forget(db, now_ms, limit)?;
    let tx = db.begin_read().map_err(err)?;
    let index = tx.open_table(HOLD_EXPIRY).map_err(err)?;
    let holds = tx.open_table(HOLDS).map_err(err)?;
    let mut out = Vec::new();
    for row in index.range(..enc_i64(now_ms).as_slice()).map_err(err)? {
        if out.len() >= limit {
            break;
        }
        let (k, _) = row.map_err(err)?;
        let id = std::str::from_utf8(&k.value()[8..])
            .map_err(|_| StoreError::Internal("corrupt hold index".into()))?
            .to_owned();
        if let Some(v) = holds.get(id.as_str()).map_err(err)? {
            let h = decode(v.value())?;
            if h.state == HoldState::Open {
                out.push(h);
            }
        }
    }
    Ok(out)
}

/// Drops up to `limit` records whose retention ended before `now_ms` (a write only when
/// there are some).
fn forget(db: &Database, now_ms: i64, limit: usize) -> StoreResult<()> {
    let due: Vec<Vec<u8>> = {
        let tx = db.begin_read().map_err(err)?;
        let index = tx.open_table(HOLD_FORGET).map_err(err)?;
        let due = index
            .range(..enc_i64(now_ms).as_slice())
            .map_err(err)?
            .take(limit)
            .map(|r| r.map(|(k, _)| k.value().to_vec()).map_err(err))
            .collect::<StoreResult<_>>()?;
        due
    };
    if due.is_empty() {
        return Ok(());
    }
    let tx = db.begin_write().map_err(err)?;
    {
        let mut index = tx.open_table(HOLD_FORGET).map_err(err)?;
        let mut holds = tx.open_table(HOLDS).map_err(err)?;
        let mut expiry = tx.open_table(HOLD_EXPIRY).map_err(err)?;
        for k in due {
            index.remove(k.as_slice()).map_err(err)?;
            if let Ok(id) = std::str::from_utf8(&k[8..]) {
                let gone = holds.remove(id).map_err(err)?;
                if let Some(v) = gone {
                    let h = decode(v.value())?;
                    expiry
                        .remove(at_key(h.expires_ms, id).as_slice())
                        .map_err(err)?;
                }
            }
        }
    }
    tx.commit().map_err(err)
}
