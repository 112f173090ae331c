//! Reservations: a check that holds its estimate, settled at the real cost, released, or
//! expired; in-flight limits; bad input; a restart.

use std::time::Duration;

use quotad::config::{Role, TokenSettings};
use serde_json::{json, Value};

use crate::helpers::*;

/// A reserving check of `cost`; the answer's status and body.
async fn reserve(app: &TestApp, client: &str, cost: u64, extra: Value) -> (u16, Value) {
    let mut body = json!({"tenant": "acme", "client": client, "cost": cost, "reserve": true});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let r = app.check(body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

fn id_of(answer: &Value) -> String {
    answer["reservation"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no reservation in {answer}"))
        .to_owned()
}

async fn end(app: &TestApp, id: &str, how: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = app
        .http
        .post(app.url(&format!("/v1/reservations/{id}/{how}")));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn settle(app: &TestApp, id: &str, cost: Value) -> (u16, Value) {
    end(app, id, "settle", Some(json!({ "cost": cost }))).await
}

async fn get(app: &TestApp, id: &str) -> (u16, Value) {
    let r = app
        .http
        .get(app.url(&format!("/v1/reservations/{id}")))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// The count of limit `id` in the client's usage.
async fn count(app: &TestApp, client: &str, id: &str) -> u64 {
    let u = app.usage("acme", client).await;
    u["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit_id"] == id)
        .unwrap_or_else(|| panic!("no limit {id} in {u}"))["count"]
        .as_u64()
        .unwrap()
}

async fn app_with(policy: Value) -> TestApp {
    let app = spawn_app().await;
    assert_eq!(app.put_quota("acme", policy).await.status(), 201);
    app
}

#[tokio::test]
async fn a_settle_charges_the_real_cost_once_and_answers_the_same_when_asked_again() {
    let app =
        app_with(json!({"limits": [{"id": "per-minute", "max": 1000, "window": "1m"}]})).await;
    let (s, a) = reserve(&app, "k", 300, json!({})).await;
    assert_eq!(s, 200, "{a}");
    assert_eq!(a["reservation"]["estimate"], 300);
    assert_eq!(a["remaining"], 700);
    let id = id_of(&a);
    assert_eq!(count(&app, "k", "per-minute").await, 300);

    let (s, b) = settle(&app, &id, json!(120)).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        (b["state"].as_str(), b["cost"].as_u64()),
        (Some("settled"), Some(120))
    );
    assert_eq!(b["estimate"], 300);
    assert!(b.get("over_limit").is_none(), "{b}");
    assert_eq!(count(&app, "k", "per-minute").await, 120);

    // Again, the same cost: the same answer and nothing counted twice.
    let (s, again) = settle(&app, &id, json!(120)).await;
    assert_eq!((s, &again["ended_at"]), (200, &b["ended_at"]));
    assert_eq!(count(&app, "k", "per-minute").await, 120);
    // Another cost, or a release, of a settled reservation: 409 naming how it ended.
    let (s, e) = settle(&app, &id, json!(50)).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{e}"
    );
    assert!(
        e["error"]["message"].as_str().unwrap().contains("cost 120"),
        "{e}"
    );
    let (s, _) = end(&app, &id, "release", None).await;
    assert_eq!(s, 409);
    assert_eq!(count(&app, "k", "per-minute").await, 120);
    let (s, g) = get(&app, &id).await;
    assert_eq!((s, g["state"].as_str()), (200, Some("settled")));
    assert!(app.metric("quotad_holds_total{event=\"settled\"}").await >= 1.0);
    assert_eq!(
        app.metric("quotad_hold_estimate_error_total{direction=\"over\"}")
            .await,
        180.0
    );
}

#[tokio::test]
async fn an_under_estimate_is_charged_past_max_and_the_next_checks_are_refused() {
    let app =
        app_with(json!({"limits": [{"id": "per-minute", "max": 1000, "window": "1m"}]})).await;
    let (_, a) = reserve(&app, "k", 500, json!({})).await;
    let (s, b) = settle(&app, &id_of(&a), json!(1_500)).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["over_limit"], json!(["per-minute"]), "{b}");
    assert_eq!(count(&app, "k", "per-minute").await, 1_500);
    let (s, d) = app.check_json("acme", "k").await;
    assert_eq!(
        (s, d["limit_id"].as_str()),
        (429, Some("per-minute")),
        "{d}"
    );
}

#[tokio::test]
async fn a_release_gives_the_whole_estimate_back() {
    let app =
        app_with(json!({"limits": [{"id": "per-minute", "max": 1000, "window": "1m"}]})).await;
    let (_, a) = reserve(&app, "k", 800, json!({})).await;
    let big = json!({"tenant": "acme", "client": "k", "cost": 300});
    assert_eq!(app.check(big.clone()).await.status(), 429);
    let (s, r) = end(&app, &id_of(&a), "release", None).await;
    assert_eq!(
        (s, r["state"].as_str(), &r["cost"]),
        (200, Some("released"), &Value::Null)
    );
    assert_eq!(count(&app, "k", "per-minute").await, 0);
    assert_eq!(app.check(big).await.status(), 200);
    // Released twice: the same answer.
    assert_eq!(end(&app, &id_of(&a), "release", None).await.0, 200);
}

#[tokio::test]
async fn an_in_flight_limit_never_holds_more_than_max_and_frees_a_slot_at_each_end() {
    let app = app_with(json!({"limits": [
        {"id": "per-minute", "max": 100000, "window": "1m"},
        {"id": "slots", "max": 2, "in_flight": "holds"}]}))
    .await;
    let (s1, a1) = reserve(&app, "k", 1_000, json!({})).await;
    let (s2, a2) = reserve(&app, "k", 5, json!({})).await;
    assert_eq!((s1, s2), (200, 200));
    let (s3, a3) = reserve(&app, "k", 1, json!({})).await;
    assert_eq!((s3, a3["limit_id"].as_str()), (429, Some("slots")), "{a3}");
    // A hold may end any moment: the refusal says to try again in a second.
    assert_eq!(a3["retry_after_ms"], 1000, "{a3}");
    assert!(a3.get("reservation").is_none());
    // A check that holds nothing does not meet the in-flight limit.
    assert_eq!(app.check_json("acme", "k").await.0, 200);
    let u = app.usage("acme", "k").await;
    let slots = u["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit_id"] == "slots");
    let slots = slots.unwrap_or_else(|| panic!("{u}"));
    assert_eq!(
        (slots["count"].as_u64(), slots["in_flight"].as_str()),
        (Some(2), Some("holds"))
    );
    // Each end frees its slot: a settle, then a release.
    assert_eq!(settle(&app, &id_of(&a1), json!(10)).await.0, 200);
    let (s, a4) = reserve(&app, "k", 1, json!({})).await;
    assert_eq!(s, 200, "{a4}");
    assert_eq!(reserve(&app, "k", 1, json!({})).await.0, 429);
    assert_eq!(end(&app, &id_of(&a2), "release", None).await.0, 200);
    assert_eq!(reserve(&app, "k", 1, json!({})).await.0, 200);
    assert_eq!(count(&app, "k", "slots").await, 2);
}

