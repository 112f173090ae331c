//! The counter rows of the embedded store: one row per counter holding its live buckets.
//!
//! - `counter_rows`: key = tenant \0 subject \0 limit \0 grain(8), value = the counter's buckets
//!   sorted by start, packed ([`encode`]).
//! - `counter_expiry`: key = slot(8) ++ counter key. `slot` is the instant the row's newest
//!   bucket passes its retention, rounded up to [`EXPIRY_SLOT_MS`]: by then every bucket of the
//!   row has, so the janitor deletes the whole row. A write that moves the row into another slot
//!   moves its entry, so every entry names a row that is due when the entry is.
//!
//! Why a row per counter and not per bucket: a sync round then costs one read and one write per
//! counter it touches, whatever the number of buckets it adds to. A 1 s window is cut into 100 ms
//! buckets, so a row per bucket meant about ten new rows a second per active client, each with an
//! index entry to write and later two deletes, and a janitor that could not keep up under a
//! sustained load (the file grew without bound). Each write also drops the row's buckets that
//! are past retention counted from the newest bucket it adds (the clock has reached that one), so
//! a busy counter's row holds at most [`crate::domain::MAX_BUCKETS_READ`] + 1 buckets and never
//! waits for the janitor; the janitor only deletes the rows of counters no longer written.
//!
//! Stores written by earlier releases are folded into this layout when opened (`legacy`).

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use super::{dec_i64, enc_i64, err};
use crate::domain::Grain;
use crate::pace::Pacer;
use crate::store::{CounterKey, StoreError, StoreResult};

pub(super) const COUNTER_ROWS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("counter_rows");
pub(super) const COUNTER_EXPIRY: TableDefinition<&[u8], ()> =
    TableDefinition::new("counter_expiry");

/// Expiry times are rounded up to this, so that a counter written all the time moves its
/// index entry once a minute, not at every write; a row no longer written stays on disk at
/// most this much past its retention.
pub(super) const EXPIRY_SLOT_MS: i64 = 60_000;

pub(super) fn create_tables(tx: &WriteTransaction) -> StoreResult<()> {
    tx.open_table(COUNTER_ROWS).map_err(err)?;
    tx.open_table(COUNTER_EXPIRY).map_err(err)?;
    Ok(())
}

/// The row key of a counter.
pub(super) fn row_key(k: &CounterKey) -> Vec<u8> {
    let mut v = Vec::with_capacity(k.tenant.len() + k.subject.len() + k.limit.len() + 11);
    put_row_key(&mut v, k);
    v
}

/// Appends the row key of a counter to `v`.
pub(super) fn put_row_key(v: &mut Vec<u8>, k: &CounterKey) {
    v.extend_from_slice(k.tenant.as_bytes());
    v.push(0);
    v.extend_from_slice(k.subject.as_bytes());
    v.push(0);
    v.extend_from_slice(k.limit.as_bytes());
    v.push(0);
    v.extend_from_slice(&enc_i64(k.grain.code()));
}

/// The grain of a row key (its last 8 bytes).
pub(super) fn row_grain(key: &[u8]) -> Option<Grain> {
    let n = key.len();
    (n >= 8).then(|| Grain::from_code(dec_i64(&key[n - 8..])))?
}

/// Appends `v` as a LEB128 varint.
pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn get_varint(bytes: &[u8], at: &mut usize) -> StoreResult<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes
            .get(*at)
            .ok_or_else(|| StoreError::Internal("corrupt counter row".into()))?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(StoreError::Internal("corrupt counter row".into()))
}

/// A signed integer as an unsigned one that is small when it is near 0 either way.
pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(super) fn unzigzag(z: u64) -> i64 {
    (z >> 1) as i64 ^ -((z & 1) as i64)
}

/// A row's value: the first bucket's start (8 bytes, little-endian), then per bucket the gap
/// from the previous start (varint; 0 for the first) and the count (zigzag varint). A busy
/// 1 s window's row (34 buckets of 100 ms) takes 76 to 110 bytes, not 544.
fn encode(buckets: &[(i64, i64)], out: &mut Vec<u8>) {
    out.clear();
    let Some(&(first, _)) = buckets.first() else {
        return;
    };
    out.extend_from_slice(&first.to_le_bytes());
    let mut prev = first;
    for &(start, count) in buckets {
        put_varint(out, start.wrapping_sub(prev) as u64);
        put_varint(out, zigzag(count));
        prev = start;
    }
}

fn decode(bytes: &[u8], out: &mut Vec<(i64, i64)>) -> StoreResult<()> {
    out.clear();
    if bytes.is_empty() {
        return Ok(());
    }
    let first: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| StoreError::Internal("corrupt counter row".into()))?;
    let mut start = i64::from_le_bytes(first);
    let mut at = 8;
    while at < bytes.len() {
        start = start.wrapping_add(get_varint(bytes, &mut at)? as i64);
        out.push((start, unzigzag(get_varint(bytes, &mut at)?)));
    }
    Ok(())
}

