//! Reading totals back on a slow store: the counters near a limit first, the rest paced over
//! the rounds, and a read that covers its own range alone.

use super::*;

/// On a store too slow to read every counter in a round, a round reads the counters near a
/// limit whole, then at least one call of the others and no more once nine tenths of the
/// interval since its tick have passed; the rest wait, oldest first, for the next rounds.
#[tokio::test]
async fn a_slow_store_reads_the_counters_near_a_limit_first_and_paces_the_rest() {
    // The default interval: 250 ms.
    let r = rig();
    let range = |subject: String| CounterRange {
        key: CounterKey {
            tenant: "acme".into(),
            subject: subject.as_str().into(),
            limit: "w".into(),
            grain: quotad::domain::Grain::Fixed(1_000),
        },
        from: T0 - 10_000,
        to: T0,
    };
    // Two near a limit, then 200 far from theirs.
    let ranges: Vec<CounterRange> = (0..202).map(|i| range(format!("c{i}"))).collect();
    r.faulty.set(Fault::Slow); // every call takes 200 ms
    let reads = || r.faulty.reads.load(std::sync::atomic::Ordering::Relaxed);
    let before = reads();
    r.syncer
        .read_back_paced(&ranges, 2, std::time::Instant::now())
        .await;
    // The two near a limit in one call, then one call of 64 far ones: the interval is over.
    assert_eq!(reads() - before, 2);
    assert_eq!(metric(&r, "quotad_sync_read_backlog"), 136.0);
    // The next round, begun 100 ms before: one call, of the oldest of the backlog before its
    // own, a counter in both once (136 waiting, 12 of them read again this round, 10 new).
    let again: Vec<CounterRange> = (190..212).map(|i| range(format!("c{i}"))).collect();
    let tick = std::time::Instant::now() - Duration::from_millis(100);
    r.syncer.read_back_paced(&again, 0, tick).await;
    assert_eq!(
        metric(&r, "quotad_sync_read_backlog"),
        (136 + 10 - 64) as f64
    );
    // On a store that answers at once, a round reads everything that waits.
    r.faulty.set(Fault::Healthy);
    r.syncer
        .read_back_paced(&[], 0, std::time::Instant::now())
        .await;
    assert_eq!(metric(&r, "quotad_sync_read_backlog"), 0.0);
}

/// A read back of a range taken rounds ago (a slow store's backlog) covers its own buckets
/// alone: the hits of a newer bucket, written since, stay counted.
#[tokio::test]
async fn an_old_range_read_back_leaves_newer_buckets_counted() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "w", "max": 100, "window": "10s"}]}));
    let (t, c) = ids("acme", "k1");
    for _ in 0..3 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    r.syncer.write().await.unwrap();
    let grain = p.limits[0].kind.grain();
    let old = CounterRange {
        key: CounterKey {
            tenant: "acme".into(),
            subject: "k1".into(),
            limit: "w".into(),
            grain,
        },
        from: T0 - 11_000,
        to: grain.bucket_start(T0),
    };
    r.syncer.read_back(std::slice::from_ref(&old)).await;
    // Two buckets later, four more, written; then the old range comes back from the store.
    r.clock.advance(2_000);
    for _ in 0..4 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    r.syncer.write().await.unwrap();
    assert!(
        old.to < r.clock.now_ms() - 1_000,
        "the range ends before the new bucket"
    );
    r.syncer.read_back(&[old]).await;
    let d = check(&r, &p, &t, &c, 0).await;
    assert_eq!(d.binding.unwrap().remaining, 100 - 7);
}
