//! First checks admitted before their read (`quotad::limiter::unread_budget`): the bound they add,
//! where it bites hardest.
//!
//! One client at 10x a sliding limit, in bursts: 100 ms of traffic spread over every instance,
//! then 600 ms of silence, long enough for every instance to forget the counter
//! (`limiter.idle_ms` 300 ms here, against a 1 s window: up to 5 loads a window). So every
//! burst begins with every instance not knowing a counter that the store holds full, and each
//! admits what its unread budget lets it before it reads. The store is full from the start, as
//! it is when a fleet restarts under a client at its limit: the instances start within the
//! first window, each adding its budget once more.
//!
//! The written bound: beyond `max`, at most `max / 100` in any window, plus the budget of each
//! instance started within it.

use super::*;

const FIRST_MAX: u64 = 10_000;
const FIRST_WINDOW_MS: i64 = 1_000;
const FIRST_IDLE_MS: i64 = 300;
const FIRST_DURATION_MS: i64 = 10_000;
/// A burst of traffic, then silence.
const ACTIVE_MS: i64 = 100;
const CYCLE_MS: i64 = 700;

pub(crate) struct FirstOutcome {
    /// The most admitted in any window, the store's prefill included, over `max`, less 1.
    pub(crate) over: f64,
    /// The same over the windows that begin a window after the start.
    pub(crate) over_steady: f64,
    /// The written bound over the whole run, as a fraction of `max`.
    pub(crate) bound: f64,
    /// First checks admitted unread, all instances.
    pub(crate) unread: u64,
    pub(crate) admitted: u64,
}

/// A limiter with `limiter.idle_ms` of [`FIRST_IDLE_MS`], on its own shard, and its sync task.
fn first_instance(
    shared: &Arc<Shared>,
    clock: &ManualClock,
    shard: usize,
    n: usize,
) -> (Arc<Limiter>, Syncer, Arc<Metrics>) {
    let view = Arc::new(ShardView {
        shared: shared.clone(),
        shard,
        shards: n,
    });
    let membership = Arc::new(Membership::alone());
    membership.set_members(n as u32);
    let cfg = LimiterConfig {
        fleet: membership,
        sync_interval_ms: SYNC_MS,
        max_sync_delay_ms: SYNC_MS,
        idle_ms: FIRST_IDLE_MS,
        ..LimiterConfig::default()
    };
    instance(view, shared.history.clone(), Arc::new(clock.clone()), cfg)
}

/// A counter's value in the metrics' text.
fn metric(metrics: &Metrics, name: &str) -> u64 {
    let text = metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

pub(crate) async fn simulate_first(n: usize, seed: u64) -> FirstOutcome {
    let clock = ManualClock::new(T0);
    let shared = Arc::new(Shared::default());
    let doc: PolicyDoc = serde_json::from_value(serde_json::json!({
        "limits": [{"id": "w", "max": FIRST_MAX, "window": "1s"}]
    }))
    .unwrap();
    let policy = Policy::from_doc(&doc, false).unwrap();
    let limit = &policy.limits[0];
    let tenant = TenantId::parse("acme").unwrap();
    let client = ClientId::parse("k").unwrap();
    // The store holds the client at its limit: an earlier fleet's hits, 200 ms before the start.
    let filled_at = T0 - 200;
    let key = CounterKey {
        tenant: "acme".into(),
        subject: "k".into(),
        limit: "w".into(),
        grain: limit.kind.grain(),
    };
    let mut prefill = vec![0; n];
    prefill[0] = FIRST_MAX as i64;
    shared
        .cells
        .lock()
        .unwrap()
        .insert((key, limit.kind.grain().bucket_start(filled_at)), prefill);
    let fleet: Vec<_> = (0..n)
        .map(|i| first_instance(&shared, &clock, i, n))
        .collect();
    let mut log: Vec<i64> = vec![filled_at; FIRST_MAX as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut reads: Vec<Vec<CounterRange>> = Vec::new();
    let mut next = 0usize;
    for t in 0..FIRST_DURATION_MS {
        let now = T0 + t;
        clock.set(now);
        if t % SYNC_MS == 0 {
            reads.clear();
            for (_, syncer, _) in &fleet {
                reads.push(syncer.write().await.unwrap().0);
            }
        }
        if t % SYNC_MS == SETTLE_MS {
            for ((_, syncer, _), ranges) in fleet.iter().zip(&reads) {
                syncer.read_back(ranges).await;
            }
        }
        if t % CYCLE_MS >= ACTIVE_MS {
            continue;
        }
        // 10x the limit's rate, a few more or fewer each millisecond.
        let rate = 10 * FIRST_MAX as i64 / FIRST_WINDOW_MS;
        let count = rate + rng.random_range(-2..=2);
        for _ in 0..count {
            let (limiter, _, _) = &fleet[next % n];
            next += 1;
            if check_one(limiter, &policy, &tenant, &client).await.allowed {
                log.push(now);
            }
        }
    }
    let budget = quotad::limiter::unread_budget(limit, n as u32, FIRST_IDLE_MS);
    let worst = worst_window(&log, FIRST_WINDOW_MS);
    let later: Vec<i64> = log
        .iter()
        .copied()
        .filter(|&t| t >= T0 + FIRST_WINDOW_MS)
        .collect();
    let steady = worst_window(&later, FIRST_WINDOW_MS);
    let unread = fleet
        .iter()
        .map(|(_, _, m)| metric(m, "quotad_unread_first_checks_total"))
        .sum();
    FirstOutcome {
        over: worst as f64 / FIRST_MAX as f64 - 1.0,
        over_steady: steady as f64 / FIRST_MAX as f64 - 1.0,
        bound: (FIRST_MAX as f64 / quotad::limiter::UNREAD_DIVISOR as f64
            + n as f64 * budget as f64)
            / FIRST_MAX as f64,
        unread,
        admitted: (log.len() - FIRST_MAX as usize) as u64,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn first_checks_admitted_unread_stay_within_the_written_bound() {
    println!(
        "max {FIRST_MAX} per {FIRST_WINDOW_MS} ms, idle {FIRST_IDLE_MS} ms, bursts of \
         {ACTIVE_MS} ms every {CYCLE_MS} ms at 10x, the store full from the start"
    );
    println!(
        "{:>3} {:>9} {:>9} {:>9} {:>8} {:>9}",
        "N", "over", "steady", "bound", "unread", "admitted"
    );
    for n in [1usize, 3, 10] {
        let o = simulate_first(n, seed()).await;
        println!(
            "{:>3} {:>8.3}% {:>8.3}% {:>8.3}% {:>8} {:>9}",
            n,
            o.over * 100.0,
            o.over_steady * 100.0,
            o.bound * 100.0,
            o.unread,
            o.admitted
        );
        // The case this runs: every burst starts with the counter unknown.
        assert!(o.unread >= 10, "N={n}: {} checks admitted unread", o.unread);
        assert!(
            o.over <= o.bound + 1e-9,
            "N={n}: over {:.3}% against a bound of {:.3}%",
            o.over * 100.0,
            o.bound * 100.0
        );
        assert!(
            o.over_steady <= 0.01 + 1e-9,
            "N={n}: steady over {:.3}%",
            o.over_steady * 100.0
        );
    }
}
