//! The sync hooks and eviction: every admitted hit is written once, nothing unwritten leaves
//! memory, and what the store counts reaches memory.

use super::*;

#[tokio::test]
async fn sync_writes_every_admitted_hit_exactly_once() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [
        {"id": "d", "max": 1000, "period": "day"},
        {"id": "t", "max": 1000, "period": "day", "scope": "tenant"}]}));
    let (t, c) = ids("acme", "k1");
    for _ in 0..7 {
        check(&r, &p, &t, &c, 2).await;
    }
    let round = r.syncer.round().await.unwrap();
    assert_eq!(round.written_hits, 28, "7 x 2 on each of two counters");
    assert_eq!(round.pending_after, 0);
    // A second round writes nothing more.
    assert_eq!(r.syncer.round().await.unwrap().written_hits, 0);
    let day = p.limits[0].kind.grain();
    assert_eq!(stored(&r, "acme", "k1", "d", day).await, 14);
    assert_eq!(stored(&r, "acme", "*", "t", day).await, 14);
    // The local estimate did not double count: 14 used, 986 left.
    let d = check(&r, &p, &t, &c, 0).await;
    assert_eq!(d.binding.unwrap().remaining, 986);
}

/// Client ids of up to 22 bytes are held inside their entry's key, longer ones shared
/// (`key::Subject`): both are counted, written under their own name and told apart, also when
/// one is a prefix of the other.
#[tokio::test]
async fn short_and_long_client_ids_are_written_under_their_own_names() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let short = "a".repeat(22);
    let long = "a".repeat(23);
    let longer = format!("{long}-and-then-some-more");
    for (n, c) in [(3, &short), (4, &long), (5, &longer)] {
        let (t, c) = ids("acme", c);
        for _ in 0..n {
            assert!(check(&r, &p, &t, &c, 1).await.allowed);
        }
    }
    let round = r.syncer.round().await.unwrap();
    assert_eq!(round.written_hits, 12);
    let day = p.limits[0].kind.grain();
    assert_eq!(stored(&r, "acme", &short, "d", day).await, 3);
    assert_eq!(stored(&r, "acme", &long, "d", day).await, 4);
    assert_eq!(stored(&r, "acme", &longer, "d", day).await, 5);
    // Memory still tells them apart: each has its own count left.
    for (n, c) in [(3, &short), (4, &long), (5, &longer)] {
        let (t, c) = ids("acme", c);
        let d = check(&r, &p, &t, &c, 0).await;
        assert_eq!(d.binding.unwrap().remaining, 1000 - n, "{c:?}");
    }
}

#[tokio::test]
async fn hits_admitted_while_a_sync_is_in_flight_stay_pending() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let (t, c) = ids("acme", "k1");
    check(&r, &p, &t, &c, 3).await;
    let batch = r.limiter.collect(r.clock.now_ms(), true, true);
    check(&r, &p, &t, &c, 4).await; // admitted between snapshot and write
    r.store.increment(&batch.deltas).await.unwrap();
    assert_eq!(r.limiter.pending_hits(), 4);
    r.syncer.round().await.unwrap();
    assert_eq!(r.limiter.pending_hits(), 0);
    assert_eq!(
        stored(&r, "acme", "k1", "d", p.limits[0].kind.grain()).await,
        7
    );
}

#[tokio::test]
async fn while_the_store_is_down_hits_wait_and_are_written_when_it_returns() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let (t, c) = ids("acme", "k1");
    check(&r, &p, &t, &c, 1).await;
    r.faulty.set(Fault::Failing);
    for _ in 0..5 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    assert!(r.syncer.round().await.is_err());
    assert_eq!(r.limiter.pending_hits(), 6);
    r.faulty.set(Fault::Healthy);
    r.syncer.round().await.unwrap();
    assert_eq!(r.limiter.pending_hits(), 0);
    assert_eq!(
        stored(&r, "acme", "k1", "d", p.limits[0].kind.grain()).await,
        6
    );
}