#[tokio::test]
async fn a_reservation_of_cost_0_takes_a_slot_like_any_other() {
    let app = app_with(json!({"limits": [
        {"id": "per-minute", "max": 100, "window": "1m"},
        {"id": "slots", "max": 2, "in_flight": "holds"}]}))
    .await;
    let (s1, a1) = reserve(&app, "k", 0, json!({})).await;
    let (s2, a2) = reserve(&app, "k", 0, json!({})).await;
    assert_eq!((s1, s2), (200, 200), "{a1} {a2}");
    assert_eq!(count(&app, "k", "slots").await, 2);
    // The limit is full: a third, of cost 0 or more, is refused.
    let (s3, a3) = reserve(&app, "k", 0, json!({})).await;
    assert_eq!((s3, a3["limit_id"].as_str()), (429, Some("slots")), "{a3}");
    assert_eq!(reserve(&app, "k", 3, json!({})).await.0, 429);
    // Each end gives its one slot back, and no more: the count never goes below 0.
    assert_eq!(end(&app, &id_of(&a1), "release", None).await.0, 200);
    assert_eq!(settle(&app, &id_of(&a2), json!(0)).await.0, 200);
    assert_eq!(count(&app, "k", "slots").await, 0);
    assert_eq!(count(&app, "k", "per-minute").await, 0);
    let (s, a) = reserve(&app, "k", 0, json!({})).await;
    assert_eq!(s, 200, "{a}");
    assert_eq!(count(&app, "k", "slots").await, 1);
}

