//! The counters' journal: a sync round's increments appended as one record, and folded into
//! the counter rows every few rounds.
//!
//! Writing a round straight into the rows costs, for every counter it touches, a descent of
//! the B-tree, the row's decode and encode and a copy of its page: 22 ms a round for the
//! 2x10^4 counters of 10^4 busy clients (`cargo bench --bench store_rounds`), about half of
//! the CPU quotad spent outside its request workers at full load. A round is instead one
//! record, one insert, in `counter_journal` (key: a sequence number). Every [`FOLD_EVERY`]
//! rounds, or sooner once [`FOLD_AT`] buckets wait, the round's increments and every record
//! are added to the rows in one transaction, which also deletes the records: a counter hit in
//! every round is written to its row once a fold, not once a round.
//!
//! Nothing reads differently. What waits in the journal is also held in memory, summed per
//! row and bucket ([`Journal`]), and every read of the rows adds it. A record is committed as
//! the rows' writes were (fsynced, with the round), so a crash loses nothing: opening the
//! store folds the records it finds ([`recover`]). A shutdown folds what waits (`flush`), so a
//! store closed cleanly has an empty journal, which an earlier release (that knows no journal)
//! reads whole.
//!
//! Consistency with reads: the rows change only at a fold, and the journal in memory changes
//! only with a commit, under its lock. A read takes its snapshot of the rows under that lock
//! and adds what waits under it again, unless a fold committed in between (then it reads
//! again): so it adds exactly what its snapshot of the rows lacks, or more that was committed
//! since, never less.

use std::sync::{Arc, Mutex, MutexGuard};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use super::err;
use super::increments::Increments;
use super::rows;
use crate::pace::Pacer;
use crate::store::{BucketTotal, CounterRange, StoreError, StoreResult};

const JOURNAL: TableDefinition<u64, &[u8]> = TableDefinition::new("counter_journal");

/// Rounds appended between folds: with the default 250 ms sync interval, a fold every 2 s.
const FOLD_EVERY: u64 = 8;
/// Buckets waiting (distinct row and start) that make the next round fold whatever the count
/// of rounds: bounds the memory the journal holds (16 bytes a bucket, and about 70 a counter
/// for its row key), about 25 MB at most.
const FOLD_AT: usize = 1 << 18;

/// What the journal holds, in memory.
#[derive(Default)]
pub(super) struct Journal {
    /// Every record's increments, summed: a run per counter, in key order.
    waiting: Arc<Increments>,
    /// Records in the table, all summed in `waiting`; also the next record's key (the table
    /// is emptied whenever this goes back to 0).
    records: u64,
    /// Folds committed: a read whose snapshot of the rows is older than the last fold must not
    /// add what waits now (the fold moved it into rows it cannot see).
    folds: u64,
}

pub(super) fn create_tables(tx: &WriteTransaction) -> StoreResult<()> {
    tx.open_table(JOURNAL).map_err(err)?;
    Ok(())
}

impl Journal {
    /// A fold committed: the rows hold everything.
    fn folded(&mut self) {
        self.waiting = Arc::default();
        self.records = 0;
        self.folds += 1;
    }
}

fn lock(j: &Mutex<Journal>) -> MutexGuard<'_, Journal> {
    // Changed only after a commit, in steps that cannot fail: a panic elsewhere leaves it whole.
    j.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes a sync round's increments: appended to the journal, or, when a fold is due, added
/// to the rows with everything the journal holds.
pub(super) fn write(db: &Database, j: &Mutex<Journal>, inc: &Increments) -> StoreResult<()> {
    write_or_fold(db, j, inc, false)
}

/// Folds everything the journal holds into the rows (at shutdown), if anything.
pub(super) fn fold_all(db: &Database, j: &Mutex<Journal>) -> StoreResult<()> {
    if lock(j).records == 0 {
        return Ok(());
    }
    write_or_fold(db, j, &Increments::default(), true)
}