/// A store slower than a round's writes need: what a round cannot send within
/// `sync.timeout` waits for the next round, counted as deferred, never as uncertain; only the
/// call cut off in flight is uncertain.
#[tokio::test]
async fn what_a_round_cannot_send_in_its_time_waits_for_the_next() {
    let r = rig_syncing(
        LimiterConfig {
            shards: 8,
            idle_ms: 600_000,
            store_timeout: Duration::from_secs(10),
            ..LimiterConfig::default()
        },
        SyncConfig {
            timeout: Duration::from_millis(500),
            ..SyncConfig::default()
        },
    );
    // Three counters a client: 6,000 clients are five calls of increments (4,096 a call).
    let p = policy(serde_json::json!({"limits": [
        {"id": "h", "max": 1000, "period": "hour"},
        {"id": "d", "max": 1000, "period": "day"},
        {"id": "m", "max": 1000, "period": "month"}]}));
    const CLIENTS: usize = 6_000;
    for i in 0..CLIENTS {
        let (t, c) = ids("acme", &format!("k{i}"));
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    // Each call takes over 200 ms: the first lands, at most three start within the 500 ms,
    // the one in flight at the deadline is cut off (its outcome unknown), the rest wait.
    r.faulty.set(Fault::Slow);
    let round = r.syncer.round().await.unwrap();
    let all = (3 * CLIENTS) as f64;
    let uncertain = metric(&r, "quotad_store_uncertain_hits_total");
    let deferred = metric(&r, "quotad_sync_deferred_hits_total");
    assert!(deferred > 0.0, "{deferred}");
    assert!(
        uncertain + deferred < all,
        "{uncertain} + {deferred} of {all}"
    );
    assert_eq!(round.pending_after as f64, deferred);
    assert_eq!(metric(&r, "quotad_sync_pending_hits"), deferred);
    // The next round, on a healthy store, writes what waited, and nothing twice.
    r.faulty.set(Fault::Healthy);
    let round = r.syncer.round().await.unwrap();
    assert_eq!(
        (round.written_hits as f64, round.pending_after),
        (deferred, 0)
    );
    let mut written = 0;
    for i in 0..CLIENTS {
        for (id, k) in [("h", 0), ("d", 1), ("m", 2)] {
            let grain = p.limits[k].kind.grain();
            written += stored(&r, "acme", &format!("k{i}"), id, grain).await;
        }
    }
    // The call cut off may have landed after all (its outcome was unknown), never twice.
    assert!(
        (all - uncertain..=all).contains(&(written as f64)),
        "{written} of {all}, {uncertain} uncertain"
    );
}

/// A round's pass takes the pending hits as written before the write returns
/// (`Limiter::collect`): a refused write must give them back whole, leave the estimate as it
/// was, and keep their entry in memory however idle, round after round.
#[tokio::test]
async fn a_refused_write_gives_the_hits_back_and_keeps_their_entry() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 10, "period": "day"}]}));
    let (t, c) = ids("acme", "k1");
    for _ in 0..3 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    r.faulty.set(Fault::Failing);
    for _ in 0..3 {
        // Idle far past `idle_ms`: only its unwritten hits keep the entry.
        r.clock.advance(120_000);
        assert!(r.syncer.round().await.is_err());
        assert_eq!(r.limiter.pending_hits(), 3);
        assert_eq!(metric(&r, "quotad_sync_pending_hits"), 3.0);
        assert_eq!(r.limiter.evict(r.clock.now_ms()), (1, 3));
    }
    // Decided in memory still, with the 3 hits counted once: 7 left, not 4 or 10.
    r.faulty.set(Fault::Healthy);
    let d = check(&r, &p, &t, &c, 0).await;
    assert_eq!(d.binding.unwrap().remaining, 7);
    let round = r.syncer.round().await.unwrap();
    assert_eq!((round.written_hits, round.pending_after), (3, 0));
    assert_eq!(metric(&r, "quotad_sync_pending_hits"), 0.0);
    let day = p.limits[0].kind.grain();
    assert_eq!(stored(&r, "acme", "k1", "d", day).await, 3);
    assert_eq!(check(&r, &p, &t, &c, 0).await.binding.unwrap().remaining, 7);
    // Written and idle: the next round's pass lets it go.
    r.clock.advance(120_000);
    r.syncer.round().await.unwrap();
    assert_eq!(r.limiter.evict(r.clock.now_ms()), (0, 0));
}