#[tokio::test]
async fn a_reservation_nobody_ends_expires_once_keeping_its_estimate() {
    let app = app_with(json!({"limits": [
        {"id": "per-minute", "max": 1000, "window": "1m"},
        {"id": "slots", "max": 1, "in_flight": "holds"}], "hold": "1s"}))
    .await;
    let (s, a) = reserve(&app, "k", 40, json!({})).await;
    assert_eq!(s, 200, "{a}");
    let id = id_of(&a);
    assert_eq!(reserve(&app, "k", 1, json!({})).await.0, 429);
    // The sweep expires it (every second), not a read of it.
    eventually("the reservation expires", || async {
        let n = app.metric("quotad_holds_total{event=\"expired\"}").await;
        if n >= 1.0 {
            Ok(())
        } else {
            Err(format!("{n} expired"))
        }
    })
    .await;
    let (_, g) = get(&app, &id).await;
    assert_eq!(g["state"], "expired", "{g}");
    assert_eq!(count(&app, "k", "per-minute").await, 40);
    assert_eq!(count(&app, "k", "slots").await, 0);
    let (s, e) = settle(&app, &id, json!(10)).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{e}"
    );
    assert_eq!(count(&app, "k", "per-minute").await, 40);
    assert_eq!(
        app.metric("quotad_holds_total{event=\"expired\"}").await,
        1.0
    );
    // The slot is free again (within a sync round: a read-back under way at the expiry may
    // have installed the count from before it); a check's own `hold` wins over the policy's.
    let b = eventually("the slot is free again", || async {
        match reserve(&app, "k", 1, json!({"hold": "10m"})).await {
            (200, b) => Ok(b),
            (s, b) => Err(format!("{s} {b}")),
        }
    })
    .await;
    let expires =
        chrono::DateTime::parse_from_rfc3339(b["reservation"]["expires_at"].as_str().unwrap())
            .unwrap();
    let left = expires.timestamp_millis() - chrono::Utc::now().timestamp_millis();
    assert!((590_000..=600_000).contains(&left), "{left}");
}

#[tokio::test]
async fn bad_input_gets_a_clear_4xx_and_changes_nothing() {
    let app =
        app_with(json!({"limits": [{"id": "per-minute", "max": 1000, "window": "1m"}]})).await;
    let (_, a) = reserve(&app, "k", 10, json!({})).await;
    let id = id_of(&a);
    let unknown = "0123456789abcdef0123456789abcdef";
    let (s, e) = settle(&app, unknown, json!(1)).await;
    assert_eq!((s, e["error"]["code"].as_str()), (404, Some("not_found")));
    for bad in ["nope", "0123456789ABCDEF0123456789ABCDEF", "0123"] {
        let (s, e) = get(&app, bad).await;
        assert_eq!(
            (s, e["error"]["field"].as_str()),
            (400, Some("id")),
            "{bad}"
        );
    }
    for cost in [json!(-1), json!(1.5), json!(1_000_000_001u64), json!("7")] {
        let (s, e) = settle(&app, &id, cost.clone()).await;
        assert_eq!(
            (s, e["error"]["field"].as_str()),
            (400, Some("cost")),
            "{cost}: {e}"
        );
    }
    let (s, e) = end(&app, &id, "settle", Some(json!({}))).await;
    assert_eq!(
        (s, e["error"]["field"].as_str()),
        (400, Some("cost")),
        "{e}"
    );
    let (s, e) = end(&app, &id, "settle", Some(json!({"cost": 1, "extra": 2}))).await;
    assert_eq!(s, 400, "{e}");
    for (body, field) in [
        (
            json!({"tenant": "acme", "client": "k", "hold": "1m"}),
            "hold",
        ),
        (
            json!({"tenant": "acme", "client": "k", "reserve": true, "hold": "2h"}),
            "hold",
        ),
        (
            json!({"tenant": "acme", "client": "k", "reserve": true, "hold": "0s"}),
            "hold",
        ),
    ] {
        let r = app.check(body.clone()).await;
        let e = assert_error(r, 400, "invalid_argument").await;
        assert_eq!(e["error"]["field"], field, "{body}");
    }
    let batch = json!({"checks": [{"tenant": "acme", "client": "k", "reserve": true}]});
    let r = app
        .http
        .post(app.url("/v1/check/batch"))
        .json(&batch)
        .send()
        .await
        .unwrap();
    let e = assert_error(r, 400, "invalid_argument").await;
    assert_eq!(e["error"]["field"], "checks[0].reserve");
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [{"id": "s", "max": 2, "in_flight": "holds", "window": "1m"}]}),
        )
        .await;
    assert_eq!(
        assert_error(r, 400, "invalid_argument").await["error"]["field"],
        "limits[0]"
    );
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [{"id": "s", "max": 2, "in_flight": "some"}]}),
        )
        .await;
    assert_eq!(
        assert_error(r, 400, "invalid_argument").await["error"]["field"],
        "limits[0].in_flight"
    );
    // Nothing above changed the reservation or its count.
    assert_eq!(get(&app, &id).await.1["state"], "open");
    assert_eq!(count(&app, "k", "per-minute").await, 10);
}

