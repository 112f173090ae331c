//! Token bucket limits and grants, tried as a user would: over real HTTP, on one instance with
//! a test clock, and on two instances sharing one store.

use std::sync::Arc;
use std::time::Duration;

use quotad::clock::ManualClock;
use quotad::store::embedded::EmbeddedStore;
use quotad::store::DynStore;
use serde_json::{json, Value};

use crate::helpers::*;

/// 2026-01-01T00:00:00.050Z: a burst 50 ms into a counter bucket.
const T0: i64 = 1_767_225_600_050;

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

async fn post(app: &TestApp, path: &str, body: Value, key: Option<&str>) -> (u16, Value, bool) {
    let mut req = app.http.post(app.url(path)).bearer_auth(ADMIN).json(&body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let r = req.send().await.unwrap();
    let replayed = header(&r, "Idempotent-Replayed") == "true";
    (r.status().as_u16(), r.json().await.unwrap(), replayed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_50_then_10_per_second_is_admitted_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
    let clock = ManualClock::new(T0);
    let app = spawn_on_store_at(store, Arc::new(clock.clone()), |_| {}).await;
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [{"id": "api", "burst": 50, "rate": 10, "per": "1s"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    // The canonical document spells the bucket out, with no max.
    let doc = app.get_json("/v1/quotas/acme").await;
    assert_eq!(
        doc["limits"][0],
        json!({"id": "api", "burst": 50, "rate": 10, "per": "1s", "scope": "client"}),
        "{doc}"
    );

    // The burst: 50 at once, the 51st refused until one token is back (100 ms: Retry-After 1).
    let mut statuses = Vec::new();
    let mut remaining = Vec::new();
    for _ in 0..55 {
        let r = app.check(json!({"tenant": "acme", "client": "k1"})).await;
        statuses.push(r.status().as_u16());
        remaining.push(header(&r, "RateLimit-Remaining"));
        if r.status() == 429 {
            assert_eq!(header(&r, "Retry-After"), "1");
            assert_eq!(header(&r, "RateLimit-Limit"), "50");
        }
    }
    assert_eq!(statuses[..50], [200; 50]);
    assert_eq!(statuses[50..], [429; 5]);
    assert_eq!(remaining[0], "49");
    assert_eq!(remaining[49], "0");

    // Then 10 a second, one every 100 ms, for 20 s: every one admitted, and a second one at
    // the same instant refused.
    for i in 1..=200 {
        clock.set(T0 + i * 100);
        let (s, v) = app.check_json("acme", "k1").await;
        assert_eq!(s, 200, "step {i}: {v}");
        let (s, _) = app.check_json("acme", "k1").await;
        assert_eq!(s, 429, "step {i}: a second check at the same instant");
    }
    // A pause of 5 s fills the bucket again: 50 at once.
    clock.set(T0 + 20_000 + 5_000);
    let mut n = 0;
    for _ in 0..60 {
        n += (app.check_json("acme", "k1").await.0 == 200) as u32;
    }
    assert_eq!(n, 50);
    // The usage of a token bucket: tokens used, whole tokens left, time until full.
    let u = app.usage("acme", "k1").await;
    assert_eq!(u["limits"][0]["count"], 50, "{u}");
    assert_eq!(u["limits"][0]["remaining"], 0, "{u}");
    // Full in 5 s, less the refill of the 50 ms the burst came into its 100 ms counter bucket
    // (hits are taken as arriving at their bucket's start: the written bound).
    assert_eq!(u["limits"][0]["reset_after_ms"], 4_950, "{u}");
}

#[tokio::test]
async fn bad_token_buckets_are_400s_naming_the_field() {
    let app = spawn_app().await;
    for (limit, field) in [
        (json!({"id": "a", "burst": 5}), "limits[0].rate"),
        (json!({"id": "a", "rate": 5}), "limits[0].burst"),
        (
            json!({"id": "a", "burst": 5, "rate": 1, "max": 5}),
            "limits[0].max",
        ),
        (
            json!({"id": "a", "burst": 5, "rate": 1, "window": "1s"}),
            "limits[0]",
        ),
        (json!({"id": "a", "burst": 0, "rate": 1}), "limits[0].burst"),
        (
            json!({"id": "a", "burst": 5, "rate": 1.5}),
            "limits[0].rate",
        ),
        (
            json!({"id": "a", "burst": 5, "rate": 1, "per": "soon"}),
            "limits[0].per",
        ),
        // Fills in 1 ms: shorter than 1 s.
        (
            json!({"id": "a", "burst": 1, "rate": 1000}),
            "limits[0].burst",
        ),
        (json!({"id": "a"}), "limits[0].max"),
    ] {
        let r = app.put_quota("acme", json!({"limits": [limit]})).await;
        let v = assert_error(r, 400, "invalid_argument").await;
        assert_eq!(v["error"]["field"], field, "{limit}: {v}");
    }
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [{"id": "a", "burst": 5, "rate": 1}], "consistency": "strict"}),
        )
        .await;
    let v = assert_error(r, 400, "invalid_argument").await;
    assert_eq!(v["error"]["field"], "consistency", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_and_a_reset_on_one_instance_take_effect_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
    let a = spawn_on_store(store.clone(), |_| {}).await;
    let b = spawn_on_store(store.clone(), |_| {}).await;
    let r = a
        .put_quota(
            "acme",
            json!({"limits": [{"id": "daily", "max": 3, "period": "day"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let r = a
        .put_quota(
            "beta",
            json!({"limits": [{"id": "bucket", "burst": 5, "rate": 1, "per": "1m"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    // B learns of the policies at its next poll.
    b.usage_reaches("acme", "k1", 0).await;
    b.usage_reaches("beta", "k1", 0).await;

    // A daily limit used up on A; a grant of 2 on B lets A admit 2 more, no third.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(a.check_json("acme", "k1").await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    b.usage_reaches("acme", "k1", 3).await;
    let grant = json!({"limit_id": "daily", "amount": 2});
    let (s, v, replayed) = post(&b, "/v1/usage/acme/k1/grant", grant.clone(), Some("g-1")).await;
    assert_eq!((s, replayed), (200, false), "{v}");
    assert_eq!((&v["amount"], &v["granted"]), (&json!(2), &json!(2)), "{v}");
    assert_eq!(v["limits"][0]["remaining"], 2, "{v}");
    a.admitted_eventually("acme", "k1", "the grant did not reach A")
        .await;
    assert_eq!(a.check_json("acme", "k1").await.0, 200);
    assert_eq!(a.check_json("acme", "k1").await.0, 429);
    // The same grant again with its key: answered from the first, nothing credited.
    let (s, again, replayed) =
        post(&b, "/v1/usage/acme/k1/grant", grant.clone(), Some("g-1")).await;
    assert_eq!((s, replayed), (200, true));
    assert_eq!(again, v);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        a.check_json("acme", "k1").await.0,
        429,
        "a replay credited again"
    );
    // The same key with another amount is refused; a bad amount names its field.
    let (s, v, _) = post(
        &b,
        "/v1/usage/acme/k1/grant",
        json!({"limit_id": "daily", "amount": 5}),
        Some("g-1"),
    )
    .await;
    assert_eq!(
        (s, &v["error"]["field"]),
        (400, &json!("Idempotency-Key")),
        "{v}"
    );
    for (body, field) in [
        (json!({"limit_id": "daily", "amount": 0}), "amount"),
        (json!({"limit_id": "daily", "amount": -1}), "amount"),
        (json!({"limit_id": "nope", "amount": 1}), "limit_id"),
        (json!({"amount": 1}), "limit_id"),
    ] {
        let (s, v, _) = post(&b, "/v1/usage/acme/k1/grant", body.clone(), None).await;
        assert_eq!(
            (s, &v["error"]["field"]),
            (400, &json!(field)),
            "{body}: {v}"
        );
    }

    // A token bucket emptied on A; a reset on B fills it for A; a grant beyond full tops it up.
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(a.check_json("beta", "k1").await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    b.usage_reaches("beta", "k1", 5).await;
    let (s, v, _) = post(&b, "/v1/usage/beta/k1/reset", json!({}), Some("r-1")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["limits"][0]["count"], 0, "{v}");
    a.admitted_eventually("beta", "k1", "the reset did not reach A")
        .await;
    // A's admitted check reaches the store at its next sync round; B reads it from there.
    b.usage_reaches("beta", "k1", 1).await;
    let (s, v, _) = post(
        &b,
        "/v1/usage/beta/k1/grant",
        json!({"limit_id": "bucket", "amount": 100}),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert!(
        v["granted"].as_u64().unwrap() <= 1,
        "a bucket never holds more than its burst: {v}"
    );
    assert_eq!(v["limits"][0]["remaining"], 5, "{v}");

    // The audit log names the grant with the count before and after.
    let log = b.get_json("/v1/audit?tenant=acme&limit=5").await;
    let grants: Vec<&Value> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "usage.grant")
        .collect();
    assert_eq!(grants.len(), 1, "{log}");
    assert_eq!(grants[0]["body_before"], json!({"daily": 3}), "{log}");
    assert_eq!(grants[0]["body_after"], json!({"daily": 1}), "{log}");

    // Durable: a new instance on the store sees the credit used up.
    a.stop().await;
    b.stop().await;
    let c = spawn_on_store(store, |_| {}).await;
    let u = c.usage("acme", "k1").await;
    assert_eq!(
        (&u["limits"][0]["count"], &u["limits"][0]["remaining"]),
        (&json!(3), &json!(0)),
        "{u}"
    );
}

#[tokio::test]
async fn windows_periods_and_buckets_decide_all_or_nothing() {
    let app = spawn_app().await;
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [
                {"id": "per-minute", "max": 3, "window": "1m"},
                {"id": "daily", "max": 100, "period": "day"},
                {"id": "bucket", "burst": 10, "rate": 1, "per": "1m"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(app.check_json("acme", "k1").await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    // The window's denials took nothing from the period or the bucket.
    let u = app.usage("acme", "k1").await;
    let counts: Vec<(&str, u64)> = u["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["limit_id"].as_str().unwrap(),
                l["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        counts,
        [("per-minute", 3), ("daily", 3), ("bucket", 3)],
        "{u}"
    );
    // A cost above the bucket's burst never fits, and takes nothing from the others either.
    let r = app
        .put_quota(
            "wide",
            json!({"limits": [
                {"id": "per-minute", "max": 100, "window": "1m"},
                {"id": "bucket", "burst": 10, "rate": 1, "per": "1m"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let r = app
        .check(json!({"tenant": "wide", "client": "k2", "cost": 11}))
        .await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (&v["limit_id"], &v["retry_after_ms"]),
        (&json!("bucket"), &Value::Null),
        "{v}"
    );
    let u = app.usage("wide", "k2").await;
    assert!(
        u["limits"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["count"] == 0),
        "{u}"
    );
}

/// Unspent credit stops at 2^53: grants past it credit only up to it, and the audit log's
/// counts stay what they are (no wrap at the ends of 64 bits).
#[tokio::test]
async fn credit_stops_at_two_to_the_53() {
    let app = spawn_app().await;
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [{"id": "daily", "max": 3, "period": "day"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let most = 1u64 << 53;
    let grant = json!({"limit_id": "daily", "amount": most});
    let (s, v, _) = post(&app, "/v1/usage/acme/k1/grant", grant.clone(), None).await;
    assert_eq!((s, &v["granted"]), (200, &json!(most)), "{v}");
    for _ in 0..3 {
        let (s, v, _) = post(&app, "/v1/usage/acme/k1/grant", grant.clone(), None).await;
        assert_eq!((s, &v["granted"]), (200, &json!(0)), "{v}");
    }
    let audit = app.get_json("/v1/audit?action=usage.grant").await;
    let text = audit.to_string();
    assert!(!text.contains("-9223372036854775808"), "{text}");
    assert!(!text.contains(&format!("{}", 1u64 << 62)), "{text}");
}