#[tokio::test]
async fn idle_keys_leave_memory_and_come_back_from_the_store() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 5, "period": "day"}]}));
    let (t, c) = ids("acme", "k1");
    assert!(check(&r, &p, &t, &c, 5).await.allowed);
    r.syncer.round().await.unwrap();
    r.clock.advance(61_000);
    r.syncer.round().await.unwrap();
    assert_eq!(r.limiter.evict(r.clock.now_ms()).0, 0, "evicted");
    assert!(
        !check(&r, &p, &t, &c, 1).await.allowed,
        "re-read, not reset to zero"
    );
}

#[tokio::test]
async fn a_client_slower_than_its_window_is_decided_in_memory() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "s", "max": 5, "window": "1s"}]}));
    let (t, c) = ids("acme", "k1");
    check(&r, &p, &t, &c, 1).await;
    r.syncer.round().await.unwrap();
    for _ in 0..3 {
        r.clock.advance(1_200);
        r.syncer.round().await.unwrap();
        // With the store hanging, a check that needed it would wait for the deadline and be
        // decided by on_store_failure; a check from memory is not.
        r.faulty.set(Fault::Hanging);
        let d = check(&r, &p, &t, &c, 1).await;
        r.faulty.set(Fault::Healthy);
        assert!(d.allowed);
        assert_eq!(d.store_failure, None, "the check went to the store");
    }
}

#[tokio::test]
async fn hits_the_store_counts_directly_reach_the_counters_held_in_memory_at_once() {
    let r = capped(1_000, 1);
    let p = policy(serde_json::json!({"limits": [
        {"id": "c", "max": 10, "period": "day"},
        {"id": "t", "max": 3, "period": "day", "scope": "tenant"}]}));
    let (t, k1) = ids("acme", "k1");
    assert!(
        check(&r, &p, &t, &k1, 1).await.allowed,
        "k1 and the tenant held in memory"
    );
    r.syncer.round().await.unwrap();
    // k2 is beyond the tenant's client cap: the store counts its hits, tenant counter included.
    let (_, k2) = ids("acme", "k2");
    assert!(check(&r, &p, &t, &k2, 1).await.allowed);
    assert!(check(&r, &p, &t, &k2, 1).await.allowed);
    // Alone, this instance reads counters back only every few rounds; the tenant counter in
    // memory must know of k2's hits without one.
    let d = check(&r, &p, &t, &k1, 1).await;
    assert!(!d.allowed, "the tenant's 3 are used: {d:?}");
    assert_eq!(d.binding.unwrap().limit_id.as_str(), "t");
}

