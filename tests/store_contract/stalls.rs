//! Strict checks through pauses of a real node: two instances (two limiters, each on its own
//! session and write shard, with the check deadline a scylla store gets by default) race 16
//! callers against a strict `max` 50 while the node's process is stopped (SIGSTOP) and
//! continued (SIGCONT), as a JVM's pauses stop it. Scylla only, and on the node's machine: the
//! process to pause is `QUOTAD_TEST_SCYLLA_PID`.

use std::sync::atomic::{AtomicU64, Ordering};

use quotad::clock::SystemClock;
use quotad::config::{StoreKind, StoreSettings};
use quotad::domain::{Policy, PolicyDoc};
use quotad::limiter::{CheckInput, Limiter, LimiterConfig, Membership};
use quotad::metrics::Metrics;

use super::*;

const PID_ENV: &str = "QUOTAD_TEST_SCYLLA_PID";
const MAX: u64 = 50;
const CALLERS: usize = 16;
const CHECKS: usize = 400;

fn node_pid() -> String {
    pid_from(PID_ENV, "the node to pause (on this machine)")
}

/// The process id `env` names, or a failure that says what it should name.
pub(crate) fn pid_from(env: &str, what: &str) -> String {
    let pid = std::env::var(env).unwrap_or_default();
    assert!(
        pid.parse::<u32>().is_ok(),
        "{env} is not set: name the process id of {what}"
    );
    pid
}

/// Sends `sig` (`-STOP`, `-KILL`...) to process `pid`.
pub(crate) fn signal(pid: &str, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// An instance: a limiter on its own store session, holding a write shard, in a fleet of two.
async fn instance(opts: &ScyllaOptions, owner: &str) -> Arc<Limiter> {
    let store = Arc::new(ScyllaStore::connect(opts.clone()).await.unwrap());
    let shard = join(&*store, owner).await;
    let membership = Arc::new(Membership::joining());
    membership.hold(shard);
    membership.set_members(2);
    let settings = StoreSettings {
        kind: StoreKind::Scylla,
        ..StoreSettings::default()
    };
    Arc::new(Limiter::new(
        store,
        Arc::new(SystemClock),
        Arc::new(Metrics::new(false)),
        LimiterConfig {
            fleet: membership,
            store_timeout: settings.check_timeout(),
            ..LimiterConfig::default()
        },
    ))
}

/// One run: `CALLERS` callers, half on each instance, make `CHECKS` checks of a fresh client
/// between them, while the node is paused for each of `pauses` (ms), the first `lead` ms into
/// the run and each next 20 ms after the last ended. Returns the checks admitted.
async fn run(fleet: &[Arc<Limiter>; 2], client: &str, lead: u64, pauses: &[u64]) -> u64 {
    let doc: PolicyDoc = serde_json::from_value(serde_json::json!({
        "limits": [{"id": "h", "max": MAX, "window": "1h"}],
        "consistency": "strict", "on_store_failure": "local"
    }))
    .unwrap();
    let policy = Arc::new(Policy::from_doc(&doc, false).unwrap());
    let (admitted, left) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    left.store(CHECKS as u64, Ordering::SeqCst);
    let mut callers = Vec::new();
    for i in 0..CALLERS {
        let (limiter, policy) = (fleet[i % 2].clone(), policy.clone());
        let (admitted, left, client) = (admitted.clone(), left.clone(), client.to_owned());
        callers.push(tokio::spawn(async move {
            let tenant = TenantId::parse("stalls").unwrap();
            let client = ClientId::parse(&client).unwrap();
            while left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let input = CheckInput {
                    tenant: &tenant,
                    client: &client,
                    resource: None,
                    cost: 1,
                    reserve: false,
                };
                if limiter.check(&policy, input).await.allowed {
                    admitted.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    if !pauses.is_empty() {
        let pid = node_pid();
        tokio::time::sleep(Duration::from_millis(lead)).await;
        for &p in pauses {
            signal(&pid, "-STOP");
            std::thread::sleep(Duration::from_millis(p));
            signal(&pid, "-CONT");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for c in callers {
        c.await.unwrap();
    }
    admitted.load(Ordering::SeqCst)
}

pub async fn strict_checks_hold_through_node_pauses(opts: &ScyllaOptions) {
    let fleet = [
        instance(opts, "stall-a").await,
        instance(opts, "stall-b").await,
    ];
    for r in 0..5 {
        let n = run(&fleet, &format!("calm-{r}"), 0, &[]).await;
        println!("run {r}, no pause: {n} admitted of max {MAX}");
        assert!(n <= MAX, "run {r}: {n} admitted");
    }
    for r in 0..5 {
        let n = run(&fleet, &format!("paused-{r}"), 5, &[300, 300]).await;
        println!("run {r}, paused 300 ms twice: {n} admitted of max {MAX}");
        assert!(n <= MAX, "run {r}: {n} admitted through two 300 ms pauses");
    }
    for (r, p) in [100u64, 200, 500].into_iter().enumerate() {
        let n = run(&fleet, &format!("short-{r}"), 5, &[p, p, p]).await;
        println!("run {r}, paused {p} ms three times: {n} admitted of max {MAX}");
        assert!(n <= MAX, "run {r}: {n} admitted through {p} ms pauses");
    }
    // Longer than the deadline: checks are decided by `local` from the last totals read. The
    // written bound: `max` plus, averaged over the instances, what each had not seen of the
    // store's count at its last answer: at most the other instance's callers in flight.
    let bound = MAX + (CALLERS / 2) as u64;
    for r in 0..3 {
        let n = run(&fleet, &format!("outage-{r}"), 5, &[3_000]).await;
        println!("run {r}, paused 3 s: {n} admitted of max {MAX} (bound {bound})");
        assert!(n <= bound, "run {r}: {n} admitted through a 3 s pause");
    }
}
