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
