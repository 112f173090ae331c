//! Reset: a client's consumption brought to zero, durably and for every instance on the store.

use std::sync::Arc;

use quotad::store::embedded::EmbeddedStore;
use quotad::store::DynStore;
use serde_json::json;

use crate::helpers::*;

async fn reset(
    app: &TestApp,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut req = app.http.post(app.url(path)).bearer_auth(ADMIN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn count(usage: &serde_json::Value, id: &str) -> u64 {
    usage["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit_id"] == id)
        .and_then(|l| l["count"].as_u64())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_on_one_instance_takes_effect_on_another_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
    let a = spawn_on_store(store.clone(), |_| {}).await;
    let b = spawn_on_store(store.clone(), |_| {}).await;
    let r = a
        .put_quota(
            "acme",
            json!({"limits": [
                {"id": "per-minute", "max": 3, "window": "1m"},
                {"id": "daily", "max": 100, "period": "day"},
                {"id": "shared", "max": 1000, "window": "1h", "scope": "tenant"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(a.check_json("acme", "k1").await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    // Wait for A's hits to reach the store (a sync round), then reset on B.
    b.usage_reaches("acme", "k1", 3).await;
    let (s, v) = reset(&b, "/v1/usage/acme/k1/reset", None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!((count(&v, "per-minute"), count(&v, "daily")), (0, 0), "{v}");
    assert_eq!(
        count(&v, "shared"),
        3,
        "a tenant-scoped limit is not the client's: {v}"
    );

    // A admits again within a refresh (its counter is read back within a few sync rounds).
    a.admitted_eventually("acme", "k1", "A still denies after the reset")
        .await;

    // One limit alone, and bad requests.
    let (s, v) = reset(
        &a,
        "/v1/usage/acme/k1/reset",
        Some(json!({"limit_id": "daily"})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!((count(&v, "per-minute"), count(&v, "daily")), (1, 0), "{v}");
    for (body, field) in [
        (json!({"limit_id": "nope"}), "limit_id"),
        (json!({"limit_id": "shared"}), "limit_id"),
        (json!({"limitid": "daily"}), "limitid"),
    ] {
        let (s, v) = reset(&a, "/v1/usage/acme/k1/reset", Some(body)).await;
        assert_eq!((s, v["error"]["field"].as_str()), (400, Some(field)), "{v}");
    }
    let (s, _) = reset(&a, "/v1/usage/nobody/k1/reset", None).await;
    assert_eq!(s, 404);

    // The audit log says who reset what, with the counts before.
    let log = b.get_json("/v1/audit?tenant=acme&limit=3").await;
    let resets: Vec<&serde_json::Value> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "usage.reset")
        .collect();
    assert_eq!(resets.len(), 2, "{log}");
    assert_eq!(
        resets[1]["body_before"],
        json!({"daily": 3, "per-minute": 3}),
        "{log}"
    );
    assert_eq!(resets[1]["client"], "k1");

    // Durable: a new instance on the store sees one per-minute hit (after the reset), no daily.
    a.stop().await;
    b.stop().await;
    let c = spawn_on_store(store.clone(), |_| {}).await;
    let v = c.get_json("/v1/usage/acme/k1").await;
    assert_eq!((count(&v, "per-minute"), count(&v, "daily")), (1, 0), "{v}");
    c.stop().await;
}
