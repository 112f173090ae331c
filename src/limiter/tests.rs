//! Limiter tests on a real embedded store with a hand-driven clock.

use std::sync::Arc;
use std::time::Duration;

use super::{CheckInput, Decision, Limiter, LimiterConfig};
use crate::clock::{Clock, ManualClock};
use crate::domain::{ClientId, OnStoreFailure, Policy, PolicyDoc, TenantId};
use crate::metrics::Metrics;
use crate::store::embedded::EmbeddedStore;
use crate::store::faulty::{Fault, FaultyStore};
use crate::store::{CounterKey, CounterRange, Delta, DynStore};
use crate::sync::{SyncConfig, Syncer};

const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

struct Rig {
    _dir: tempfile::TempDir,
    metrics: Arc<Metrics>,
    store: DynStore,
    faulty: Arc<FaultyStore>,
    clock: ManualClock,
    limiter: Arc<Limiter>,
    syncer: Syncer,
}

fn rig() -> Rig {
    // Generous: most tests are about decisions, not deadlines (a loaded machine makes redb
    // commits slow, and a missed deadline hands the check to on_store_failure).
    rig_with_deadline(Duration::from_secs(10))
}

fn rig_with_deadline(store_timeout: Duration) -> Rig {
    rig_with(LimiterConfig {
        shards: 8,
        idle_ms: 60_000,
        store_timeout,
        ..LimiterConfig::default()
    })
}

fn rig_with(cfg: LimiterConfig) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
    let faulty = FaultyStore::new(store.clone());
    let clock = ManualClock::new(T0);
    let metrics = Arc::new(Metrics::new(false));
    let limiter = Arc::new(Limiter::new(
        faulty.clone(),
        Arc::new(clock.clone()),
        metrics.clone(),
        cfg,
    ));
    let syncer = Syncer::new(limiter.clone(), metrics.clone(), SyncConfig::default());
    Rig {
        _dir: dir,
        metrics,
        store,
        faulty,
        clock,
        limiter,
        syncer,
    }
}

fn policy(json: serde_json::Value) -> Policy {
    let doc: PolicyDoc = serde_json::from_value(json).unwrap();
    Policy::from_doc(&doc, false).unwrap()
}

fn ids(t: &str, c: &str) -> (TenantId, ClientId) {
    (TenantId::parse(t).unwrap(), ClientId::parse(c).unwrap())
}

async fn check(r: &Rig, p: &Policy, t: &TenantId, c: &ClientId, cost: u64) -> Decision {
    r.limiter
        .check(
            p,
            CheckInput {
                tenant: t,
                client: c,
                resource: None,
                cost,
            },
        )
        .await
}

/// The store's total of a counter's current bucket.
async fn stored(r: &Rig, t: &str, subject: &str, limit: &str, grain: crate::domain::Grain) -> i64 {
    let now = r.clock.now_ms();
    let got = r
        .store
        .read(&[CounterRange {
            key: CounterKey {
                tenant: t.into(),
                subject: subject.into(),
                limit: limit.into(),
                grain,
            },
            from: 0,
            to: now + 86_400_000,
        }])
        .await
        .unwrap();
    got[0].iter().map(|b| b.total).sum()
}

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
async fn sync_writes_every_admitted_hit_exactly_once() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [
        {"id": "d", "max": 1000, "period": "day"},
        {"id": "t", "max": 1000, "period": "day", "scope": "tenant"}]}));
    let (t, c) = ids("acme", "k1");
    for _ in 0..7 {
        check(&r, &p, &t, &c, 2).await;
    }
    let round = r.syncer.round().await.unwrap();
    assert_eq!(round.written_hits, 28, "7 x 2 on each of two counters");
    assert_eq!(round.pending_after, 0);
    // A second round writes nothing more.
    assert_eq!(r.syncer.round().await.unwrap().written_hits, 0);
    let day = p.limits[0].kind.grain();
    assert_eq!(stored(&r, "acme", "k1", "d", day).await, 14);
    assert_eq!(stored(&r, "acme", "*", "t", day).await, 14);
    // The local estimate did not double count: 14 used, 986 left.
    let d = check(&r, &p, &t, &c, 0).await;
    assert_eq!(d.binding.unwrap().remaining, 986);
}

