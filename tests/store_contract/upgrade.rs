//! An upgrade from the counter layout of migration 0001 (`counters`, a partition per counter,
//! epoch and shard) to that of 0006 (`client_counters`, a partition per client): counts the old
//! release wrote are still read, added to the new ones, and expire as before. Scylla only.

use super::*;

/// The old release's increment, as it wrote it.
const OLD_INCREMENT: &str = "UPDATE counters SET hits = hits + ? WHERE tenant = ? AND \
     subject = ? AND limit_id = ? AND grain = ? AND epoch = ? AND shard = ? AND bucket_start = ?";

/// Writes `n` hits of `k`'s bucket at `start` the way the old release did, from `shard`, and
/// records the shard as used (as its lease did).
async fn old_release_wrote(nodes: &[String], ks: &str, k: &CounterKey, start: i64, n: i64) {
    let s = session_on(nodes)
        .use_keyspace(ks, false)
        .build()
        .await
        .unwrap();
    let Grain::Fixed(g) = k.grain else {
        panic!("a fixed grain, for the epoch arithmetic")
    };
    let epoch = start.div_euclid(64 * g);
    let shard = 0i16;
    s.query_unpaged(
        OLD_INCREMENT,
        (
            ::scylla::value::Counter(n),
            &*k.tenant,
            &*k.subject,
            &*k.limit,
            g,
            epoch,
            shard,
            start,
        ),
    )
    .await
    .unwrap();
    s.query_unpaged(
        "INSERT INTO shards_used (part, shard) VALUES (0, ?)",
        (shard,),
    )
    .await
    .unwrap();
}

pub async fn counts_of_the_old_layout_survive_the_upgrade(nodes: &[String], opts: &ScyllaOptions) {
    let grain = Grain::Fixed(1_000);
    let k = key("upgraded", "k1", "per-min", grain);
    let other = key("upgraded", "k1", "per-hour", Grain::Fixed(60_000));
    let now = Utc::now().timestamp_millis();
    let start = grain.bucket_start(now);
    old_release_wrote(nodes, &opts.keyspace, &k, start, 5).await;
    old_release_wrote(
        nodes,
        &opts.keyspace,
        &other,
        Grain::Fixed(60_000).bucket_start(now),
        2,
    )
    .await;

    // The new release starts on the same keyspace.
    let store = ScyllaStore::connect(opts.clone()).await.unwrap();
    join(&store, "new-release").await;
    let both = [range(&k, start, start), range(&other, now - 3_600_000, now)];
    let got = store.read(&both).await.unwrap();
    assert_eq!(totals(&got[0]), vec![(start, 5)], "the old count is read");
    assert_eq!(got[1].iter().map(|b| b.total).sum::<i64>(), 2);
    store.increment(&[delta(&k, start, 3)]).await.unwrap();
    let got = store.read(&both[..1]).await.unwrap();
    assert_eq!(totals(&got[0]), vec![(start, 8)], "old and new add up");
    // A second instance, started later, reads the same (the cut-over is recorded once).
    let later = ScyllaStore::connect(opts.clone()).await.unwrap();
    join(&later, "later").await;
    assert_eq!(
        totals(&later.read(&both[..1]).await.unwrap()[0]),
        vec![(start, 8)]
    );

    // The janitor expires the old partitions as before, and the new rows. (A deleted counter
    // is never written again: only buckets the clock has not passed are.)
    let far = now + 86_400_000;
    for _ in 0..3 {
        while store.delete_expired(far, 1_000).await.unwrap() > 0 {}
    }
    let got = store.read(&[range(&k, start, start)]).await.unwrap();
    assert!(got[0].is_empty(), "expired everywhere: {got:?}");
    let fresh = start + 600_000;
    store.increment(&[delta(&k, fresh, 1)]).await.unwrap();
    let got = store.read(&[range(&k, start, fresh)]).await.unwrap();
    assert_eq!(totals(&got[0]), vec![(fresh, 1)]);
}
