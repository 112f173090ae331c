//! The decision: exact admission under concurrency, tiers, binding limit, windows, modes.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_checks_against_max_100_admit_exactly_100() {
    let r = Arc::new(rig());
    let p = Arc::new(policy(serde_json::json!({"limits": [
        {"id": "h", "max": 100, "period": "hour"},
        {"id": "t", "max": 1000, "window": "1m", "scope": "tenant"}]})));
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (r, p) = (r.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            // Half the racers are on a second client: its own limit is separate, the tenant's is shared.
            let (t, c) = ids("acme", if i % 2 == 0 { "k1" } else { "k2" });
            check(&r, &p, &t, &c, 1).await.allowed
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap() as u32;
    }
    assert_eq!(admitted, 200, "each client has 100 of its own");
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let (r, p) = (r.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            let (t, c) = ids("acme", "k3");
            check(&r, &p, &t, &c, 1).await.allowed
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap() as u32;
    }
    assert_eq!(admitted, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_clients_of_two_tenants_take_exactly_each_tenant_limit() {
    // Client entries and tenant entries are locked client first: many clients of two tenants
    // racing, spread over every shard, neither deadlock nor overshoot a tenant's limit.
    let r = Arc::new(rig());
    let p = Arc::new(policy(serde_json::json!({"limits": [
        {"id": "c", "max": 1000, "period": "hour"},
        {"id": "t", "max": 100, "window": "1m", "scope": "tenant"}]})));
    let mut tasks = Vec::new();
    for i in 0..800 {
        let (r, p) = (r.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            let tenant = if i % 2 == 0 { "acme" } else { "beta" };
            let (t, c) = ids(tenant, &format!("k{}", i % 97));
            (tenant, check(&r, &p, &t, &c, 1).await.allowed)
        }));
    }
    let (mut acme, mut beta) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            ("acme", true) => acme += 1,
            (_, true) => beta += 1,
            _ => {}
        }
    }
    assert_eq!((acme, beta), (100, 100));
    // The denials took nothing from the clients' own counts.
    let mut counted = 0;
    for i in 0..97 {
        for tenant in ["acme", "beta"] {
            let (t, c) = ids(tenant, &format!("k{i}"));
            counted += r.limiter.usage(&p, &t, &c, None).await.unwrap()[0].count;
        }
    }
    assert_eq!(counted, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_checks_of_a_client_share_one_read() {
    let r = Arc::new(rig());
    let p = Arc::new(policy(serde_json::json!({"limits": [
        {"id": "s", "max": 1000, "window": "1s"},
        {"id": "m", "max": 10, "period": "month"}]})));
    // A slow store: all sixteen checks arrive while the first one's read is under way.
    r.faulty.set(quotad::store::faulty::Fault::Slow);
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (r, p) = (r.clone(), p.clone());
            tokio::spawn(async move {
                let (t, c) = ids("acme", "new-client");
                check(&r, &p, &t, &c, 1).await.allowed
            })
        })
        .collect();
    let mut allowed = 0;
    for t in tasks {
        allowed += t.await.unwrap() as u32;
    }
    assert_eq!(
        allowed, 10,
        "the followers decide on the state the read installed"
    );
    let reads = r.faulty.reads.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(reads, 1, "one read of both limits, shared by every check");
}

#[tokio::test]
async fn a_denial_consumes_nothing_from_any_tier() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [
        {"id": "burst", "max": 5, "window": "1s"},
        {"id": "hourly", "max": 3, "period": "hour"}]}));
    let (t, c) = ids("acme", "k1");
    for _ in 0..3 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    let d = check(&r, &p, &t, &c, 1).await;
    assert!(!d.allowed);
    assert_eq!(d.binding.as_ref().unwrap().limit_id.as_str(), "hourly");
    let u = r.limiter.usage(&p, &t, &c, None).await.unwrap();
    assert_eq!(u[0].count, 3, "the burst tier did not count the denied hit");
    assert_eq!(u[1].count, 3);
}

#[tokio::test]
async fn an_answer_names_its_limit_whole_however_long_the_id() {
    // Answers carry the id inline up to 23 bytes and shared beyond: both must name it whole.
    for len in [1, 23, 24, 128] {
        let r = rig();
        let long = "x".repeat(len);
        let p = policy(serde_json::json!({"limits": [
            {"id": "roomy", "max": 100, "period": "hour"},
            {"id": long, "max": 1, "period": "hour"}]}));
        let (t, c) = ids("acme", "k1");
        let d = check(&r, &p, &t, &c, 1).await;
        assert!(d.allowed);
        assert_eq!(
            d.binding.unwrap().limit_id.as_str(),
            long,
            "admitted, {len} bytes"
        );
        let d = check(&r, &p, &t, &c, 1).await;
        assert!(!d.allowed);
        assert_eq!(
            d.binding.unwrap().limit_id.as_str(),
            long,
            "denied, {len} bytes"
        );
    }
}