fn write_or_fold(
    db: &Database,
    j: &Mutex<Journal>,
    inc: &Increments,
    fold_now: bool,
) -> StoreResult<()> {
    // One writer at a time (redb's): nothing else changes the journal until this commits, and
    // the work before the commit needs no lock.
    let tx = db.begin_write().map_err(err)?;
    let (waiting, records) = {
        let g = lock(j);
        (g.waiting.clone(), g.records)
    };
    let sum = waiting.merged(inc);
    if !(fold_now || records + 1 >= FOLD_EVERY || sum.adds_len() >= FOLD_AT) {
        append(&tx, records, inc)?;
        let mut g = lock(j);
        tx.commit().map_err(err)?;
        g.waiting = Arc::new(sum);
        g.records += 1;
        return Ok(());
    }
    fold(&tx, &sum)?;
    let mut g = lock(j);
    tx.commit().map_err(err)?;
    g.folded();
    Ok(())
}

/// The janitor's sweep ([`rows::delete_expired`]), after a fold of the journal in the same
/// transaction: what waits in it then falls under the janitor's rule too, and a bucket past
/// retention that only the journal held is not read back after the sweep.
pub(super) fn delete_expired(
    db: &Database,
    j: &Mutex<Journal>,
    now_ms: i64,
    budget: usize,
) -> StoreResult<u64> {
    let tx = db.begin_write().map_err(err)?;
    let waiting = {
        let g = lock(j);
        (g.records > 0).then(|| g.waiting.clone())
    };
    if let Some(w) = &waiting {
        fold(&tx, w)?;
    }
    let removed = rows::delete_expired(&tx, now_ms, budget)?;
    let mut g = lock(j);
    tx.commit().map_err(err)?;
    if waiting.is_some() {
        g.folded();
    }
    Ok(removed)
}

/// Appends one record: the increments' runs, each as its key's length (varint), the key, the
/// number of adds (varint), and each add's start and delta (zigzag varints).
fn append(tx: &WriteTransaction, seq: u64, inc: &Increments) -> StoreResult<()> {
    let mut v = Vec::with_capacity(inc.keys_len() + 8 * inc.adds_len());
    let mut pace = Pacer::every(64);
    for (key, adds) in inc.runs() {
        pace.step();
        rows::put_varint(&mut v, key.len() as u64);
        v.extend_from_slice(key);
        rows::put_varint(&mut v, adds.len() as u64);
        for &(start, delta) in adds {
            rows::put_varint(&mut v, rows::zigzag(start));
            rows::put_varint(&mut v, rows::zigzag(delta));
        }
    }
    let mut t = tx.open_table(JOURNAL).map_err(err)?;
    t.insert(seq, v.as_slice()).map_err(err)?;
    Ok(())
}

/// A record's increments.
fn read_record(bytes: &[u8]) -> StoreResult<Increments> {
    let mut inc = Increments::default();
    let mut at = 0;
    let bad = || StoreError::Internal("corrupt counter journal record".into());
    while at < bytes.len() {
        let n = rows::get_varint(bytes, &mut at)? as usize;
        let key = bytes.get(at..at.saturating_add(n)).ok_or_else(bad)?;
        at += n;
        let adds = rows::get_varint(bytes, &mut at)?;
        let mut run = Vec::new();
        for _ in 0..adds {
            let start = rows::unzigzag(rows::get_varint(bytes, &mut at)?);
            let delta = rows::unzigzag(rows::get_varint(bytes, &mut at)?);
            run.push((start, delta));
        }
        inc.push(key, &run);
    }
    inc.sort();
    Ok(inc)
}

/// Adds `sum` (a run per counter) to the rows and deletes every record.
fn fold(tx: &WriteTransaction, sum: &Increments) -> StoreResult<()> {
    sum.apply(tx)?;
    let mut t = tx.open_table(JOURNAL).map_err(err)?;
    t.retain(|_, _| false).map_err(err)?;
    Ok(())
}

/// At opening: folds the records a crash left, and empties the table (the journal in memory
/// starts empty, and so do its record keys). Returns how many records were folded.
pub(super) fn recover(tx: &WriteTransaction) -> StoreResult<u64> {
    let mut sum = Increments::default();
    let mut records = 0;
    let mut found = 0;
    {
        let t = tx.open_table(JOURNAL).map_err(err)?;
        for item in t.iter().map_err(err)? {
            let (seq, v) = item.map_err(err)?;
            found += 1;
            // Refusing to open would stop the service over one round's increments.
            match read_record(v.value()) {
                Ok(inc) => {
                    sum = sum.merged(&inc);
                    records += 1;
                }
                Err(e) => tracing::error!(
                    record = seq.value(),
                    error = %e,
                    "embedded store: an unreadable record of the counter journal is left out"
                ),
            }
        }
    }
    if found > 0 {
        fold(tx, &sum)?;
    }
    Ok(records)
}