#[tokio::test]
async fn a_token_sees_only_the_reservations_of_tenants_it_may_check() {
    let token = |tenants: Option<&[&str]>, secret: &str| TokenSettings {
        name: secret.to_owned(),
        hash: quotad::config::tokens::hash(secret),
        sha256: String::new(),
        role: Role::Check,
        tenants: tenants.map(|t| t.iter().map(|s| s.to_string()).collect()),
    };
    const ACME: &str = "acme-check-5f0e1d2c3b4a59687766554433221100";
    const GLOBEX: &str = "globex-check-0a1b2c3d4e5f60718293a4b5c6d7e8f9";
    let app = spawn_with(|s| {
        s.auth.tokens = vec![
            token(Some(&["acme"]), ACME),
            token(Some(&["globex"]), GLOBEX),
        ]
    })
    .await;
    let policy = json!({"limits": [{"id": "per-minute", "max": 1000, "window": "1m"}]});
    assert_eq!(app.put_quota("acme", policy).await.status(), 201);
    let r = app
        .http
        .post(app.url("/v1/check"))
        .bearer_auth(ACME)
        .json(&json!({"tenant": "acme", "client": "k", "cost": 10, "reserve": true}))
        .send()
        .await
        .unwrap();
    let id = id_of(&r.json().await.unwrap());
    let as_ = |tok: Option<&'static str>, how: &'static str| {
        let mut req = app
            .http
            .post(app.url(&format!("/v1/reservations/{id}/{how}")));
        if let Some(t) = tok {
            req = req.bearer_auth(t);
        }
        req.json(&json!({"cost": 3}))
    };
    assert_eq!(as_(None, "settle").send().await.unwrap().status(), 401);
    let r = as_(Some(GLOBEX), "settle").send().await.unwrap();
    assert_error(r, 404, "not_found").await;
    let r = as_(Some(GLOBEX), "release").send().await.unwrap();
    assert_error(r, 404, "not_found").await;
    assert_eq!(
        as_(Some(ACME), "settle").send().await.unwrap().status(),
        200
    );
}

#[tokio::test]
async fn a_restart_keeps_the_reservations_open() {
    let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let app = spawn_in(dir.clone(), |_| {}).await;
    let policy = json!({"limits": [{"id": "per-minute", "max": 1000, "window": "1m"},
                                   {"id": "slots", "max": 1, "in_flight": "holds"}]});
    assert_eq!(app.put_quota("acme", policy).await.status(), 201);
    let (_, a) = reserve(&app, "k", 100, json!({})).await;
    let id = id_of(&a);
    let (unsynced, dir) = app.stop().await;
    assert_eq!(unsynced, 0);
    let app = spawn_in(dir, |_| {}).await;
    assert_eq!(
        reserve(&app, "k", 1, json!({})).await.0,
        429,
        "the slot is still held"
    );
    let (s, b) = settle(&app, &id, json!(30)).await;
    assert_eq!((s, b["state"].as_str()), (200, Some("settled")), "{b}");
    assert_eq!(count(&app, "k", "per-minute").await, 30);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(reserve(&app, "k", 1, json!({})).await.0, 200);
}

