//! Store failures on the check path: the `on_store_failure` rules, with and without room in
//! memory.

use super::*;

#[tokio::test]
async fn on_store_failure_rules_decide_unknown_keys_without_5xx() {
    let r = rig_with_deadline(Duration::from_millis(200));
    r.faulty.set(Fault::Hanging);
    let mk = |rule: &str| {
        policy(
            serde_json::json!({"limits": [{"id": "d", "max": 1, "period": "day"}],
            "on_store_failure": rule}),
        )
    };
    let (t, c) = ids("acme", "deny-me");
    let d = check(&r, &mk("deny"), &t, &c, 1).await;
    assert!(!d.allowed);
    assert_eq!(d.store_failure, Some(OnStoreFailure::Deny));
    let (t, c) = ids("acme", "local");
    let p = mk("local");
    let started = std::time::Instant::now();
    assert!(check(&r, &p, &t, &c, 1).await.allowed);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the deadline held"
    );
    assert!(
        !check(&r, &p, &t, &c, 1).await.allowed,
        "local view enforces max 1"
    );
    let (t, c) = ids("acme", "allow");
    let p = mk("allow");
    assert!(check(&r, &p, &t, &c, 1).await.allowed);
    // The allowed hits are pending, to be written when the store returns.
    r.faulty.set(Fault::Healthy);
    r.syncer.round().await.unwrap();
    assert_eq!(
        stored(&r, "acme", "allow", "d", p.limits[0].kind.grain()).await,
        1
    );
    assert_eq!(
        stored(&r, "acme", "local", "d", p.limits[0].kind.grain()).await,
        1
    );
}

#[tokio::test]
async fn at_a_cap_with_the_store_down_allow_counts_the_unrecorded_hit_and_local_denies() {
    let r = capped(1_000, 1);
    let mk = |rule: &str| {
        policy(
            serde_json::json!({"limits": [{"id": "d", "max": 10, "period": "day"}],
            "on_store_failure": rule}),
        )
    };
    let (t, c) = ids("acme", "first");
    assert!(check(&r, &mk("local"), &t, &c, 1).await.allowed);
    r.faulty.set(Fault::Failing);
    let (t, c) = ids("acme", "second");
    let d = check(&r, &mk("local"), &t, &c, 1).await;
    assert!(!d.allowed, "no room to hold the hit: local cannot enforce");
    assert_eq!(d.store_failure, Some(OnStoreFailure::Local));
    let d = check(&r, &mk("allow"), &t, &c, 3).await;
    assert!(d.allowed);
    assert_eq!(metric(&r, "quotad_unrecorded_hits_total"), 3.0);
    // The held client keeps its hits while the store is down, and writes them after.
    let (t, c) = ids("acme", "first");
    assert!(check(&r, &mk("local"), &t, &c, 1).await.allowed);
    r.faulty.set(Fault::Healthy);
    r.syncer.round().await.unwrap();
    let day = mk("local").limits[0].kind.grain();
    assert_eq!(stored(&r, "acme", "first", "d", day).await, 2);
}

#[tokio::test]
async fn without_a_shard_lease_checks_follow_on_store_failure_and_resume_with_it() {
    let fleet = Arc::new(quotad::limiter::Membership::alone());
    let r = rig_with(LimiterConfig {
        fleet: fleet.clone(),
        ..LimiterConfig::default()
    });
    let mk = |rule: &str| {
        policy(
            serde_json::json!({"limits": [{"id": "d", "max": 5, "period": "day"}],
            "on_store_failure": rule}),
        )
    };
    let (t, c) = ids("acme", "k1");
    assert!(check(&r, &mk("deny"), &t, &c, 1).await.allowed);
    fleet.set_held(false);
    let d = check(&r, &mk("deny"), &t, &c, 1).await;
    assert!(!d.allowed, "no lease, rule deny");
    assert_eq!(d.store_failure, Some(OnStoreFailure::Deny));
    let d = check(&r, &mk("local"), &t, &c, 1).await;
    assert!(d.allowed);
    assert_eq!(d.store_failure, Some(OnStoreFailure::Local));
    fleet.set_held(true);
    let d = check(&r, &mk("deny"), &t, &c, 1).await;
    assert!(d.allowed && d.store_failure.is_none());
}

/// The log lines of the test's thread, for a test that counts them.
#[derive(Clone, Default)]
struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn count(&self, text: &str) -> usize {
        let all = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        all.lines().filter(|l| l.contains(text)).count()
    }
}

/// A store that fails some checks and answers others (a replica lost) is one episode in the
/// log: it begins once, and ends once the check path has gone 5 s without a failure.
#[tokio::test(flavor = "current_thread")]
async fn failures_among_answers_are_one_episode_in_the_log() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let r = rig();
    let p = policy(
        serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}],
        "consistency": "strict"}),
    );
    let (t, c) = ids("acme", "k1");
    assert!(check(&r, &p, &t, &c, 1).await.allowed);
    for _ in 0..5 {
        r.faulty.set(Fault::Failing);
        assert!(check(&r, &p, &t, &c, 1).await.store_failure.is_some());
        r.faulty.set(Fault::Healthy);
        r.clock.advance(1_000);
        assert!(check(&r, &p, &t, &c, 1).await.store_failure.is_none());
    }
    let begun = "store failing some checks it decides while it answers others";
    let ended = "store answering the check path again";
    assert_eq!((lines.count(begun), lines.count(ended)), (1, 0));
    r.clock.advance(5_000);
    assert!(check(&r, &p, &t, &c, 1).await.store_failure.is_none());
    assert_eq!((lines.count(begun), lines.count(ended)), (1, 1));
}
