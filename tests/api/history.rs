//! Usage history: what the store records is exactly what the checks were answered.

use std::collections::BTreeMap;
use std::sync::Arc;

use quotad::clock::ManualClock;
use quotad::store::embedded::EmbeddedStore;
use quotad::store::history::{Step, DAY_MS, HOUR_MS};
use quotad::store::DynStore;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::helpers::spawn_on_store_at;

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

    // Every client's every hour, zero or not, equals what its checks were answered.
    for tenant in ["acme", "globex"] {
        let mut tenant_day = (0, 0, 0);
        for client in clients {
            let points = store
                .usage_points(tenant, Some(client), Step::Hour, DAY0, DAY0 + DAY_MS)
                .await
                .unwrap();
            let stored: BTreeMap<i64, _> = points.iter().map(|p| (p.start, &p.counts)).collect();
            let mut client_day = (0, 0, 0);
            for hour in 0..24 {
                let start = DAY0 + hour * HOUR_MS;
                let want = model
                    .get(&(tenant.to_owned(), client.to_owned(), start))
                    .cloned()
                    .unwrap_or_default();
                let got = stored
                    .get(&start)
                    .map(|c| (c.admitted, c.cost, c.denied, c.denied_by.clone()))
                    .unwrap_or_default();
                assert_eq!(got, want, "{tenant}/{client} at hour {hour}");
                client_day.0 += want.0;
                client_day.1 += want.1;
                client_day.2 += want.2;
            }
            let day = store
                .usage_points(tenant, Some(client), Step::Day, DAY0, DAY0 + DAY_MS)
                .await
                .unwrap();
            let got = day
                .first()
                .map(|p| (p.counts.admitted, p.counts.cost, p.counts.denied))
                .unwrap_or_default();
            assert_eq!(got, client_day, "{tenant}/{client} for the day");
            tenant_day.0 += client_day.0;
            tenant_day.1 += client_day.1;
            tenant_day.2 += client_day.2;
        }
        let day = store
            .usage_points(tenant, None, Step::Day, DAY0, DAY0 + DAY_MS)
            .await
            .unwrap();
        let got = day
            .first()
            .map(|p| (p.counts.admitted, p.counts.cost, p.counts.denied))
            .unwrap_or_default();
        assert_eq!(got, tenant_day, "{tenant}'s totals for the day");
        let seen = store
            .clients_seen(tenant, DAY0, DAY0 + DAY_MS)
            .await
            .unwrap();
        let cost: u64 = seen.iter().map(|c| c.cost).sum();
        assert_eq!(cost, tenant_day.1, "{tenant}'s index of clients");
    }
}
