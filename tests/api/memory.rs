//! Memory caps as an operator sees them: a flood of invented client ids against a running
//! quotad stays under `limiter.max_clients_per_tenant` and `limiter.max_counters`, every check is
//! still decided (200/429, counted in the store), and `/metrics` shows the caps at work.

use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn a_flood_of_client_ids_stays_under_the_caps_and_every_check_still_counts() {
    let app = spawn_with(|s| {
        s.limiter.max_clients_per_tenant = 20;
        s.limiter.max_counters = 50;
        // Rounds far enough apart that the flood below lands between two of them (near a cap,
        // counters unused for two rounds leave memory and make room).
        s.sync.interval_ms = quotad::config::DurationMs(1_000);
        // Checks beyond a cap are decided through the store. On a busy machine an fsync'd
        // write can outlast the 50 ms default deadline, and a missed deadline is decided by
        // `on_store_failure` (tested in outage.rs), which at a cap denies: not what this test is
        // about, so give the store time.
        s.store.timeout_ms = Some(quotad::config::DurationMs(5_000));
    })
    .await;
    let policy = json!({"limits": [{"id": "daily", "max": 2, "period": "day"}]});
    assert_eq!(app.put_quota("acme", policy.clone()).await.status(), 201);
    assert_eq!(app.put_quota("other", policy).await.status(), 201);

    // A steady client that must keep its place and its counts.
    assert_eq!(app.check_json("acme", "steady").await.0, 200);
    for wave in 0..6 {
        let checks = (0..50).map(|i| {
            let c = format!("flood-{}", wave * 50 + i);
            let app = &app;
            async move { (app.check_json("acme", &c).await.0, c) }
        });
        for (status, c) in futures::future::join_all(checks).await {
            assert_eq!(status, 200, "{c}: its first hit of max 2");
        }
    }
    // Clients beyond the cap are still limited exactly (through the store).
    for i in [150, 299] {
        let c = format!("flood-{i}");
        assert_eq!(app.check_json("acme", &c).await.0, 200, "{c} second hit");
        assert_eq!(app.check_json("acme", &c).await.0, 429, "{c} over max 2");
    }
    // Another tenant still gets memory: the cap is per tenant.
    assert_eq!(app.check_json("other", "k1").await.0, 200);
    assert_eq!(app.check_json("acme", "steady").await.0, 200);
    assert_eq!(app.check_json("acme", "steady").await.0, 429);

    // After a sync round the gauges show what memory holds.
    eventually("the gauges after a sync round", || async {
        let active = app.metric("quotad_active_counters").await;
        let pending = app.metric("quotad_sync_pending_hits").await;
        ((1.0..=21.0).contains(&active) && pending == 0.0)
            .then_some(())
            .ok_or(format!("active counters {active}, pending hits {pending}"))
    })
    .await;
    let capped = app
        .metric("quotad_memory_cap_checks_total{cap=\"tenant_clients\"}")
        .await;
    assert!(capped >= 100.0, "{capped} checks went through the store");
    assert_eq!(app.metric("quotad_sync_pending_hits").await, 0.0);

    // Nothing was lost: the store's usage shows every admitted hit.
    for (c, n) in [
        ("steady", 2),
        ("flood-0", 1),
        ("flood-150", 2),
        ("flood-299", 2),
    ] {
        let u = app.usage("acme", c).await;
        assert_eq!(u["limits"][0]["count"], n, "{c}: {u}");
    }
}