#[tokio::test]
async fn a_large_usage_history_is_written_in_bounded_calls_and_whole() {
    use quotad::history::Answer;
    use quotad::store::history::Step;
    let r = rig();
    // More distinct clients than one history call carries.
    let n = 16_384 + 100;
    let tenant: Arc<str> = "acme".into();
    for i in 0..n {
        let client: Arc<str> = format!("k{i}").into();
        r.limiter
            .history()
            .record(&tenant, &client, T0, Answer::Admitted { cost: 2 });
    }
    r.syncer.round().await.unwrap();
    assert_eq!(r.limiter.history().rows(), 0, "every row written");
    let text = r.metrics.render();
    assert!(
        text.lines()
            .any(|l| l == r#"quotad_store_operations_total{op="add_usage",outcome="ok"} 2"#),
        "two calls: {}",
        text.lines()
            .filter(|l| l.contains("add_usage"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let points = r
        .store
        .usage_points("acme", None, Step::Hour, T0, T0 + 1)
        .await
        .unwrap();
    assert_eq!(points.len(), 1);
    assert_eq!(points[0].counts.admitted, n as u64);
    assert_eq!(points[0].counts.cost, 2 * n as u64);
}

/// The usage-history points of one client (or the tenant, `None`) in the hour of `at`:
/// (admitted, cost, denied).
async fn hour_point(r: &Rig, client: Option<&str>, at: i64) -> (u64, u64, u64) {
    use quotad::store::history::{Step, HOUR_MS};
    let hour = at - at.rem_euclid(HOUR_MS);
    let points = r
        .store
        .usage_points("acme", client, Step::Hour, hour, hour + 1)
        .await
        .unwrap();
    points
        .iter()
        .map(|p| (p.counts.admitted, p.counts.cost, p.counts.denied))
        .fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
}

#[tokio::test]
async fn admitted_checks_summed_in_entries_reach_the_history_with_the_denials() {
    use quotad::store::history::HOUR_MS;
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "m", "max": 5, "window": "1m"}]}));
    let (t, c) = ids("acme", "k1");
    // Near the end of an hour: some checks in it, then some in the next.
    r.clock.set(T0 + HOUR_MS - 2_000);
    for _ in 0..3 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    // Admitted checks on an entry in memory take no history row; a denial does.
    assert_eq!(r.limiter.history().rows(), 0);
    assert_eq!(r.limiter.answers_waiting(), 3);
    r.clock.set(T0 + HOUR_MS + 1);
    assert!(check(&r, &p, &t, &c, 2).await.allowed);
    // The hour moved: the entry handed its earlier hour to the rows.
    assert_eq!(r.limiter.history().rows(), 1);
    assert_eq!(r.limiter.answers_waiting(), 1);
    assert!(
        !check(&r, &p, &t, &c, 1).await.allowed,
        "5 used in the window"
    );
    assert_eq!(r.limiter.history().rows(), 2);

    // A refused write keeps everything for the next one.
    r.faulty.set(Fault::Failing);
    assert!(r.syncer.round().await.is_err());
    r.faulty.set(Fault::Healthy);
    r.syncer.round().await.unwrap();
    assert_eq!(
        (r.limiter.history().rows(), r.limiter.answers_waiting()),
        (0, 0)
    );
    assert_eq!(hour_point(&r, Some("k1"), T0).await, (3, 3, 0));
    assert_eq!(hour_point(&r, Some("k1"), T0 + HOUR_MS).await, (1, 2, 1));
    assert_eq!(hour_point(&r, None, T0 + HOUR_MS).await, (1, 2, 1));

    // An entry that leaves memory hands its sum to the rows first.
    r.clock.set(T0 + HOUR_MS + 120_000);
    let k2 = ClientId::parse("k2").unwrap();
    assert!(check(&r, &p, &t, &k2, 4).await.allowed);
    r.syncer.round().await.unwrap(); // writes the hits (and this sum)
    assert!(check(&r, &p, &t, &k2, 1).await.allowed);
    r.clock.set(T0 + HOUR_MS + 120_000 + 61_000);
    // Hits written, idle past idle_ms: evicted, with one admitted check not yet taken.
    let b = r.limiter.collect(r.clock.now_ms(), false, true);
    r.store.increment(&b.deltas).await.unwrap();
    r.limiter.evict(r.clock.now_ms());
    assert_eq!(r.limiter.answers_waiting(), 0);
    assert_eq!(r.limiter.history().rows(), 1, "handed over on eviction");
    r.syncer.round().await.unwrap();
    assert_eq!(hour_point(&r, Some("k2"), T0 + HOUR_MS).await, (2, 5, 0));
}

/// A usage read while a round's write is under way counts the hits being written: they have
/// left pending and are not in the store yet, so the read waits for the write and reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_counts_the_hits_a_write_under_way_carries() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "h", "max": 5, "period": "hour"}]}));
    let (t, c) = ids("acme", "k1");
    for _ in 0..3 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    let batch = r.limiter.collect(r.clock.now_ms(), false, true);
    assert_eq!((batch.hits(), r.limiter.pending_hits()), (3, 0));
    let store = r.store.clone();
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store.increment(&batch.deltas).await.unwrap();
        // The write is done: the batch, and its mark of a write under way, go.
        drop(batch);
    });
    let u = r.limiter.usage(&p, &t, &c, None).await.unwrap();
    assert_eq!((u[0].count, u[0].remaining), (3, 2), "{u:?}");
    writer.await.unwrap();
    // Between writes, the same.
    let u = r.limiter.usage(&p, &t, &c, None).await.unwrap();
    assert_eq!(u[0].count, 3);
}

/// A reset while a round's write of the client's hits is under way waits for it: the read
/// behind the reset sees those hits and cancels them, instead of their landing after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_cancels_the_hits_a_write_under_way_carries() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "h", "max": 5, "period": "hour"}]}));
    let (t, c) = ids("acme", "k1");
    for _ in 0..2 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    let batch = r.limiter.collect(r.clock.now_ms(), false, true);
    let store = r.store.clone();
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store.increment(&batch.deltas).await.unwrap();
        drop(batch);
    });
    let before = r.limiter.reset(&p, &t, &c, None).await.unwrap();
    writer.await.unwrap();
    assert_eq!(before[0].1, 2, "the reset saw the hits being written");
    let hour = p.limits[0].kind.grain();
    assert_eq!(stored(&r, "acme", "k1", "h", hour).await, 0);
    let u = r.limiter.usage(&p, &t, &c, None).await.unwrap();
    assert_eq!(u[0].count, 0, "{u:?}");
}

