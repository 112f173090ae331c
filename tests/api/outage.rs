//! Two instances on one store; the store goes away and comes back. Every answer stays 200/429,
//! both instances say they are not ready, and afterwards the store holds exactly the hits the two
//! instances admitted, without a restart.

use std::sync::Arc;

use quotad::store::faulty::{Fault, FaultyStore};
use quotad::store::{CounterKey, CounterRange, DynStore};
use serde_json::json;

use crate::helpers::*;

const CLIENTS: [&str; 4] = ["k0", "k1", "k2", "k3"];

/// Sends `per_client` checks for each client to one instance, all at once; returns how many
/// each client got admitted, and fails on any answer but 200/429.
async fn traffic(app: &TestApp, per_client: usize) -> Vec<u64> {
    let mut admitted = Vec::new();
    for c in CLIENTS {
        let checks = (0..per_client).map(|_| app.check_json("acme", c));
        let mut n = 0;
        for (status, body) in futures::future::join_all(checks).await {
            assert!(status == 200 || status == 429, "{status}: {body}");
            n += (status == 200) as u64;
        }
        admitted.push(n);
    }
    admitted
}

/// Whether `app` enforces a policy for `tenant` within 2.5 s (it learns one written through
/// another instance within quotas.refresh_ms). It peeks (cost 0): nothing is consumed.
async fn knows_policy(app: &TestApp, tenant: &str) -> bool {
    for _ in 0..50 {
        let peek = json!({"tenant": tenant, "client": "probe", "cost": 0});
        if app.check(peek).await.status() == 200 {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

async fn ready(app: &TestApp) -> u16 {
    let r = app.http.get(app.url("/readyz")).send().await.unwrap();
    r.status().as_u16()
}

/// What the store itself holds for a client's daily counter.
async fn stored(store: &DynStore, client: &str) -> i64 {
    let day = quotad::domain::Period::Day.grain();
    let key = CounterKey {
        tenant: "acme".into(),
        subject: client.into(),
        limit: "daily".into(),
        grain: day,
    };
    let now = chrono::Utc::now().timestamp_millis();
    let got = store
        .read(&[CounterRange {
            key,
            from: day.bucket_start(now) - 86_400_000,
            to: now + 86_400_000,
        }])
        .await
        .unwrap();
    got[0].iter().map(|b| b.total).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_ride_out_a_store_outage_and_lose_no_admitted_hit() {
    let dir = tempfile::tempdir().unwrap();
    let inner: DynStore =
        Arc::new(quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap());
    let faulty = FaultyStore::new(inner.clone());
    let a = spawn_on_store(faulty.clone(), |_| {}).await;
    let b = spawn_on_store(faulty.clone(), |_| {}).await;
    let r = a
        .put_quota(
            "acme",
            json!({"limits": [{"id": "daily", "max": 1000, "period": "day"}],
                   "on_store_failure": "local"}),
        )
        .await;
    assert_eq!(r.status(), 201);
    assert!(knows_policy(&b, "acme").await, "b never saw the policy");

    let mut admitted = vec![0u64; CLIENTS.len()];
    let mut add = |got: Vec<u64>| {
        for (t, g) in admitted.iter_mut().zip(got) {
            *t += g;
        }
    };
    add(traffic(&a, 10).await);
    add(traffic(&b, 10).await);

    faulty.set(Fault::Failing);
    assert_eq!(ready(&a).await, 503);
    assert_eq!(ready(&b).await, 503);
    add(traffic(&a, 15).await);
    add(traffic(&b, 15).await);
    // A client neither instance has seen: decided on the local view, held until the store returns.
    let (status, _) = a.check_json("acme", "newcomer").await;
    assert_eq!(status, 200);
    // Sync rounds fail: the hits wait in memory.
    eventually("hits waiting in memory", || async {
        let pending =
            a.metric("quotad_sync_pending_hits").await + b.metric("quotad_sync_pending_hits").await;
        (pending > 0.0)
            .then_some(())
            .ok_or(format!("{pending} pending"))
    })
    .await;

    faulty.set(Fault::Healthy);
    // After the outage the sync backs off at most 10 s; wait for both to write everything.
    let mut drained = false;
    for _ in 0..150 {
        if ready(&a).await == 200
            && ready(&b).await == 200
            && a.metric("quotad_sync_pending_hits").await == 0.0
            && b.metric("quotad_sync_pending_hits").await == 0.0
        {
            drained = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        drained,
        "pending hits were not written after the store returned"
    );
    for (c, n) in CLIENTS.iter().zip(&admitted) {
        assert_eq!(*n, 50, "{c}: 50 checks under max 1000, all admitted");
        assert_eq!(stored(&inner, c).await, *n as i64, "{c}");
    }
    assert_eq!(stored(&inner, "newcomer").await, 1);
    assert_eq!(a.stop().await.0, 0);
    assert_eq!(b.stop().await.0, 0);
}

/// Strict consistency on two instances sharing one store: concurrent checks sent to both admit
/// exactly `max`, and the store holds exactly what was admitted (denials compensated).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strict_mode_on_two_instances_admits_exactly_max_under_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let store: DynStore =
        Arc::new(quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap());
    // Every check is a store transaction here; a loaded machine must not turn 120 queued ones
    // into deadline misses (those are on_store_failure's business, tested elsewhere).
    let slow_ok = |s: &mut quotad::config::Settings| {
        s.store.timeout_ms = Some(quotad::config::DurationMs(10_000));
    };
    let a = spawn_on_store(store.clone(), slow_ok).await;
    let b = spawn_on_store(store.clone(), slow_ok).await;
    let r = a
        .put_quota(
            "acme",
            json!({"limits": [{"id": "daily", "max": 50, "period": "day"}],
                   "consistency": "strict"}),
        )
        .await;
    assert_eq!(r.status(), 201);
    assert!(knows_policy(&b, "acme").await, "b never saw the policy");
    let checks = (0..120).map(|i| {
        let app = if i % 2 == 0 { &a } else { &b };
        app.check_json("acme", "k")
    });
    let mut admitted = 0;
    for (status, body) in futures::future::join_all(checks).await {
        assert!(status == 200 || status == 429, "{status}: {body}");
        admitted += (status == 200) as i64;
    }
    assert_eq!(admitted, 50);
    assert_eq!(stored(&store, "k").await, 50, "denials were compensated");
}