#[tokio::test]
async fn the_usage_history_and_top_clients_count_the_settled_cost() {
    let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let app = spawn_in(dir.clone(), |_| {}).await;
    let policy = json!({"limits": [{"id": "per-minute", "max": 1000, "window": "1m"}]});
    assert_eq!(app.put_quota("acme", policy).await.status(), 201);
    // Settled below, and above, the estimate; released; expired; and a plain check.
    let mut settled = 0;
    for (estimate, cost) in [(300, 120), (100, 250)] {
        let (s, a) = reserve(&app, "k", estimate, json!({})).await;
        assert_eq!(s, 200, "{a}");
        assert_eq!(settle(&app, &id_of(&a), json!(cost)).await.0, 200);
        settled += cost;
    }
    let (_, a) = reserve(&app, "k", 200, json!({})).await;
    assert_eq!(end(&app, &id_of(&a), "release", None).await.0, 200);
    let (_, a) = reserve(&app, "k", 40, json!({"hold": "1s"})).await;
    let expiring = id_of(&a);
    assert_eq!(
        app.check(json!({"tenant": "acme", "client": "k", "cost": 5}))
            .await
            .status(),
        200
    );
    // Another client's reservation, released: it took nothing in the end.
    let (_, a) = reserve(&app, "other", 900, json!({})).await;
    assert_eq!(end(&app, &id_of(&a), "release", None).await.0, 200);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (s, g) = get(&app, &expiring).await;
    assert_eq!((s, g["state"].as_str()), (200, Some("expired")), "{g}");
    let want = settled + 40 + 5;

    // What the store recorded, read by a new instance: the cost settled, not the estimates.
    let (unsynced, dir) = app.stop().await;
    assert_eq!(unsynced, 0);
    let app = spawn_in(dir, |_| {}).await;
    let v = app.get_json("/v1/usage/acme/k/history?step=day").await;
    assert_eq!(
        (v["total"]["admitted"].as_u64(), v["total"]["cost"].as_u64()),
        (Some(5), Some(want)),
        "{v}"
    );
    let v = app.get_json("/v1/usage/acme/history?step=day").await;
    assert_eq!(v["total"]["cost"].as_u64(), Some(want), "{v}");
    let yesterday = chrono::Utc::now() - chrono::Duration::days(1);
    let from = yesterday.format("%Y-%m-%dT00:00:00Z");
    let v = app
        .get_json(&format!("/v1/usage/acme/top?from={from}"))
        .await;
    let cost_of = |client: &str| {
        v["clients"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["client"] == client)
            .unwrap_or_else(|| panic!("{client} not in {v}"))["cost"]
            .as_u64()
    };
    assert_eq!(
        (cost_of("k"), cost_of("other")),
        (Some(want), Some(0)),
        "{v}"
    );
}

#[tokio::test]
async fn a_tenant_with_as_many_open_reservations_as_allowed_is_refused_and_others_are_not() {
    let app = spawn_with(|s| s.limiter.max_open_holds_per_tenant = 3).await;
    let policy =
        json!({"limits": [{"id": "per-minute", "max": 100, "window": "1m"}], "hold": "2s"});
    assert_eq!(app.put_quota("acme", policy.clone()).await.status(), 201);
    assert_eq!(app.put_quota("beta", policy).await.status(), 201);
    let mut ids = Vec::new();
    for c in ["a", "b", "c"] {
        let (s, a) = reserve(&app, c, 1, json!({})).await;
        assert_eq!(s, 200, "{a}");
        ids.push(id_of(&a));
    }
    // The fourth open reservation of acme is refused before it is decided: nothing counted.
    let (s, a) = reserve(&app, "d", 1, json!({})).await;
    assert_eq!(
        (s, a["error"]["code"].as_str()),
        (429, Some("resource_exhausted")),
        "{a}"
    );
    assert_eq!(count(&app, "d", "per-minute").await, 0);
    // A plain check of acme, and another tenant's reservation, are not bound by it.
    assert_eq!(app.check_json("acme", "d").await.0, 200);
    let r = app
        .check(json!({"tenant": "beta", "client": "x", "reserve": true}))
        .await;
    assert_eq!(r.status(), 200);
    // An end frees a place at once; a hold nobody ends frees it at its expiry.
    assert_eq!(end(&app, &ids[0], "release", None).await.0, 200);
    let (s, a) = reserve(&app, "d", 1, json!({})).await;
    assert_eq!(s, 200, "{a}");
    assert_eq!(reserve(&app, "e", 1, json!({})).await.0, 429);
    eventually("the open reservations expire", || async {
        match reserve(&app, "e", 1, json!({})).await {
            (200, _) => Ok(()),
            (s, a) => Err(format!("{s} {a}")),
        }
    })
    .await;
}