/// A cluster with a node down refuses some partitions and takes the others: what it took is
/// written once, what it refused stays pending (the store is marked degraded meanwhile) and is
/// written once when it takes it again.
#[tokio::test]
async fn hits_a_store_refuses_for_some_clients_wait_while_the_others_are_written() {
    use quotad::store::faulty::PartFault;
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let day = p.limits[0].kind.grain();
    for c in ["k1", "k2", "k3"] {
        let (t, c) = ids("acme", c);
        for _ in 0..3 {
            assert!(check(&r, &p, &t, &c, 1).await.allowed);
        }
    }
    r.faulty.fail_part("k2", Some(PartFault::Refused));
    let round = r.syncer.round().await.unwrap();
    assert_eq!(round.written_hits, 6, "k1 and k3");
    assert_eq!(round.pending_after, 3, "k2's, refused unsent");
    assert!(r.metrics.store_degraded());
    assert_eq!(metric(&r, "quotad_store_uncertain_hits_total"), 0.0);
    // Refused again, whole (it is all the round has): still pending, nothing written twice.
    assert!(r.syncer.round().await.is_err());
    assert_eq!(r.limiter.pending_hits(), 3);
    r.faulty.fail_part("k2", None);
    let round = r.syncer.round().await.unwrap();
    assert_eq!((round.written_hits, round.pending_after), (3, 0));
    assert!(!r.metrics.store_degraded());
    for c in ["k1", "k2", "k3"] {
        assert_eq!(stored(&r, "acme", c, "d", day).await, 3, "{c}");
        let (t, c) = ids("acme", c);
        assert_eq!(
            check(&r, &p, &t, &c, 0).await.binding.unwrap().remaining,
            997
        );
    }
}

/// A read back that fails for some clients keeps what it read of the others; the clients
/// it missed keep their last totals and are read at the next round.
#[tokio::test]
async fn a_read_back_that_fails_in_part_keeps_what_it_got() {
    use quotad::store::faulty::PartFault;
    // One of a fleet of two: what it writes it reads back in the same round.
    let fleet = Arc::new(quotad::limiter::Membership::alone());
    fleet.set_members(2);
    let r = rig_with(LimiterConfig {
        shards: 8,
        store_timeout: Duration::from_secs(10),
        fleet,
        ..LimiterConfig::default()
    });
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let day = p.limits[0].kind.grain();
    for c in ["k1", "k2"] {
        let (t, c) = ids("acme", c);
        check(&r, &p, &t, &c, 1).await;
    }
    r.syncer.round().await.unwrap();
    // Another instance counts 10 more of each.
    let now = r.clock.now_ms();
    let other: Vec<Delta> = ["k1", "k2"]
        .iter()
        .map(|c| Delta {
            key: CounterKey {
                tenant: "acme".into(),
                subject: (*c).into(),
                limit: "d".into(),
                grain: day,
            },
            start: day.bucket_start(now),
            delta: 10,
        })
        .collect();
    r.store.increment(&other).await.unwrap();
    let remaining = |c: &'static str| {
        let r = &r;
        let p = &p;
        async move {
            let (t, c) = ids("acme", c);
            check(r, p, &t, &c, 0).await.binding.unwrap().remaining
        }
    };
    r.faulty.fail_part("k2", Some(PartFault::Refused));
    for c in ["k1", "k2"] {
        let (t, c) = ids("acme", c);
        check(&r, &p, &t, &c, 1).await;
    }
    r.syncer.round().await.unwrap();
    assert_eq!(
        remaining("k1").await,
        1000 - 12,
        "read back: the other's 10 in it"
    );
    assert_eq!(
        remaining("k2").await,
        1000 - 2,
        "unread: its own view is kept"
    );
    r.faulty.fail_part("k2", None);
    r.syncer.round().await.unwrap();
    assert_eq!(remaining("k2").await, 1000 - 12, "read at the next round");
}
