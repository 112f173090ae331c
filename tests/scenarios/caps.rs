//! Memory caps: checks beyond them are decided through the store and held nowhere.

use super::*;

#[tokio::test]
async fn clients_beyond_the_tenant_cap_are_decided_by_the_store_and_held_nowhere() {
    let r = capped(1_000, 3);
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 2, "period": "day"}]}));
    let day = p.limits[0].kind.grain();
    for i in 0..10 {
        let (t, c) = ids("acme", &format!("k{i}"));
        assert!(check(&r, &p, &t, &c, 1).await.allowed, "k{i} first");
        assert!(check(&r, &p, &t, &c, 1).await.allowed, "k{i} second");
        assert!(!check(&r, &p, &t, &c, 1).await.allowed, "k{i} over max 2");
    }
    // Another tenant has its own cap.
    let (t, c) = ids("other", "k0");
    assert!(check(&r, &p, &t, &c, 1).await.allowed);
    let (counters, pending) = r.limiter.evict(r.clock.now_ms());
    assert_eq!(counters, 4, "3 clients of acme, 1 of other");
    assert_eq!(
        pending, 7,
        "the held clients' hits (3 x 2 + 1) wait for the sync"
    );
    // The 7 clients beyond the cap: 3 checks each, all through the store.
    assert_eq!(
        metric(&r, "quotad_memory_cap_checks_total{cap=\"tenant_clients\"}"),
        21.0
    );
    r.syncer.round().await.unwrap();
    for i in 0..10 {
        assert_eq!(
            stored(&r, "acme", &format!("k{i}"), "d", day).await,
            2,
            "k{i}"
        );
    }
}

#[tokio::test]
async fn a_flood_of_clients_neither_passes_the_counter_cap_nor_evicts_unwritten_hits() {
    let r = capped(50, 1_000);
    let p = policy(serde_json::json!({"limits": [
        {"id": "m", "max": 100, "window": "1m"},
        {"id": "d", "max": 1000, "period": "day"}]}));
    let (t, hot) = ids("acme", "hot");
    for _ in 0..5 {
        assert!(check(&r, &p, &t, &hot, 1).await.allowed);
    }
    for i in 0..200 {
        let (t, c) = ids("acme", &format!("flood-{i}"));
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
        if i % 50 == 49 {
            r.clock.advance(1_000);
            let (counters, _) = r.limiter.evict(r.clock.now_ms());
            assert!(counters <= 50, "{counters} counters in memory");
        }
    }
    // The hot client's unwritten hits are still held, and it is still decided in memory.
    assert!(r.limiter.pending_hits() >= 5);
    let d = check(&r, &p, &t, &hot, 0).await;
    assert_eq!(d.binding.unwrap().remaining, 95);
    assert!(metric(&r, "quotad_memory_cap_checks_total{cap=\"counters\"}") > 0.0);
    r.syncer.round().await.unwrap();
    let day = p.limits[1].kind.grain();
    assert_eq!(stored(&r, "acme", "hot", "d", day).await, 5);
    for i in [0, 99, 199] {
        assert_eq!(stored(&r, "acme", &format!("flood-{i}"), "d", day).await, 1);
    }
    // Under pressure, written counters unused for two sync intervals leave (at the first pass
    // after the round that wrote them: a pass keeps the counters whose hits it takes); the hot
    // client, used 0.1 s ago, stays.
    r.clock.advance(100);
    let (counters, pending) = r.limiter.evict(r.clock.now_ms());
    assert_eq!((counters, pending), (2, 0));
    // With the pressure gone, the hot client (used within `idle_ms`) stays.
    r.clock.advance(1_000);
    let (counters, pending) = r.limiter.evict(r.clock.now_ms());
    assert_eq!((counters, pending), (2, 0));
}