/// The expiry index key of a row whose newest bucket starts at `newest`.
fn expiry_key(row: &[u8], grain: Grain, newest: i64) -> Vec<u8> {
    let due = newest.saturating_add(grain.retention_ms());
    let slot = due
        .div_euclid(EXPIRY_SLOT_MS)
        .saturating_add(i64::from(due.rem_euclid(EXPIRY_SLOT_MS) != 0))
        .saturating_mul(EXPIRY_SLOT_MS);
    let mut v = Vec::with_capacity(8 + row.len());
    v.extend_from_slice(&enc_i64(slot));
    v.extend_from_slice(row);
    v
}

/// Adds `(start, delta)` pairs (sorted by start) into a row's buckets, then drops the buckets
/// past retention counted from the newest bucket added (a write means the clock has reached
/// it; a row's newest bucket may be ahead of the clock after the clock stepped back, and counting
/// from it would drop what is being written now).
fn merge(buckets: &mut Vec<(i64, i64)>, adds: &[(i64, i64)], grain: Grain) {
    add_buckets(buckets, adds);
    if let Some(newest) = adds.iter().map(|a| a.0).max() {
        let retention = grain.retention_ms();
        buckets.retain(|b| b.0.saturating_add(retention) > newest);
    }
}

/// Adds `(start, delta)` pairs (in any order) into buckets sorted by start.
pub(super) fn add_buckets<'a>(
    buckets: &mut Vec<(i64, i64)>,
    adds: impl IntoIterator<Item = &'a (i64, i64)>,
) {
    for &(start, delta) in adds {
        match buckets.binary_search_by_key(&start, |b| b.0) {
            Ok(i) => buckets[i].1 = buckets[i].1.saturating_add(delta),
            Err(i) => buckets.insert(i, (start, delta)),
        }
    }
}

/// Reusable buffers of [`add_to_row`].
#[derive(Default)]
pub(super) struct Scratch {
    buckets: Vec<(i64, i64)>,
    bytes: Vec<u8>,
}

/// Adds `adds` (in any order) to the row at `key`, creating it, and keeps its expiry entry
/// in the slot of its newest bucket. One descent of the B-tree: the row is read and replaced
/// through the same mutable access.
pub(super) fn add_to_row(
    rows: &mut Table<&[u8], &[u8]>,
    expiry: &mut Table<&[u8], ()>,
    key: &[u8],
    adds: &[(i64, i64)],
    scratch: &mut Scratch,
) -> StoreResult<()> {
    let grain = row_grain(key).ok_or_else(|| StoreError::Internal("bad counter key".into()))?;
    let buckets = &mut scratch.buckets;
    let mut row = rows.get_mut(key).map_err(err)?;
    let before = match &row {
        Some(v) => match decode(v.value(), buckets) {
            Ok(()) => buckets.last().map(|b| b.0),
            Err(_) => {
                // Failing the round would keep every hit pending for good: the row is lost
                // either way, so say so and start it again (its old index entry, if any, is
                // checked against the row when due).
                tracing::error!(
                    key = %String::from_utf8_lossy(key),
                    "embedded store: an unreadable counter row is replaced"
                );
                buckets.clear();
                None
            }
        },
        None => {
            buckets.clear();
            None
        }
    };
    merge(buckets, adds, grain);
    let Some(&(newest, _)) = buckets.last() else {
        return Ok(());
    };
    encode(buckets, &mut scratch.bytes);
    match row.as_mut() {
        Some(v) => v.insert(scratch.bytes.as_slice()).map_err(err)?,
        None => {
            drop(row);
            rows.insert(key, scratch.bytes.as_slice()).map_err(err)?;
        }
    }
    let entry = expiry_key(key, grain, newest);
    match before.map(|b| expiry_key(key, grain, b)) {
        Some(old) if old == entry => {}
        old => {
            if let Some(old) = old {
                expiry.remove(old.as_slice()).map_err(err)?;
            }
            expiry.insert(entry.as_slice(), ()).map_err(err)?;
        }
    }
    Ok(())
}

/// Adds each run of adds to the row at its key ([`add_to_row`]).
pub(super) fn add_runs<'a>(
    tx: &WriteTransaction,
    runs: impl Iterator<Item = (&'a [u8], &'a [(i64, i64)])>,
) -> StoreResult<()> {
    let mut rows = tx.open_table(COUNTER_ROWS).map_err(err)?;
    let mut expiry = tx.open_table(COUNTER_EXPIRY).map_err(err)?;
    let mut scratch = Scratch::default();
    let mut pace = Pacer::new();
    for (key, adds) in runs {
        add_to_row(&mut rows, &mut expiry, key, adds, &mut scratch)?;
        pace.step();
    }
    Ok(())
}

