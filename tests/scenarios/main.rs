//! Behaviour tests of the limiter and the sync task together, on a real embedded store with a
//! hand-driven clock: the rig and helpers here, the tests beside the idea they test (decision,
//! sync, reads back, store failure, strict mode, memory caps, token buckets). They sit above
//! both, so the limiter needs nothing of the sync task to be tested with it. They drive the library as its
//! users do, through its public API (and the `test-support` feature's fault-injecting store), so
//! no test rig ships in it.

mod caps;
mod decision;
mod doubts;
mod failure;
mod reads;
mod strict;
mod sync;
mod tokens;

use std::sync::Arc;
use std::time::Duration;

use quotad::clock::{Clock, ManualClock};
use quotad::domain::{ClientId, OnStoreFailure, Policy, PolicyDoc, TenantId};
use quotad::limiter::{CheckInput, Decision, Limiter, LimiterConfig, Membership};
use quotad::metrics::Metrics;
use quotad::store::embedded::EmbeddedStore;
use quotad::store::faulty::{Fault, FaultyStore};
use quotad::store::{CounterKey, CounterRange, Delta, DynStore};
use quotad::tasks::sync::{SyncConfig, Syncer};

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
    rig_syncing(cfg, SyncConfig::default())
}

fn rig_syncing(cfg: LimiterConfig, sync: SyncConfig) -> Rig {
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
    let syncer = Syncer::new(limiter.clone(), faulty.clone(), metrics.clone(), sync);
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
                reserve: false,
            },
        )
        .await
}

/// The store's total of a counter's current bucket.
async fn stored(r: &Rig, t: &str, subject: &str, limit: &str, grain: quotad::domain::Grain) -> i64 {
    stored_in(&r.store, r.clock.now_ms(), t, subject, limit, grain).await
}

/// [`stored`], in a store apart from its rig (one whose syncer has run to its end).
async fn stored_in(
    store: &DynStore,
    now: i64,
    t: &str,
    subject: &str,
    limit: &str,
    grain: quotad::domain::Grain,
) -> i64 {
    let got = store
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
