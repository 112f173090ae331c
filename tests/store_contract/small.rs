//! Small limits on fleets of two and three instances against a real cluster: each instance a
//! limiter on its own session and write shard, with its own sync task at the Cassandra/ScyllaDB
//! defaults, a `cached` policy of 1 and of 5 an hour. One check at a time round robin, and 16
//! callers at once: the fleet admits exactly `max`, and every 429 says the limit is full and
//! names a wait of the window, not a sync interval. Scylla only: the embedded store holds one
//! process.

use std::sync::atomic::{AtomicU64, Ordering};

use quotad::clock::SystemClock;
use quotad::config::{StoreKind, StoreSettings, SCYLLA_MAX_SYNC_DELAY_MS};
use quotad::domain::{Policy, PolicyDoc};
use quotad::limiter::{CheckInput, Decision, Limiter, LimiterConfig, Membership};
use quotad::metrics::Metrics;
use quotad::tasks::sync::{SyncConfig, Syncer};
use tokio::sync::watch;

use super::*;

const CALLERS: usize = 16;

/// An instance of a fleet of `n`: a limiter on its own session holding a write shard, and its
/// sync task.
struct Instance {
    limiter: Arc<Limiter>,
    stop: watch::Sender<bool>,
    sync: tokio::task::JoinHandle<u64>,
}

async fn instance(opts: &ScyllaOptions, owner: &str, n: u32) -> Instance {
    let store = Arc::new(ScyllaStore::connect(opts.clone()).await.unwrap());
    let shard = join(&*store, owner).await;
    let membership = Arc::new(Membership::joining());
    membership.hold(shard);
    membership.set_members(n);
    let settings = StoreSettings {
        kind: StoreKind::Scylla,
        ..StoreSettings::default()
    };
    let metrics = Arc::new(Metrics::new(false));
    let limiter = Arc::new(Limiter::new(
        store.clone(),
        Arc::new(SystemClock),
        metrics.clone(),
        LimiterConfig {
            fleet: membership,
            store_timeout: settings.check_timeout(),
            max_sync_delay_ms: SCYLLA_MAX_SYNC_DELAY_MS as i64,
            ..LimiterConfig::default()
        },
    ));
    let syncer = Syncer::new(limiter.clone(), store, metrics, SyncConfig::default());
    let (stop, rx) = watch::channel(false);
    let sync = tokio::spawn(syncer.run(rx));
    Instance {
        limiter,
        stop,
        sync,
    }
}

fn policy(max: u64) -> Arc<Policy> {
    let doc: PolicyDoc = serde_json::from_value(serde_json::json!({
        "limits": [{"id": "h", "max": max, "window": "1h"}]
    }))
    .unwrap();
    Arc::new(Policy::from_doc(&doc, false).unwrap())
}

async fn check(limiter: &Limiter, policy: &Policy, client: &str) -> Decision {
    let tenant = TenantId::parse("small").unwrap();
    let client = ClientId::parse(client).unwrap();
    let input = CheckInput {
        tenant: &tenant,
        client: &client,
        resource: None,
        cost: 1,
        reserve: false,
    };
    limiter.check(policy, input).await
}

/// What is wrong with a 429: a limit that says it has room, or a wait shorter than a minute
/// (a window of an hour frees nothing sooner).
fn wrong_denial(d: &Decision) -> Option<String> {
    let b = d.binding.as_ref()?;
    (b.remaining > 0 || d.retry_after_ms.is_none_or(|r| r < 60_000)).then(|| {
        format!(
            "a 429 with remaining {} and Retry-After {:?} ms",
            b.remaining, d.retry_after_ms
        )
    })
}

/// One at a time, round robin: `2 x max + 5` checks 20 ms apart. Returns the admitted.
async fn one_at_a_time(fleet: &[Instance], policy: &Policy, max: u64, client: &str) -> u64 {
    let mut admitted = 0;
    for i in 0..(2 * max + 5) as usize {
        let d = check(&fleet[i % fleet.len()].limiter, policy, client).await;
        if d.allowed {
            admitted += 1;
        } else if let Some(wrong) = wrong_denial(&d) {
            panic!("{client}, check {i}: {wrong}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admitted
}

/// `CALLERS` callers at once over the instances, `10 x max + 20` checks in all; then, after a
/// pause, ten more one at a time. Returns the admitted.
async fn at_once(fleet: &[Instance], policy: &Arc<Policy>, max: u64, client: &str) -> u64 {
    let (admitted, left) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(10 * max + 20)),
    );
    let mut callers = Vec::new();
    for i in 0..CALLERS {
        let limiter = fleet[i % fleet.len()].limiter.clone();
        let (admitted, left, policy) = (admitted.clone(), left.clone(), policy.clone());
        let client = client.to_owned();
        callers.push(tokio::spawn(async move {
            while left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let d = check(&limiter, &policy, &client).await;
                if d.allowed {
                    admitted.fetch_add(1, Ordering::SeqCst);
                } else if let Some(b) = d.binding.as_ref() {
                    // Racing callers may each be refused the last unit (the store counted both
                    // before either was taken back): a 429 still never says there is room.
                    assert_eq!(b.remaining, 0, "{client}: a 429 with room left");
                }
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut admitted = admitted.load(Ordering::SeqCst);
    for i in 0..10 {
        if check(&fleet[i % fleet.len()].limiter, policy, client)
            .await
            .allowed
        {
            admitted += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admitted
}

pub async fn small_limits_are_exact_on_a_fleet(opts: &ScyllaOptions) {
    for n in [2u32, 3] {
        let mut fleet = Vec::new();
        for i in 0..n {
            fleet.push(instance(opts, &format!("small-{n}-{i}"), n).await);
        }
        for max in [1u64, 5] {
            let policy = policy(max);
            let slow = one_at_a_time(&fleet, &policy, max, &format!("slow-{n}-{max}")).await;
            assert_eq!(slow, max, "N={n}, max {max}, one at a time");
            let busy = at_once(&fleet, &policy, max, &format!("busy-{n}-{max}")).await;
            assert_eq!(busy, max, "N={n}, max {max}, {CALLERS} callers");
        }
        for i in fleet {
            i.stop.send(true).unwrap();
            assert_eq!(i.sync.await.unwrap(), 0, "a drain writes everything");
        }
    }
}