/// Reads the ranges: the rows, plus what waits in the journal.
pub(super) fn read(
    db: &Database,
    j: &Mutex<Journal>,
    ranges: &[CounterRange],
) -> StoreResult<Vec<Vec<BucketTotal>>> {
    let keys: Vec<Vec<u8>> = ranges.iter().map(|r| rows::row_key(&r.key)).collect();
    loop {
        let (tx, folds) = {
            let g = lock(j);
            (db.begin_read().map_err(err)?, g.folds)
        };
        let rows = tx.open_table(rows::COUNTER_ROWS).map_err(err)?;
        let found = rows::read_rows(&rows, &keys)?;
        let g = lock(j);
        if g.folds != folds {
            continue;
        }
        let waiting = g.waiting.clone();
        drop(g);
        return Ok(with_waiting(&waiting, &keys, found, ranges));
    }
}

/// Adds `inc` to the rows and reads the ranges, plus what waits in the journal, as one step
/// (strict mode).
pub(super) fn increment_and_read(
    db: &Database,
    j: &Mutex<Journal>,
    inc: &Increments,
    ranges: &[CounterRange],
) -> StoreResult<Vec<Vec<BucketTotal>>> {
    let keys: Vec<Vec<u8>> = ranges.iter().map(|r| rows::row_key(&r.key)).collect();
    let tx = db.begin_write().map_err(err)?;
    inc.apply(&tx)?;
    let found = {
        let rows = tx.open_table(rows::COUNTER_ROWS).map_err(err)?;
        rows::read_rows(&rows, &keys)?
    };
    // The journal cannot change while this transaction is open (one writer at a time).
    let waiting = lock(j).waiting.clone();
    let totals = with_waiting(&waiting, &keys, found, ranges);
    tx.commit().map_err(err)?;
    Ok(totals)
}

