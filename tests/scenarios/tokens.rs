//! Token buckets in the limiter: the level kept across idling, refill changes and other
//! instances' hits, and carries too large for an `i64`.

use super::*;
use quotad::limiter::tokens::{fold, level, Carry};
use quotad::limiter::window::Bucket;

fn syncer(l: &Arc<Limiter>, s: &DynStore, m: &Arc<Metrics>) -> Syncer {
    Syncer::new(l.clone(), s.clone(), m.clone(), SyncConfig::default())
}

#[tokio::test]
async fn an_idle_bucket_that_is_not_full_keeps_its_level() {
    let r = rig();
    // burst 100, 100 a day: it fills in a day, in 15 min buckets; a first read looks back 8 h.
    let p = policy(
        serde_json::json!({"limits": [{"id": "d", "burst": 100, "rate": 100, "per": "1d"}]}),
    );
    let (t, c) = ids("acme", "k1");
    let mut admitted = 0;
    for _ in 0..4 {
        admitted += check(&r, &p, &t, &c, 100).await.allowed as u64 * 100;
        r.syncer.round().await.unwrap();
        // Idle beyond idle_ms: an eviction pass runs.
        r.clock.advance(61_000);
        r.syncer.round().await.unwrap();
        r.limiter.evict(r.clock.now_ms());
        r.clock.advance(9 * 3_600_000);
    }
    // Over about 28 h an exact bucket admits 100 + 28/24 x 100 at most.
    assert!(admitted <= 216, "admitted {admitted}");
    assert_eq!(admitted, 200, "the burst, then the refill of a day");
}

#[tokio::test]
async fn changing_per_keeps_the_tokens_missing() {
    let r = rig();
    let a =
        policy(serde_json::json!({"limits": [{"id": "x", "burst": 50, "rate": 10, "per": "1s"}]}));
    // The same refill, written per minute.
    let b =
        policy(serde_json::json!({"limits": [{"id": "x", "burst": 50, "rate": 600, "per": "1m"}]}));
    let (t, c) = ids("acme", "k1");
    assert!(check(&r, &a, &t, &c, 50).await.allowed);
    r.syncer.round().await.unwrap();
    r.clock.advance(1_500);
    r.syncer.round().await.unwrap();
    r.clock.advance(500);
    // 2 s later an exact bucket holds 20 tokens, whichever way the refill is written.
    let mut admitted = 0;
    for _ in 0..60 {
        admitted += check(&r, &b, &t, &c, 1).await.allowed as u32;
    }
    assert!((20..=21).contains(&admitted), "admitted {admitted}");
}

#[tokio::test]
async fn buckets_are_folded_only_once_other_instances_hits_were_read() {
    let dir = tempfile::tempdir().unwrap();
    let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
    let clock = ManualClock::new(T0);
    let m = Arc::new(Metrics::new(false));
    let mk = || {
        let fleet = Arc::new(quotad::limiter::Membership::alone());
        fleet.set_members(2);
        Arc::new(Limiter::new(
            store.clone(),
            Arc::new(clock.clone()),
            m.clone(),
            LimiterConfig {
                shards: 8,
                store_timeout: Duration::from_secs(10),
                fleet,
                ..LimiterConfig::default()
            },
        ))
    };
    let (la, lb) = (mk(), mk());
    let (sa, sb) = (syncer(&la, &store, &m), syncer(&lb, &store, &m));
    let p =
        policy(serde_json::json!({"limits": [{"id": "x", "burst": 50, "rate": 2, "per": "1s"}]}));
    let (t, c) = ids("acme", "k1");
    let input = |cost| CheckInput {
        tenant: &t,
        client: &c,
        resource: None,
        cost,
        reserve: false,
    };
    // A holds the counter and stops using it; B spends most of the bucket.
    assert!(la.check(&p, input(1)).await.allowed);
    let mut b_admitted = 0;
    for i in 0..2 {
        sa.round().await.unwrap();
        sb.round().await.unwrap();
        clock.advance(250);
        if i == 1 {
            for _ in 0..60 {
                b_admitted += lb.check(&p, input(1)).await.allowed as u64;
            }
        }
    }
    assert!(b_admitted > 20, "B admitted {b_admitted}");
    // Rounds go by (A reads its held counter back every few rounds, and evicts in each).
    for _ in 0..16 {
        sa.round().await.unwrap();
        sb.round().await.unwrap();
        la.evict(clock.now_ms());
        clock.advance(250);
    }
    let a = la.usage(&p, &t, &c, None).await.unwrap()[0].count;
    let b = lb.usage(&p, &t, &c, None).await.unwrap()[0].count;
    assert!(a + 2 >= b && b + 2 >= a, "A sees {a} tokens used, B {b}");
    let d = la.check(&p, input(0)).await;
    let remaining = d.binding.unwrap().remaining;
    assert!(a > 10, "A sees B's hits: {a} used");
    assert!(
        remaining <= 52 - a,
        "A's decisions see B's hits: {remaining} left, {a} used"
    );
}

#[test]
fn a_carry_beyond_an_i64_keeps_its_level() {
    // 10^10 tokens refilled over 31 days: the deficit in tokens x per_ms is about 2^84.
    let p = policy(serde_json::json!({"limits": [
        {"id": "x", "burst": 10_000_000_000u64, "rate": 10_000_000_000u64, "per": "31d"}]}));
    let k = p.limits[0].kind;
    let g = k.grain().bucket_end(0);
    let start = k.grain().bucket_start(T0);
    let bs = vec![Bucket {
        start,
        stored: 10_000_000_000,
        ..Bucket::default()
    }];
    let mut carry = Carry {
        at: start - g,
        deficit: 0,
    };
    let before = level(k, &bs, carry, T0 + 3 * g, Bucket::count);
    fold(k, &bs, &mut carry, T0 + 3 * g);
    let after = level(k, &bs, carry, T0 + 3 * g, Bucket::count);
    assert_eq!(before, after);
    assert!(after > 9_000_000_000, "{after}");
}
