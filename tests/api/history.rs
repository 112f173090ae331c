//! Usage history: what the store records is exactly what the checks were answered.

use std::collections::BTreeMap;
use std::sync::Arc;

use quotad::clock::ManualClock;
use quotad::store::embedded::EmbeddedStore;
use quotad::store::history::HOUR_MS;
use quotad::store::DynStore;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::helpers::{spawn_on_store_at, ADMIN};

/// 2026-11-02T00:00:00Z, a Monday: the day the test drives.
const DAY0: i64 = 1_793_577_600_000;

/// (admitted, cost, denied, denied_by) as a model keeps them.
type Model = BTreeMap<(String, String, i64), (u64, u64, u64, BTreeMap<String, u64>)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_of_checks_is_recorded_hour_by_hour_as_answered() {
    let dir = tempfile::tempdir().unwrap();
    let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
    let clock = ManualClock::new(DAY0);
    let app = spawn_on_store_at(store.clone(), Arc::new(clock.clone()), |_| {}).await;
    for (tenant, max) in [("acme", 7), ("globex", 3)] {
        let r = app
            .put_quota(
                tenant,
                json!({"limits": [
                    {"id": "per-minute", "max": max, "window": "1m"},
                    {"id": "per-hour", "max": max * 4, "window": "1h"}
                ]}),
            )
            .await;
        assert_eq!(r.status(), 201);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut model = Model::new();
    let clients = ["k1", "k2", "k3"];
    for hour in 0..24 {
        // A few bursts an hour, each inside one minute.
        for burst in 0..3 {
            clock.set(DAY0 + hour * HOUR_MS + burst * 10 * 60_000 + rng.random_range(0..1_000));
            let mut batch = Vec::new();
            for _ in 0..rng.random_range(0..12) {
                let tenant = if rng.random_bool(0.6) {
                    "acme"
                } else {
                    "globex"
                };
                let client = clients[rng.random_range(0..clients.len())];
                let cost = rng.random_range(0..3u64);
                batch.push(json!({"tenant": tenant, "client": client, "cost": cost}));
            }
            if batch.is_empty() {
                continue;
            }
            // Half the bursts one check at a time, half as one batch: both are recorded.
            let answers: Vec<serde_json::Value> = if burst % 2 == 0 {
                let mut out = Vec::new();
                for c in &batch {
                    let r = app.check(c.clone()).await;
                    let status = r.status().as_u16();
                    let mut body: serde_json::Value = r.json().await.unwrap();
                    assert_eq!(body["allowed"], status == 200, "{body}");
                    body["status"] = status.into();
                    out.push(body);
                }
                out
            } else {
                let r = app
                    .http
                    .post(app.url("/v1/check/batch"))
                    .json(&json!({"checks": batch}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                let body: serde_json::Value = r.json().await.unwrap();
                body["results"].as_array().unwrap().clone()
            };
            for (c, a) in batch.iter().zip(&answers) {
                let key = (
                    c["tenant"].as_str().unwrap().to_owned(),
                    c["client"].as_str().unwrap().to_owned(),
                    DAY0 + hour * HOUR_MS,
                );
                let m = model.entry(key).or_default();
                if a["allowed"] == true {
                    m.0 += 1;
                    m.1 += c["cost"].as_u64().unwrap();
                } else {
                    m.2 += 1;
                    *m.3.entry(a["limit_id"].as_str().unwrap().to_owned())
                        .or_default() += 1;
                }
            }
        }
    }
    let (unsynced, _dir) = app.stop().await;
    assert_eq!(unsynced, 0);
    assert!(
        model.values().any(|m| m.2 > 0) && model.values().any(|m| m.0 > 0),
        "the traffic both admits and denies"
    );

    // A new instance on the same store answers the history routes: every client's every
    // hour, zero or not, equals what its checks were answered.
    let app = spawn_on_store_at(store.clone(), Arc::new(clock.clone()), |_| {}).await;
    let span = "from=2026-11-02T00:00:00Z&to=2026-11-03T00:00:00Z";
    for tenant in ["acme", "globex"] {
        let mut tenant_day = (0, 0, 0);
        let mut by_client = Vec::new();
        for client in clients {
            let v = app
                .get_json(&format!("/v1/usage/{tenant}/{client}/history?{span}"))
                .await;
            let points = v["points"].as_array().unwrap();
            assert_eq!(points.len(), 24, "{v}");
            let mut client_day = (0, 0, 0);
            for (hour, p) in (0..24).zip(points) {
                let start = DAY0 + hour * HOUR_MS;
                let want = model
                    .get(&(tenant.to_owned(), client.to_owned(), start))
                    .cloned()
                    .unwrap_or_default();
                assert_eq!(p["start"], rfc3339(start));
                let got: (u64, u64, u64, BTreeMap<String, u64>) = (
                    p["admitted"].as_u64().unwrap(),
                    p["cost"].as_u64().unwrap(),
                    p["denied"].as_u64().unwrap(),
                    serde_json::from_value(p["denied_by"].clone()).unwrap(),
                );
                assert_eq!(got, want, "{tenant}/{client} at hour {hour}");
                client_day.0 += want.0;
                client_day.1 += want.1;
                client_day.2 += want.2;
            }
            let total = &v["total"];
            assert_eq!(total["cost"].as_u64(), Some(client_day.1), "{v}");
            let v = app
                .get_json(&format!(
                    "/v1/usage/{tenant}/{client}/history?{span}&step=day"
                ))
                .await;
            assert_eq!(counts(&v["points"][0]), client_day, "{tenant}/{client} day");
            tenant_day.0 += client_day.0;
            tenant_day.1 += client_day.1;
            tenant_day.2 += client_day.2;
            by_client.push((client_day.1, client_day.0, client, client_day.2));
        }
        let v = app
            .get_json(&format!("/v1/usage/{tenant}/history?{span}&step=day"))
            .await;
        assert_eq!(counts(&v["points"][0]), tenant_day, "{tenant}'s day");

        // Top: by cost, then admitted, then name; the same figures.
        by_client.sort_by(|a, b| (b.0, b.1).cmp(&(a.0, a.1)).then(a.2.cmp(b.2)));
        let v = app
            .get_json(&format!("/v1/usage/{tenant}/top?{span}&limit=2"))
            .await;
        let seen = by_client.iter().filter(|c| c.0 + c.1 + c.3 > 0).count();
        assert_eq!(v["clients_seen"].as_u64(), Some(seen as u64), "{v}");
        let top: Vec<(u64, u64, &str, u64)> = v["clients"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["cost"].as_u64().unwrap(),
                    c["admitted"].as_u64().unwrap(),
                    c["client"].as_str().unwrap(),
                    c["denied"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(top, by_client[..2], "{tenant}'s top clients");

        // The same history as CSV: a header, then one line per hour adding up the same.
        let csv = app
            .http
            .get(app.url(&format!("/v1/usage/{tenant}/history?{span}")))
            .bearer_auth(ADMIN)
            .header("accept", "text/csv")
            .send()
            .await
            .unwrap();
        assert!(csv.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv"));
        let text = csv.text().await.unwrap();
        let mut lines = text.lines();
        assert!(lines
            .next()
            .unwrap()
            .starts_with("start,admitted,cost,denied"));
        let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        assert_eq!(rows.len(), 24);
        let col = |i: usize| {
            rows.iter()
                .map(|r| r[i].parse::<u64>().unwrap())
                .sum::<u64>()
        };
        assert_eq!((col(1), col(2), col(3)), tenant_day, "{tenant}'s CSV");
    }
    app.stop().await;
}

fn counts(p: &serde_json::Value) -> (u64, u64, u64) {
    (
        p["admitted"].as_u64().unwrap(),
        p["cost"].as_u64().unwrap(),
        p["denied"].as_u64().unwrap(),
    )
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