/// The rows' buckets `found` at `keys`, plus what waits for each, as the totals of `ranges`.
fn with_waiting(
    waiting: &Increments,
    keys: &[Vec<u8>],
    mut found: Vec<Vec<(i64, i64)>>,
    ranges: &[CounterRange],
) -> Vec<Vec<BucketTotal>> {
    let mut pace = Pacer::every(16);
    for (key, buckets) in keys.iter().zip(&mut found) {
        rows::add_buckets(buckets, waiting.adds_of(key));
        pace.step();
    }
    ranges
        .iter()
        .zip(found)
        .map(|(r, buckets)| {
            buckets
                .into_iter()
                .filter(|b| r.from <= b.0 && b.0 <= r.to)
                .map(|(start, total)| BucketTotal::alone(start, total))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Grain;
    use crate::store::{CounterKey, CounterStore, Delta};
    use redb::ReadableTableMetadata;
    use rows::EXPIRY_SLOT_MS;

    const T0: i64 = 1_700_000_000_000;

    fn key(limit: &str) -> CounterKey {
        CounterKey {
            tenant: "t".into(),
            subject: "c".into(),
            limit: limit.into(),
            grain: Grain::Fixed(1_000),
        }
    }

    /// A round adding `n` to `key` at each of `starts`.
    fn round(key: &CounterKey, starts: &[i64], n: i64) -> Increments {
        let deltas: Vec<Delta> = starts
            .iter()
            .map(|&start| Delta {
                key: key.clone(),
                start,
                delta: n,
            })
            .collect();
        Increments::of(&deltas)
    }

    fn range(key: &CounterKey) -> CounterRange {
        CounterRange {
            key: key.clone(),
            from: T0 - 60_000,
            to: T0 + 60_000,
        }
    }

    fn totals(got: &[Vec<BucketTotal>]) -> Vec<Vec<(i64, i64)>> {
        got.iter()
            .map(|v| v.iter().map(|b| (b.start, b.total)).collect())
            .collect()
    }

    fn table_len(db: &Database, t: TableDefinition<'_, impl redb::Key, impl redb::Value>) -> u64 {
        let tx = db.begin_read().unwrap();
        tx.open_table(t).unwrap().len().unwrap()
    }

    fn open(dir: &std::path::Path) -> (Database, Mutex<Journal>) {
        let db = Database::create(dir.join("t.redb")).unwrap();
        let tx = db.begin_write().unwrap();
        rows::create_tables(&tx).unwrap();
        create_tables(&tx).unwrap();
        tx.commit().unwrap();
        (db, Mutex::default())
    }

    #[test]
    fn rounds_wait_in_the_journal_read_as_written_and_a_fold_moves_them_into_the_rows() {
        let dir = tempfile::tempdir().unwrap();
        let (db, j) = open(dir.path());
        let (a, b) = (key("a"), key("b"));
        for i in 0..FOLD_EVERY - 1 {
            write(&db, &j, &round(&a, &[T0, T0 + 1_000], 1)).unwrap();
            write(&db, &j, &round(&b, &[T0 + i as i64 * 1_000], 2)).unwrap();
        }
        // 14 rounds: folded once, at the 8th.
        assert_eq!(lock(&j).folds, 1);
        assert_eq!(lock(&j).records, 6);
        assert_eq!(table_len(&db, JOURNAL), 6);
        let got = read(&db, &j, &[range(&a), range(&b)]).unwrap();
        let b_want: Vec<(i64, i64)> = (0..7).map(|i| (T0 + i * 1_000, 2)).collect();
        assert_eq!(
            totals(&got),
            vec![vec![(T0, 7), (T0 + 1_000, 7)], b_want.clone()]
        );
        fold_all(&db, &j).unwrap();
        assert_eq!(table_len(&db, JOURNAL), 0);
        assert_eq!(lock(&j).waiting.adds_len(), 0);
        // The rows hold it all now: read with nothing waiting, the same.
        let got = read(&db, &Mutex::default(), &[range(&a), range(&b)]).unwrap();
        assert_eq!(totals(&got), vec![vec![(T0, 7), (T0 + 1_000, 7)], b_want]);
    }

    #[test]
    fn a_crash_loses_nothing_the_journal_holds() {
        let dir = tempfile::tempdir().unwrap();
        let a = key("a");
        {
            let store = crate::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
            for _ in 0..3 {
                journal_write(&store, &round(&a, &[T0, T0 + 1_000], 5));
            }
            // Dropped without `flush`, as a crash would leave it.
            assert_eq!(table_len(&store.db, JOURNAL), 3);
        }
        let store = crate::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(table_len(&store.db, JOURNAL), 0);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let got = rt.block_on(store.read(&[range(&a)])).unwrap();
        assert_eq!(totals(&got), vec![vec![(T0, 15), (T0 + 1_000, 15)]]);
    }

    fn journal_write(store: &crate::store::embedded::EmbeddedStore, inc: &Increments) {
        write(&store.db, &store.counters.journal, inc).unwrap();
    }

    #[test]
    fn strict_mode_reads_what_waits_in_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let (db, j) = open(dir.path());
        let a = key("a");
        write(&db, &j, &round(&a, &[T0], 3)).unwrap();
        write(&db, &j, &round(&a, &[T0], 4)).unwrap();
        let got =
            increment_and_read(&db, &j, &round(&a, &[T0, T0 + 1_000], 1), &[range(&a)]).unwrap();
        assert_eq!(totals(&got), vec![vec![(T0, 8), (T0 + 1_000, 1)]]);
        // The strict increment went to the row; the rounds still wait in the journal.
        assert_eq!(lock(&j).records, 2);
        let rows = read(&db, &Mutex::default(), &[range(&a)]).unwrap();
        assert_eq!(totals(&rows), vec![vec![(T0, 1), (T0 + 1_000, 1)]]);
    }

    #[test]
    fn a_read_during_folds_never_sees_a_count_go_back() {
        let dir = tempfile::tempdir().unwrap();
        let (db, j) = open(dir.path());
        let (db, j) = (Arc::new(db), Arc::new(j));
        let a = key("a");
        let rounds = 10 * FOLD_EVERY as i64;
        let writer = {
            let (db, j, a) = (db.clone(), j.clone(), a.clone());
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    write(&db, &j, &round(&a, &[T0], 1)).unwrap();
                }
            })
        };
        let mut last = 0;
        let mut reads = 0;
        loop {
            let done = writer.is_finished();
            let got = read(&db, &j, &[range(&a)]).unwrap();
            let n = got[0].first().map_or(0, |b| b.total);
            assert!(n >= last, "a read went from {last} to {n}");
            assert!(n <= rounds);
            last = n;
            reads += 1;
            if done {
                break;
            }
        }
        writer.join().unwrap();
        assert_eq!(last, rounds);
        assert!(reads > 1);
    }

    #[test]
    fn a_failed_fold_writes_nothing_and_keeps_what_waits() {
        let dir = tempfile::tempdir().unwrap();
        let (db, j) = open(dir.path());
        let a = key("a");
        for _ in 0..FOLD_EVERY - 1 {
            write(&db, &j, &round(&a, &[T0], 1)).unwrap();
        }
        // The round that folds carries a row key without a grain: the fold fails midway.
        let mut bad = round(&a, &[T0], 100);
        bad.push(b"x", &[(T0, 1)]);
        assert!(write(&db, &j, &bad).is_err());
        assert_eq!(lock(&j).records, FOLD_EVERY - 1);
        assert_eq!(table_len(&db, JOURNAL), FOLD_EVERY - 1);
        let rows = read(&db, &Mutex::default(), &[range(&a)]).unwrap();
        assert_eq!(totals(&rows), vec![vec![]]);
        let got = read(&db, &j, &[range(&a)]).unwrap();
        assert_eq!(totals(&got), vec![vec![(T0, FOLD_EVERY as i64 - 1)]]);
        // The next round folds it all.
        write(&db, &j, &round(&a, &[T0], 1)).unwrap();
        assert_eq!((lock(&j).folds, table_len(&db, JOURNAL)), (1, 0));
        let rows = read(&db, &Mutex::default(), &[range(&a)]).unwrap();
        assert_eq!(totals(&rows), vec![vec![(T0, FOLD_EVERY as i64)]]);
    }

    #[test]
    fn an_unreadable_record_is_left_out_at_opening_and_the_others_are_folded() {
        let dir = tempfile::tempdir().unwrap();
        let a = key("a");
        {
            let store = crate::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
            journal_write(&store, &round(&a, &[T0], 2));
            let tx = store.db.begin_write().unwrap();
            // A key's length beyond the record's end.
            tx.open_table(JOURNAL)
                .unwrap()
                .insert(u64::MAX, [0x05u8, b'x'].as_slice())
                .unwrap();
            tx.commit().unwrap();
            journal_write(&store, &round(&a, &[T0], 3));
        }
        let store = crate::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(table_len(&store.db, JOURNAL), 0);
        let rows = read(&store.db, &Mutex::default(), &[range(&a)]).unwrap();
        assert_eq!(totals(&rows), vec![vec![(T0, 5)]]);
    }

    #[test]
    fn the_janitor_folds_first_so_what_waits_falls_under_its_rule() {
        let dir = tempfile::tempdir().unwrap();
        let (db, j) = open(dir.path());
        let a = key("a");
        let retention = Grain::Fixed(1_000).retention_ms();
        write(&db, &j, &round(&a, &[T0], 3)).unwrap();
        write(&db, &j, &round(&a, &[T0 + 1_000], 4)).unwrap();
        let whole = CounterRange {
            key: a.clone(),
            from: T0,
            to: T0 + 1_000,
        };
        assert_eq!(
            read(&db, &j, std::slice::from_ref(&whole)).unwrap()[0].len(),
            2
        );
        // Both past retention (and the row's expiry slot, a minute at most, passed too): the
        // sweep finds what only the journal held.
        let now = T0 + 1_000 + retention + EXPIRY_SLOT_MS;
        assert_eq!(delete_expired(&db, &j, now, 100).unwrap(), 2);
        assert_eq!((lock(&j).records, table_len(&db, JOURNAL)), (0, 0));
        assert_eq!(table_len(&db, rows::COUNTER_ROWS), 0);
        assert_eq!(read(&db, &j, &[whole]).unwrap(), vec![vec![]]);
    }
}