#[tokio::test]
async fn hits_admitted_while_a_sync_is_in_flight_stay_pending() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let (t, c) = ids("acme", "k1");
    check(&r, &p, &t, &c, 3).await;
    let batch = r.limiter.collect(r.clock.now_ms());
    check(&r, &p, &t, &c, 4).await; // admitted between snapshot and write
    r.store.increment(&batch.deltas).await.unwrap();
    r.limiter.written(&batch.deltas);
    assert_eq!(r.limiter.pending_hits(), 4);
    r.syncer.round().await.unwrap();
    assert_eq!(r.limiter.pending_hits(), 0);
    assert_eq!(
        stored(&r, "acme", "k1", "d", p.limits[0].kind.grain()).await,
        7
    );
}

#[tokio::test]
async fn while_the_store_is_down_hits_wait_and_are_written_when_it_returns() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let (t, c) = ids("acme", "k1");
    check(&r, &p, &t, &c, 1).await;
    r.faulty.set(Fault::Failing);
    for _ in 0..5 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    assert!(r.syncer.round().await.is_err());
    assert_eq!(r.limiter.pending_hits(), 6);
    r.faulty.set(Fault::Healthy);
    r.syncer.round().await.unwrap();
    assert_eq!(r.limiter.pending_hits(), 0);
    assert_eq!(
        stored(&r, "acme", "k1", "d", p.limits[0].kind.grain()).await,
        6
    );
}

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
async fn idle_keys_leave_memory_and_come_back_from_the_store() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 5, "period": "day"}]}));
    let (t, c) = ids("acme", "k1");
    assert!(check(&r, &p, &t, &c, 5).await.allowed);
    r.syncer.round().await.unwrap();
    r.clock.advance(61_000);
    r.syncer.round().await.unwrap();
    assert_eq!(r.limiter.evict(r.clock.now_ms()).0, 0, "evicted");
    assert!(
        !check(&r, &p, &t, &c, 1).await.allowed,
        "re-read, not reset to zero"
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
async fn a_client_slower_than_its_window_is_decided_in_memory() {
    let r = rig();
    let p = policy(serde_json::json!({"limits": [{"id": "s", "max": 5, "window": "1s"}]}));
    let (t, c) = ids("acme", "k1");
    check(&r, &p, &t, &c, 1).await;
    r.syncer.round().await.unwrap();
    for _ in 0..3 {
        r.clock.advance(1_200);
        r.syncer.round().await.unwrap();
        // With the store hanging, a check that needed it would wait for the deadline and be
        // decided by on_store_failure; a check from memory is not.
        r.faulty.set(Fault::Hanging);
        let d = check(&r, &p, &t, &c, 1).await;
        r.faulty.set(Fault::Healthy);
        assert!(d.allowed);
        assert_eq!(d.store_failure, None, "the check went to the store");
    }
}

fn capped(max_counters: usize, max_clients_per_tenant: usize) -> Rig {
    rig_with(LimiterConfig {
        shards: 8,
        store_timeout: Duration::from_secs(10),
        max_counters,
        max_clients_per_tenant,
        ..LimiterConfig::default()
    })
}

/// A metric's value in the Prometheus text, by its full series name.
fn metric(r: &Rig, series: &str) -> f64 {
    let text = r.metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} not in\n{text}"))
}

