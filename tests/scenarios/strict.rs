//! Strict mode: the store counts before the answer.

use super::*;

#[tokio::test]
async fn strict_mode_counts_in_the_store_before_answering() {
    let r = rig();
    let p = policy(
        serde_json::json!({"limits": [{"id": "d", "max": 3, "period": "day"}],
        "consistency": "strict"}),
    );
    let (t, c) = ids("acme", "k1");
    let grain = p.limits[0].kind.grain();
    for i in 1..=3 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
        assert_eq!(
            stored(&r, "acme", "k1", "d", grain).await,
            i,
            "counted before answering"
        );
    }
    let d = check(&r, &p, &t, &c, 1).await;
    assert!(!d.allowed);
    assert_eq!(
        stored(&r, "acme", "k1", "d", grain).await,
        3,
        "the denial compensated"
    );
    assert_eq!(r.limiter.pending_hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strict_mode_never_over_admits_under_concurrency() {
    let r = Arc::new(rig());
    let p = Arc::new(policy(
        serde_json::json!({"limits": [{"id": "d", "max": 20, "period": "day"}],
        "consistency": "strict"}),
    ));
    let mut tasks = Vec::new();
    for _ in 0..60 {
        let (r, p) = (r.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            let (t, c) = ids("acme", "k1");
            check(&r, &p, &t, &c, 1).await.allowed
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap() as i64;
    }
    assert_eq!(admitted, 20);
    assert_eq!(
        stored(&r, "acme", "k1", "d", p.limits[0].kind.grain()).await,
        20
    );
}

/// A strict policy that defaults to `local`, of one day's `max`.
fn strict_local(max: u64) -> Policy {
    policy(
        serde_json::json!({"limits": [{"id": "d", "max": max, "period": "day"}],
        "consistency": "strict", "on_store_failure": "local"}),
    )
}

#[tokio::test]
async fn a_failing_store_leaves_a_strict_counter_its_last_totals_not_a_fresh_limit() {
    let r = rig();
    let p = strict_local(10);
    let (t, c) = ids("acme", "k1");
    for _ in 0..6 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    r.faulty.set(Fault::Failing);
    // Past the time the store counts as answering: the rule decides.
    r.clock.advance(2_001);
    let mut admitted = 0;
    for _ in 0..20 {
        let d = check(&r, &p, &t, &c, 1).await;
        assert!(d.store_failure.is_some());
        admitted += d.allowed as u64;
    }
    assert_eq!(admitted, 4, "the headroom the store last showed, no more");
    // A strict counter this instance never read is not made up under `local`.
    let (_, other) = ids("acme", "k2");
    assert!(!check(&r, &p, &t, &other, 1).await.allowed);
    assert_eq!(
        metric(
            &r,
            "quotad_store_failure_decisions_total{consistency=\"strict\",rule=\"local\"}"
        ),
        21.0
    );
    // The store returns: the next strict check carries the hits admitted meanwhile, so the
    // store (and every other instance) has them at once, and the limit holds.
    r.faulty.set(Fault::Healthy);
    assert!(!check(&r, &p, &t, &c, 1).await.allowed);
    let grain = p.limits[0].kind.grain();
    assert_eq!(stored(&r, "acme", "k1", "d", grain).await, 10);
    assert_eq!(r.limiter.pending_hits(), 0);
}

#[tokio::test]
async fn a_strict_answer_after_the_deadline_is_learned_from() {
    // The deadline is shorter than the store's answers (200 ms when slow).
    let r = rig_with_deadline(Duration::from_millis(50));
    let p = strict_local(10);
    let (t, c) = ids("acme", "k1");
    for _ in 0..3 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    r.faulty.set(Fault::Slow);
    r.clock.advance(2_001);
    let d = check(&r, &p, &t, &c, 1).await;
    assert!(d.allowed && d.store_failure.is_some());
    assert_eq!(
        r.limiter.pending_hits(),
        1,
        "admitted locally, to be written"
    );
    // The call goes on after the deadline and counts the hit in the store.
    tokio::time::sleep(Duration::from_millis(400)).await;
    r.faulty.set(Fault::Healthy);
    let grain = p.limits[0].kind.grain();
    assert_eq!(stored(&r, "acme", "k1", "d", grain).await, 4);
    // Learned: the hit is the store's now, not also this instance's to write.
    r.syncer.round().await.unwrap();
    assert_eq!(r.limiter.pending_hits(), 0);
    assert_eq!(
        stored(&r, "acme", "k1", "d", grain).await,
        4,
        "counted once"
    );
}

/// While the store answers other calls, a strict check whose own call fails is refused: an
/// answer from memory could pass `max` beside instances the store answers. Once nothing has
/// answered for 2 s, the rule (`local`) decides.
#[tokio::test]
async fn a_strict_check_the_store_fails_while_it_answers_others_is_refused() {
    let r = rig();
    let p = strict_local(10);
    let (t, c) = ids("acme", "k1");
    for _ in 0..3 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    r.faulty.set(Fault::Failing);
    r.clock.advance(1_000);
    let d = check(&r, &p, &t, &c, 1).await;
    assert!(!d.allowed, "refused while the store answered 1 s ago");
    assert_eq!(d.store_failure, Some(OnStoreFailure::Deny));
    assert_eq!(
        r.limiter.pending_hits(),
        0,
        "nothing held in memory to write"
    );
    assert_eq!(
        metric(
            &r,
            "quotad_store_failure_decisions_total{consistency=\"strict\",rule=\"deny\"}"
        ),
        1.0
    );
    // A sync round's write counts as the store answering, as a check's call does.
    r.faulty.set(Fault::Healthy);
    let cached = policy(serde_json::json!({"limits": [{"id": "m", "max": 100, "window": "1m"}]}));
    let (_, k9) = ids("acme", "k9");
    assert!(check(&r, &cached, &t, &k9, 1).await.allowed);
    assert_eq!(r.limiter.pending_hits(), 1);
    r.syncer.round().await.unwrap();
    assert_eq!(r.limiter.pending_hits(), 0);
    r.faulty.set(Fault::Failing);
    r.clock.advance(1_500);
    assert!(!check(&r, &p, &t, &c, 1).await.allowed);
    // Nothing answered for over 2 s: the store counts as down, and `local` admits within
    // the headroom last read.
    r.clock.advance(2_001);
    let d = check(&r, &p, &t, &c, 1).await;
    assert!(d.allowed, "{d:?}");
    assert_eq!(d.store_failure, Some(OnStoreFailure::Local));
}