#[tokio::test]
async fn a_denial_by_either_entry_consumes_nothing_in_the_other() {
    // The client's limits are judged before the tenant's entry is locked, and the tenant's
    // consumed before the client's: a denial on either side still takes nothing anywhere, and
    // the binding limit (and its reset) may come from either entry.
    let r = rig();
    let p = policy(serde_json::json!({"limits": [
        {"id": "c", "max": 2, "period": "hour"},
        {"id": "t", "max": 4, "window": "1m", "scope": "tenant"}]}));
    let (t, k1) = ids("acme", "k1");
    assert!(check(&r, &p, &t, &k1, 1).await.allowed);
    assert!(check(&r, &p, &t, &k1, 1).await.allowed);
    let d = check(&r, &p, &t, &k1, 1).await;
    assert!(!d.allowed);
    assert_eq!(d.binding.unwrap().limit_id.as_str(), "c");
    let u = r.limiter.usage(&p, &t, &k1, None).await.unwrap();
    assert_eq!(
        (u[0].count, u[1].count),
        (2, 2),
        "the client's denial took nothing from the tenant"
    );
    let (_, k2) = ids("acme", "k2");
    let d = check(&r, &p, &t, &k2, 1).await;
    assert!(d.allowed);
    let b = d.binding.unwrap();
    // c has 1 left, t has 1 left: the first in policy order binds.
    assert_eq!((b.limit_id.as_str(), b.remaining), ("c", 1));
    let d = check(&r, &p, &t, &k2, 1).await;
    assert!(d.allowed);
    let b = d.binding.unwrap();
    assert_eq!((b.limit_id.as_str(), b.remaining), ("c", 0));
    let (_, k3) = ids("acme", "k3");
    let d = check(&r, &p, &t, &k3, 1).await;
    assert!(!d.allowed);
    let b = d.binding.unwrap();
    assert_eq!((b.limit_id.as_str(), b.remaining), ("t", 0));
    assert!(
        b.reset_after_ms > 0,
        "the tenant's window resets when its hits leave it"
    );
    let u = r.limiter.usage(&p, &t, &k3, None).await.unwrap();
    assert_eq!(
        (u[0].count, u[1].count),
        (0, 4),
        "the tenant's denial took nothing from k3"
    );
}

#[tokio::test]
async fn binding_limit_is_the_least_remaining_or_the_longest_wait() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [
        {"id": "sec", "max": 2, "window": "1s"},
        {"id": "min", "max": 10, "period": "minute"},
        {"id": "day", "max": 2, "period": "day"}]}));
    let (t, c) = ids("acme", "k1");
    let d = check(&r, &p, &t, &c, 1).await;
    // sec and day both have 1 left: the first in policy order binds.
    assert_eq!(d.binding.unwrap().limit_id.as_str(), "sec");
    check(&r, &p, &t, &c, 1).await;
    // Both sec and day deny; day's wait is far longer.
    let d = check(&r, &p, &t, &c, 1).await;
    assert!(!d.allowed);
    let b = d.binding.unwrap();
    assert_eq!(b.limit_id.as_str(), "day");
    assert_eq!(d.retry_after_ms, Some(b.reset_after_ms));
}

#[tokio::test]
async fn a_cost_above_max_is_never_admitted_and_cost_zero_peeks() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "m", "max": 5, "period": "minute"}]}));
    let (t, c) = ids("acme", "k1");
    let d = check(&r, &p, &t, &c, 6).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after_ms, None);
    let d = check(&r, &p, &t, &c, 0).await;
    assert!(d.allowed);
    assert_eq!(d.binding.unwrap().remaining, 5);
    assert!(check(&r, &p, &t, &c, 5).await.allowed);
    let d = check(&r, &p, &t, &c, 0).await;
    assert!(d.allowed, "a peek at an exhausted limit still passes");
    assert_eq!(d.binding.unwrap().remaining, 0);
}

#[tokio::test]
async fn tenant_scope_is_shared_by_all_clients() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [
        {"id": "t", "max": 3, "period": "hour", "scope": "tenant"}]}));
    for client in ["a", "b", "c"] {
        let (t, c) = ids("acme", client);
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    let (t, c) = ids("acme", "d");
    assert!(!check(&r, &p, &t, &c, 1).await.allowed);
    let (t, c) = ids("other", "d");
    assert!(
        check(&r, &p, &t, &c, 1).await.allowed,
        "tenants are separate"
    );
}

#[tokio::test]
async fn sliding_window_admits_again_as_hits_leave_it() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "s", "max": 10, "window": "1s"}]}));
    let (t, c) = ids("acme", "k1");
    assert!(check(&r, &p, &t, &c, 10).await.allowed);
    let d = check(&r, &p, &t, &c, 1).await;
    assert!(!d.allowed);
    let wait = d.retry_after_ms.unwrap();
    assert!(wait > 0 && wait <= 1_100, "{wait}");
    r.clock.advance(wait - 1);
    assert!(
        !check(&r, &p, &t, &c, 1).await.allowed,
        "not before retry_after"
    );
    r.clock.advance(1);
    assert!(check(&r, &p, &t, &c, 1).await.allowed, "at retry_after");
}