#[tokio::test]
async fn clients_beyond_the_tenant_cap_are_decided_by_the_store_and_held_nowhere() {
    let r = capped(1_000, 3);
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 2, "period": "day"}]}));
    let day = p.limits[0].kind.grain();
    for i in 0..10 {
        let (t, c) = ids("acme", &format!("k{i}"));
        assert!(check(&r, &p, &t, &c, 1).await.allowed, "k{i} first");
        assert!(check(&r, &p, &t, &c, 1).await.allowed, "k{i} second");
        assert!(!check(&r, &p, &t, &c, 1).await.allowed, "k{i} over max 2");
    }
    // Another tenant has its own cap.
    let (t, c) = ids("other", "k0");
    assert!(check(&r, &p, &t, &c, 1).await.allowed);
    let (counters, pending) = r.limiter.evict(r.clock.now_ms());
    assert_eq!(counters, 4, "3 clients of acme, 1 of other");
    assert_eq!(
        pending, 7,
        "the held clients' hits (3 x 2 + 1) wait for the sync"
    );
    // The 7 clients beyond the cap: 3 checks each, all through the store.
    assert_eq!(
        metric(&r, "quotad_memory_cap_checks_total{cap=\"tenant_clients\"}"),
        21.0
    );
    r.syncer.round().await.unwrap();
    for i in 0..10 {
        assert_eq!(
            stored(&r, "acme", &format!("k{i}"), "d", day).await,
            2,
            "k{i}"
        );
    }
}

#[tokio::test]
async fn a_flood_of_clients_neither_passes_the_counter_cap_nor_evicts_unwritten_hits() {
    let r = capped(50, 1_000);
    let p = policy(serde_json::json!({"limits": [
        {"id": "m", "max": 100, "window": "1m"},
        {"id": "d", "max": 1000, "period": "day"}]}));
    let (t, hot) = ids("acme", "hot");
    for _ in 0..5 {
        assert!(check(&r, &p, &t, &hot, 1).await.allowed);
    }
    for i in 0..200 {
        let (t, c) = ids("acme", &format!("flood-{i}"));
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
        if i % 50 == 49 {
            r.clock.advance(1_000);
            let (counters, _) = r.limiter.evict(r.clock.now_ms());
            assert!(counters <= 50, "{counters} counters in memory");
        }
    }
    // The hot client's unwritten hits are still held, and it is still decided in memory.
    assert!(r.limiter.pending_hits() >= 5);
    let d = check(&r, &p, &t, &hot, 0).await;
    assert_eq!(d.binding.unwrap().remaining, 95);
    assert!(metric(&r, "quotad_memory_cap_checks_total{cap=\"counters\"}") > 0.0);
    r.syncer.round().await.unwrap();
    let day = p.limits[1].kind.grain();
    assert_eq!(stored(&r, "acme", "hot", "d", day).await, 5);
    for i in [0, 99, 199] {
        assert_eq!(stored(&r, "acme", &format!("flood-{i}"), "d", day).await, 1);
    }
    // Under pressure, written counters unused for two sync intervals left; with the pressure
    // gone, the hot client (used within `idle_ms`) stays.
    r.clock.advance(1_000);
    let (counters, pending) = r.limiter.evict(r.clock.now_ms());
    assert_eq!((counters, pending), (2, 0));
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
async fn hits_the_store_counts_directly_reach_the_counters_held_in_memory_at_once() {
    let r = capped(1_000, 1);
    let p = policy(serde_json::json!({"limits": [
        {"id": "c", "max": 10, "period": "day"},
        {"id": "t", "max": 3, "period": "day", "scope": "tenant"}]}));
    let (t, k1) = ids("acme", "k1");
    assert!(
        check(&r, &p, &t, &k1, 1).await.allowed,
        "k1 and the tenant held in memory"
    );
    r.syncer.round().await.unwrap();
    // k2 is beyond the tenant's client cap: the store counts its hits, tenant counter included.
    let (_, k2) = ids("acme", "k2");
    assert!(check(&r, &p, &t, &k2, 1).await.allowed);
    assert!(check(&r, &p, &t, &k2, 1).await.allowed);
    // Alone, this instance reads counters back only every few rounds; the tenant counter in
    // memory must know of k2's hits without one.
    let d = check(&r, &p, &t, &k1, 1).await;
    assert!(!d.allowed, "the tenant's 3 are used: {d:?}");
    assert_eq!(d.binding.unwrap().limit_id.as_str(), "t");
}