/// The buckets of the rows at `keys` (none for a row that does not exist), all of them.
pub(super) fn read_rows<T: ReadableTable<&'static [u8], &'static [u8]>>(
    rows: &T,
    keys: &[Vec<u8>],
) -> StoreResult<Vec<Vec<(i64, i64)>>> {
    let mut out = Vec::with_capacity(keys.len());
    let mut pace = Pacer::new();
    for key in keys {
        pace.step();
        let mut buckets = Vec::new();
        if let Some(v) = rows.get(key.as_slice()).map_err(err)? {
            if decode(v.value(), &mut buckets).is_err() {
                // Read as empty; the next write replaces it (see `add_to_row`).
                tracing::error!(
                    key = %String::from_utf8_lossy(key),
                    "embedded store: an unreadable counter row"
                );
                buckets.clear();
            }
        }
        out.push(buckets);
    }
    Ok(out)
}

/// Deletes the rows whose every bucket is past retention at `now_ms`, until at least `budget`
/// buckets went (or none is due); returns how many buckets went. Fewer than `budget` means
/// nothing more is due.
pub(super) fn delete_expired(
    tx: &WriteTransaction,
    now_ms: i64,
    budget: usize,
) -> StoreResult<u64> {
    let mut rows = tx.open_table(COUNTER_ROWS).map_err(err)?;
    let mut expiry = tx.open_table(COUNTER_EXPIRY).map_err(err)?;
    let mut removed = 0u64;
    let mut buckets = Vec::new();
    let mut bytes = Vec::new();
    let mut pace = Pacer::new();
    while removed < budget as u64 {
        pace.step();
        let Some(entry) = expiry
            .range(..=enc_i64(now_ms).as_slice())
            .map_err(err)?
            .next()
            .map(|item| item.map(|(k, _)| k.value().to_vec()).map_err(err))
            .transpose()?
        else {
            break;
        };
        expiry.remove(entry.as_slice()).map_err(err)?;
        let key = &entry[8..];
        let Some(grain) = row_grain(key) else {
            continue;
        };
        let Some(v) = rows.get(key).map_err(err)?.map(|v| v.value().to_vec()) else {
            continue;
        };
        if decode(&v, &mut buckets).is_err() {
            // Unreadable, and due by its index entry: nothing in it can be used.
            rows.remove(key).map_err(err)?;
            continue;
        }
        // Every bucket is due when the entry is; checking each guards against a corrupt entry.
        let before = buckets.len();
        let retention = grain.retention_ms();
        buckets.retain(|b| b.0.saturating_add(retention) > now_ms);
        removed += (before - buckets.len()) as u64;
        match buckets.last() {
            None => {
                rows.remove(key).map_err(err)?;
            }
            Some(&(newest, _)) => {
                encode(&buckets, &mut bytes);
                rows.insert(key, bytes.as_slice()).map_err(err)?;
                expiry
                    .insert(expiry_key(key, grain, newest).as_slice(), ())
                    .map_err(err)?;
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::store::Delta;
    use redb::ReadableTableMetadata;
    use std::sync::Arc;

    /// Adds deltas as a sync round does, a run per delta.
    fn add(tx: &WriteTransaction, ds: &[Delta]) -> StoreResult<()> {
        let runs: Vec<_> = ds
            .iter()
            .map(|d| (row_key(&d.key), [(d.start, d.delta)]))
            .collect();
        add_runs(tx, runs.iter().map(|(k, a)| (k.as_slice(), &a[..])))
    }

    /// A counter of client `c` of tenant `t` (also for the `legacy` tests).
    pub(in crate::store::embedded) fn key(limit: &str, grain: Grain) -> CounterKey {
        CounterKey {
            tenant: "t".into(),
            subject: Arc::from("c"),
            limit: limit.into(),
            grain,
        }
    }

    #[test]
    fn merging_adds_inserts_in_order_and_drops_what_the_newest_outlived() {
        let g = Grain::Fixed(100);
        let mut b = vec![(0, 1), (200, 2)];
        merge(&mut b, &[(100, 5), (200, -1), (300, 4)], g);
        assert_eq!(b, vec![(0, 1), (100, 5), (200, 1), (300, 4)]);
        // retention of 100 ms buckets: 3.4 s; a bucket at 3_400 outlives the one at 0 exactly.
        merge(&mut b, &[(g.retention_ms(), 1)], g);
        assert_eq!(b.first(), Some(&(100, 5)));
        assert_eq!(b.len(), 4);
    }

    #[test]
    fn a_clock_stepped_back_keeps_what_it_writes() {
        let g = Grain::Fixed(100);
        // The row's newest bucket is 10 s ahead of the clock that writes now.
        let mut b = vec![(10_000, 5)];
        merge(&mut b, &[(0, 1), (100, 2)], g);
        assert_eq!(b, vec![(0, 1), (100, 2), (10_000, 5)]);
        // Once the clock is back past it, the old buckets go as usual.
        merge(&mut b, &[(10_000 + g.retention_ms(), 1)], g);
        assert_eq!(b, vec![(10_000 + g.retention_ms(), 1)]);
    }

    #[test]
    fn expiry_slots_round_up_to_the_slot_and_cover_the_newest_bucket() {
        let g = Grain::Fixed(1_000);
        let row = row_key(&key("l", g));
        for newest in [0, 1, 59_000 - g.retention_ms(), 123_456_789] {
            let k = expiry_key(&row, g, newest);
            let slot = dec_i64(&k[..8]);
            assert_eq!(slot % EXPIRY_SLOT_MS, 0);
            assert!(slot >= newest + g.retention_ms());
            assert!(slot < newest + g.retention_ms() + EXPIRY_SLOT_MS);
            assert_eq!(&k[8..], row.as_slice());
        }
    }

    #[test]
    fn rows_round_trip_and_reject_a_torn_value() {
        let rows: [&[(i64, i64)]; 4] = [
            &[],
            &[(-5, i64::MIN), (7, i64::MAX), (8, 0), (1 << 50, -1)],
            &[(i64::MIN, 1), (i64::MAX, -1)],
            &[
                (1_700_000_000_000, 3),
                (1_700_000_000_100, 300),
                (1_700_003_600_000, -2),
            ],
        ];
        let mut bytes = Vec::new();
        let mut out = Vec::new();
        for row in rows {
            encode(row, &mut bytes);
            decode(&bytes, &mut out).unwrap();
            assert_eq!(out, row);
            if !row.is_empty() {
                assert!(decode(&bytes[..bytes.len() - 1], &mut out).is_err());
            }
        }
        // 34 buckets of 100 ms with counts below 64: 8 + 34 x 2 bytes.
        let busy: Vec<(i64, i64)> = (0..34).map(|i| (1_700_000_000_000 + i * 100, 60)).collect();
        encode(&busy, &mut bytes);
        assert_eq!(bytes.len(), 8 + 34 * 2);
        assert_eq!(
            row_grain(&row_key(&key("l", Grain::Month))),
            Some(Grain::Month)
        );
    }

    #[test]
    fn a_busy_counter_keeps_a_bounded_row_and_an_idle_one_is_deleted_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("t.redb")).unwrap();
        let g = Grain::Fixed(100);
        let (busy, idle) = (key("busy", g), key("idle", g));
        let delta = |k: &CounterKey, start| Delta {
            key: k.clone(),
            start,
            delta: 1,
        };
        let tx = db.begin_write().unwrap();
        create_tables(&tx).unwrap();
        add(&tx, &[delta(&idle, 0)]).unwrap();
        // Ten minutes of a bucket every 100 ms, in rounds of three.
        let starts: Vec<i64> = (0..6_000).map(|i| i * 100).collect();
        for round in starts.chunks(3) {
            let ds: Vec<Delta> = round.iter().map(|&s| delta(&busy, s)).collect();
            add(&tx, &ds).unwrap();
        }
        let rows = tx.open_table(COUNTER_ROWS).unwrap();
        let mut b = Vec::new();
        decode(
            rows.get(row_key(&busy).as_slice())
                .unwrap()
                .unwrap()
                .value(),
            &mut b,
        )
        .unwrap();
        assert_eq!(b.len() as i64, g.retention_ms() / 100);
        assert_eq!(b.last().unwrap().0, 599_900);
        drop(rows);
        // One index entry per row, whatever the writes: the busy row's moved with it.
        assert_eq!(tx.open_table(COUNTER_EXPIRY).unwrap().len().unwrap(), 2);
        let now = 599_900;
        assert_eq!(
            delete_expired(&tx, now, 1_000).unwrap(),
            1,
            "only the idle row is due"
        );
        let rows = tx.open_table(COUNTER_ROWS).unwrap();
        assert!(rows.get(row_key(&idle).as_slice()).unwrap().is_none());
        assert!(rows.get(row_key(&busy).as_slice()).unwrap().is_some());
        drop(rows);
        assert_eq!(
            delete_expired(&tx, now + g.retention_ms() + EXPIRY_SLOT_MS, 1_000).unwrap(),
            34
        );
        assert_eq!(tx.open_table(COUNTER_EXPIRY).unwrap().len().unwrap(), 0);
    }
}