#[tokio::test]
async fn calendar_periods_reset_at_the_utc_boundary() {
    let r = rig();
    r.clock.set(T0 + 59_000);
    let p = policy(serde_json::json!({"limits": [{"id": "m", "max": 2, "period": "minute"}]}));
    let (t, c) = ids("acme", "k1");
    assert!(check(&r, &p, &t, &c, 2).await.allowed);
    let d = check(&r, &p, &t, &c, 1).await;
    assert_eq!(d.retry_after_ms, Some(1_000));
    r.clock.set(T0 + 60_000);
    assert!(check(&r, &p, &t, &c, 1).await.allowed);
}

#[tokio::test]
async fn the_first_check_of_a_key_reads_the_store_instead_of_assuming_zero() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 5, "period": "day"}]}));
    let grain = p.limits[0].kind.grain();
    r.store
        .increment(&[Delta {
            key: CounterKey {
                tenant: "acme".into(),
                subject: "k1".into(),
                limit: "d".into(),
                grain,
            },
            start: grain.bucket_start(T0),
            delta: 5,
        }])
        .await
        .unwrap();
    let (t, c) = ids("acme", "k1");
    assert!(!check(&r, &p, &t, &c, 1).await.allowed);
}

#[tokio::test]
async fn dry_run_answers_allowed_flags_the_denial_and_counts_like_enforcement() {
    let r = rig();
    let p = policy(
        serde_json::json!({"limits": [{"id": "d", "max": 2, "period": "day"}],
        "mode": "dry_run"}),
    );
    let (t, c) = ids("acme", "k1");
    for _ in 0..2 {
        let d = check(&r, &p, &t, &c, 1).await;
        assert!(d.allowed && !d.dry_run_denied);
    }
    let d = check(&r, &p, &t, &c, 1).await;
    assert!(d.allowed && d.dry_run_denied);
    assert_eq!(d.retry_after_ms, Some(0));
    let u = r.limiter.usage(&p, &t, &c, None).await.unwrap();
    assert_eq!(
        u[0].count, 2,
        "what enforcement would have denied is not counted"
    );
}

#[tokio::test]
async fn raising_max_keeps_what_was_consumed() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 3, "period": "day"}]}));
    let (t, c) = ids("acme", "k1");
    assert!(check(&r, &p, &t, &c, 3).await.allowed);
    let raised = policy(serde_json::json!({"limits": [{"id": "d", "max": 5, "period": "day"}]}));
    let d = check(&r, &raised, &t, &c, 1).await;
    assert!(d.allowed);
    assert_eq!(d.binding.unwrap().remaining, 1);
}

#[tokio::test]
async fn bringing_in_a_batch_waits_for_no_lock_and_changes_no_count() {
    // `bring_in` runs between a batch's checks: it must skip a shard another thread holds
    // (a wait there could deadlock a batch against the sync) and leave every count as it was.
    let r = rig();
    let p = policy(serde_json::json!({"limits": [
        {"id": "a", "max": 5, "period": "hour"},
        {"id": "b", "max": 9, "window": "1m"},
        {"id": "t", "max": 50, "window": "1m", "scope": "tenant"}]}));
    let clients: Vec<_> = (0..quotad::limiter::AHEAD + 3)
        .map(|i| ids("acme", &format!("k{i}")))
        .collect();
    for (t, c) in &clients {
        assert!(check(&r, &p, t, c, 2).await.allowed);
    }
    let usage = || async {
        let mut all = Vec::new();
        for (t, c) in &clients {
            let u = r.limiter.usage(&p, t, c, None).await.unwrap();
            all.push(u.iter().map(|u| u.count).collect::<Vec<_>>());
        }
        all
    };
    let before = usage().await;
    let keys: Vec<(&str, &str)> = clients
        .iter()
        .map(|(t, c)| (t.as_str(), c.as_str()))
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let held = r.limiter.lock_every_shard();
        let keys = &keys;
        let limiter = &r.limiter;
        s.spawn(move || {
            limiter.bring_in(keys.iter().copied());
            tx.send(()).unwrap();
        });
        let returned = rx.recv_timeout(Duration::from_secs(10)).is_ok();
        drop(held);
        assert!(returned, "bring_in waited for shards another thread held");
    });
    // Unheld, it reads every level; still nothing changes.
    r.limiter.bring_in(keys.iter().copied());
    r.limiter.bring_in(keys.iter().copied().take(1));
    assert_eq!(usage().await, before);
    assert_eq!(before[0], vec![2, 2, 2 * clients.len() as u64]);
}
