//! Stores written by earlier releases: a row per bucket in `counters`, with an index in
//! `expiry`. They are folded into rows per counter (`rows`) when the store is opened, in one
//! transaction, once: an earlier release opening the store afterwards sees no counters (it starts
//! them from 0).

use redb::{ReadableTable, TableDefinition, TableHandle, WriteTransaction};

use super::rows::{add_to_row, row_grain, Scratch, COUNTER_EXPIRY, COUNTER_ROWS};
use super::{dec_i64, err};
use crate::store::StoreResult;

/// The layout of earlier releases: a row per bucket and its expiry index.
const LEGACY_COUNTERS: TableDefinition<&[u8], i64> = TableDefinition::new("counters");
const LEGACY_EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("expiry");

/// Folds a store written by an earlier release (a row per bucket) into rows per counter, and
/// deletes the old tables. Returns how many buckets it moved.
pub(super) fn upgrade(tx: &WriteTransaction) -> StoreResult<u64> {
    let legacy = tx
        .list_tables()
        .map_err(err)?
        .any(|t| t.name() == LEGACY_COUNTERS.name());
    if !legacy {
        return Ok(0);
    }
    tracing::info!("embedded store: moving counters to one row per counter (once)");
    let mut moved = 0u64;
    let mut skipped = 0u64;
    {
        let old = tx.open_table(LEGACY_COUNTERS).map_err(err)?;
        let mut rows = tx.open_table(COUNTER_ROWS).map_err(err)?;
        let mut expiry = tx.open_table(COUNTER_EXPIRY).map_err(err)?;
        let mut scratch = Scratch::default();
        let mut adds: Vec<(i64, i64)> = Vec::new();
        // Old keys sort by (counter, start): a counter's buckets come one after another, in
        // order, and are added to its row (merged with one a later release may have written
        // already) when the next counter begins.
        let mut current: Vec<u8> = Vec::new();
        for item in old.iter().map_err(err)? {
            let (k, v) = item.map_err(err)?;
            let k = k.value();
            if k.len() < 16 || row_grain(&k[..k.len() - 8]).is_none() {
                skipped += 1;
                continue;
            }
            let (counter, start) = k.split_at(k.len() - 8);
            if counter != current.as_slice() {
                if !adds.is_empty() {
                    add_to_row(&mut rows, &mut expiry, &current, &adds, &mut scratch)?;
                    adds.clear();
                }
                current = counter.to_vec();
            }
            adds.push((dec_i64(start), v.value()));
            moved += 1;
        }
        if !adds.is_empty() {
            add_to_row(&mut rows, &mut expiry, &current, &adds, &mut scratch)?;
        }
    }
    if skipped > 0 {
        tracing::warn!(
            rows = skipped,
            "embedded store: unreadable counter rows of the old layout were left out"
        );
    }
    tx.delete_table(LEGACY_COUNTERS).map_err(err)?;
    tx.delete_table(LEGACY_EXPIRY).map_err(err)?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use redb::ReadableTableMetadata;

    use super::*;
    use crate::domain::Grain;
    use crate::store::embedded::increments::Increments;
    use crate::store::embedded::rows::tests::key;
    use crate::store::embedded::rows::{create_tables, delete_expired, row_key};
    use crate::store::embedded::{enc_i64, EmbeddedStore, DB_FILE};
    use crate::store::{BucketTotal, CounterKey, CounterRange, Delta};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn a_store_of_an_earlier_release_is_folded_into_rows_per_counter() {
        use crate::store::CounterStore;
        let dir = tempfile::tempdir().unwrap();
        let g = Grain::Fixed(1_000);
        let (a, b) = (key("a", g), key("b", Grain::Month));
        let t0 = 1_700_000_000_000;
        {
            // The old layout, as the earlier release wrote it.
            let db = redb::Database::create(dir.path().join(DB_FILE)).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut old = tx.open_table(LEGACY_COUNTERS).unwrap();
                let mut idx = tx.open_table(LEGACY_EXPIRY).unwrap();
                let rows = [
                    (&a, t0, 3),
                    (&a, t0 + 1_000, 4),
                    (&b, t0, 9),
                    (&a, t0 + 2_000, -1),
                ];
                for (k, start, v) in rows {
                    let mut bk = row_key(k);
                    bk.extend_from_slice(&enc_i64(start));
                    old.insert(bk.as_slice(), v).unwrap();
                    idx.insert(bk.as_slice(), ()).unwrap();
                }
            }
            tx.commit().unwrap();
        }
        {
            // A row of the new layout already there (written by this release, then the
            // store went back to an older one): the old buckets are added to it.
            let db = redb::Database::create(dir.path().join(DB_FILE)).unwrap();
            let tx = db.begin_write().unwrap();
            create_tables(&tx).unwrap();
            Increments::of(&[Delta {
                key: a.clone(),
                start: t0 + 1_000,
                delta: 10,
            }])
            .apply(&tx)
            .unwrap();
            tx.commit().unwrap();
        }
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let range = |k: &CounterKey| CounterRange {
            key: k.clone(),
            from: t0 - 10_000,
            to: t0 + 10_000,
        };
        let got = runtime()
            .block_on(store.read(&[range(&a), range(&b)]))
            .unwrap();
        let totals =
            |v: &Vec<BucketTotal>| v.iter().map(|b| (b.start, b.total)).collect::<Vec<_>>();
        assert_eq!(
            totals(&got[0]),
            vec![(t0, 3), (t0 + 1_000, 14), (t0 + 2_000, -1)]
        );
        assert_eq!(totals(&got[1]), vec![(t0, 9)]);
        let tx = store.db.begin_write().unwrap();
        assert!(!tx
            .list_tables()
            .unwrap()
            .any(|t| t.name() == LEGACY_COUNTERS.name() || t.name() == LEGACY_EXPIRY.name()));
        // And the janitor knows the moved rows (one index entry each): once due, both go.
        assert_eq!(tx.open_table(COUNTER_EXPIRY).unwrap().len().unwrap(), 2);
        assert_eq!(delete_expired(&tx, t0 + 86_400_000 * 70, 100).unwrap(), 4);
        assert_eq!(tx.open_table(COUNTER_ROWS).unwrap().len().unwrap(), 0);
    }
}
