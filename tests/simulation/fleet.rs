//! The simulated fleet: real limiters and sync tasks on a virtual clock, and the run.

use super::*;

/// What happens to the fleet during a run, at a simulated millisecond.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    /// A new instance starts, claims a free shard and reads the roster.
    Join,
    /// Instance `i` is killed (SIGKILL): its unsynced hits are lost and its lease runs out.
    Kill(usize),
    /// Instance `i` stops (SIGTERM): it drains its pending hits and releases its lease.
    Leave(usize),
    /// The store stops answering in time, or at all (`store::STALLED`, `store::DOWN`), or
    /// answers again (`store::UP`).
    Store(u8),
    /// Every instance's sync round now takes `k` intervals (a slow store: a round's write and
    /// read back take that long, and the next round starts after it), staggered by an interval
    /// from one instance to the next: each reads the others' counts as they were up to `k`
    /// intervals ago. `SlowRounds(1)` is the usual pace.
    SlowRounds(i64),
    /// The odd instances' round writes now land this many ms after the tick (0: at it), and
    /// their reads back a settle time after that: the even ones read before the odd ones'
    /// writes of the same round land (a loaded instance, or a store slow for some callers).
    LateWrites(i64),
}

/// One simulated instance: a real limiter and sync, on its own shard of the shared counters.
pub(crate) struct Instance {
    pub(crate) limiter: Arc<Limiter>,
    pub(crate) syncer: Syncer,
    pub(crate) membership: Arc<Membership>,
    /// Serving traffic (a load balancer sends it requests).
    pub(crate) alive: bool,
    /// Until when its lease lives in the store, so that it counts in N.
    pub(crate) lease_until: i64,
}

/// How lazily the fleet syncs, and the clients far below their limits beside the hot one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lazy {
    /// `sync.max_delay_ms`: the interval writes every round (the embedded store's default),
    /// 2 s is the Cassandra/ScyllaDB default.
    pub(crate) delay_ms: i64,
    /// Clients of another tenant, each checking once a second against its own limit of `MAX`
    /// per window: far below it.
    pub(crate) quiet: usize,
}

pub(crate) const EVERY_ROUND: Lazy = Lazy {
    delay_ms: SYNC_MS,
    quiet: 0,
};

pub(crate) fn start_instance(
    shared: &Arc<Shared>,
    clock: &ManualClock,
    shard: usize,
    shards: usize,
    lazy: Lazy,
) -> Instance {
    let view = Arc::new(ShardView {
        shared: shared.clone(),
        shard,
        shards,
    });
    let membership = Arc::new(Membership::alone());
    let (limiter, syncer) = limiter_and_syncer(
        view,
        shared.history.clone(),
        clock,
        &membership,
        lazy.delay_ms,
    );
    Instance {
        limiter,
        syncer,
        membership,
        alive: true,
        lease_until: i64::MAX,
    }
}

/// A limiter over `store`, on the simulation's clock and sync interval, and its sync task
/// writing the usage history to `history`.
pub(crate) fn limiter_and_syncer(
    store: DynCounterStore,
    history: Arc<Tally>,
    clock: &ManualClock,
    membership: &Arc<Membership>,
    max_sync_delay_ms: i64,
) -> (Arc<Limiter>, Syncer) {
    let cfg = LimiterConfig {
        fleet: membership.clone(),
        sync_interval_ms: SYNC_MS,
        max_sync_delay_ms,
        ..LimiterConfig::default()
    };
    let (limiter, syncer, _) = instance(store, history, Arc::new(clock.clone()), cfg);
    (limiter, syncer)
}

/// A limiter over `store` on `clock` with `cfg`, its sync task writing the usage history to
/// `history`, and its metrics.
pub(crate) fn instance(
    store: DynCounterStore,
    history: Arc<Tally>,
    clock: Arc<dyn Clock>,
    cfg: LimiterConfig,
) -> (Arc<Limiter>, Syncer, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new(false));
    let limiter = Arc::new(Limiter::new(store, clock, metrics.clone(), cfg));
    let syncer = Syncer::new(
        limiter.clone(),
        history,
        metrics.clone(),
        SyncConfig::default(),
    );
    (limiter, syncer, metrics)
}

/// One check of cost 1 by `client`, with no resource.
pub(crate) async fn check_one(
    limiter: &Limiter,
    policy: &Policy,
    tenant: &TenantId,
    client: &ClientId,
) -> quotad::limiter::Decision {
    let input = CheckInput {
        tenant,
        client,
        resource: None,
        cost: 1,
        reserve: false,
    };
    limiter.check(policy, input).await
}

/// Instances whose lease lives at `now`: N as the store's roster says it.
pub(crate) fn live_leases(fleet: &[Instance], now: i64) -> u32 {
    fleet.iter().filter(|i| i.lease_until > now).count() as u32
}

pub(crate) async fn simulate(n: usize, pattern: Pattern, seed: u64, consistency: &str) -> Outcome {
    simulate_fleet(
        n,
        &[],
        pattern,
        seed,
        consistency,
        Shape::Window,
        EVERY_ROUND,
    )
    .await
}

/// Runs `n` instances, then the fleet changes as `events` say. Traffic is spread over the
/// instances that serve at each moment, as a load balancer would.
pub(crate) async fn simulate_fleet(
    n: usize,
    events: &[(i64, Event)],
    pattern: Pattern,
    seed: u64,
    consistency: &str,
    shape: Shape,
    lazy: Lazy,
) -> Outcome {
    let clock = ManualClock::new(T0);
    let shared = Arc::new(Shared::default());
    let limit = match shape {
        Shape::Window => {
            serde_json::json!({"id": "w", "max": MAX, "window": "10s", "scope": "tenant"})
        }
        Shape::Tokens => {
            serde_json::json!({"id": "w", "burst": BURST, "rate": RATE_PER_S, "per": "1s", "scope": "tenant"})
        }
    };
    let doc: PolicyDoc = serde_json::from_value(serde_json::json!({
        "limits": [limit],
        "consistency": consistency
    }))
    .unwrap();
    let policy = Policy::from_doc(&doc, false).unwrap();
    let calm_doc: PolicyDoc = serde_json::from_value(serde_json::json!({
        "limits": [{"id": "c", "max": MAX, "window": "10s"}],
        "consistency": consistency
    }))
    .unwrap();
    let calm_policy = Policy::from_doc(&calm_doc, false).unwrap();
    let calm = TenantId::parse(QUIET_TENANT).unwrap();
    let quiet_ids: Vec<ClientId> = (0..lazy.quiet)
        .map(|i| ClientId::parse(&format!("q{i}")).unwrap())
        .collect();
    // Its own generator, so that the hot client's arrivals are the same with or without it.
    let mut quiet_rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x9e37_79b9);
    let (mut quiet_admitted, mut quiet_denied) = (0u64, 0u64);
    let shards = n + events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Join))
        .count();
    let mut fleet: Vec<Instance> = (0..n)
        .map(|i| start_instance(&shared, &clock, i, shards, lazy))
        .collect();
    for i in &fleet {
        i.membership.set_members(n as u32);
    }
    let tenant = TenantId::parse("acme").unwrap();
    let client = ClientId::parse("k").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut pending_reads: Vec<Option<Vec<CounterRange>>> = Vec::new();
    // Intervals a round takes (`Event::SlowRounds`).
    let mut round_every = 1i64;
    // How late the odd instances' writes land (`Event::LateWrites`).
    let mut late_ms = 0i64;
    let mut log: Vec<i64> = Vec::new();
    let mut who: Vec<usize> = Vec::new();
    // The reference: a perfect sliding-log limiter on the same arrivals.
    let mut exact: VecDeque<i64> = VecDeque::new();
    let mut exact_bucket = ExactBucket {
        milli_tokens: BURST as i64 * 1_000,
        at: T0,
    };
    let (mut exact_admitted, mut offered) = (0u64, 0u64);
    // Per serving instance, the hits admitted (fleet-wide) when the store last answered one of
    // its checks; and the largest failure bound of the run (see `Event::Store`).
    let mut last_seen = vec![0usize; n];
    let mut failure_bound = 0f64;
    for t in 0..DURATION_MS {
        let now = T0 + t;
        clock.set(now);
        for &(_, event) in events.iter().filter(|(at, _)| *at == t) {
            match event {
                Event::Join => {
                    let joined = start_instance(&shared, &clock, fleet.len(), shards, lazy);
                    joined.membership.set_members(live_leases(&fleet, now) + 1);
                    fleet.push(joined);
                }
                Event::Kill(i) => {
                    fleet[i].alive = false;
                    fleet[i].lease_until = now + LEASE_TTL_MS;
                }
                Event::Store(state) => {
                    if state != UP {
                        // The written bound of this failure: what the store had counted that
                        // each serving instance had not seen at its last answer, averaged.
                        let unseen: usize = last_seen.iter().map(|&s| log.len() - s).sum();
                        let bound = unseen as f64 / last_seen.len() as f64;
                        failure_bound = failure_bound.max(bound);
                    }
                    shared
                        .outage
                        .store(state, std::sync::atomic::Ordering::Relaxed);
                }
                Event::SlowRounds(k) => round_every = k.max(1),
                Event::LateWrites(ms) => late_ms = ms.clamp(0, SYNC_MS - SETTLE_MS - 1),
                Event::Leave(i) => {
                    assert_eq!(
                        fleet[i].syncer.drain().await,
                        0,
                        "a drain writes everything"
                    );
                    fleet[i].alive = false;
                    fleet[i].lease_until = now;
                }
            }
        }
        if t % HEARTBEAT_MS == 0 {
            let members = live_leases(&fleet, now);
            for i in fleet.iter().filter(|i| i.alive) {
                i.membership.set_members(members);
            }
        }
        // Rounds on wall-clock ticks, as `Syncer::run` does: every instance writes at the tick
        // and reads back a settle time later; with slow rounds, instance `i` writes at every
        // `round_every`-th tick (staggered by `i`) and reads back just before its next write;
        // with late writes, the odd instances write `late_ms` after the tick.
        let (tick, phase) = (t.div_euclid(SYNC_MS), t.rem_euclid(SYNC_MS));
        if phase == 0 {
            pending_reads.resize(fleet.len(), None);
        }
        for (k, i) in fleet.iter().enumerate() {
            let at = if k % 2 == 1 { late_ms } else { 0 };
            if phase == at && (tick + k as i64) % round_every == 0 {
                pending_reads[k] = match i.alive {
                    true => Some(i.syncer.write().await.unwrap().0),
                    false => None,
                };
            }
            if phase == at + SETTLE_MS && (tick + k as i64 + 1) % round_every == 0 {
                if let (true, Some(ranges)) = (i.alive, pending_reads[k].take()) {
                    i.syncer.read_back(&ranges).await;
                }
            }
        }
        if std::env::var("SIM_DEBUG").is_ok()
            && t % SYNC_MS == 0
            && t < std::env::var("SIM_UNTIL")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(2_000)
        {
            let exact_now = log.iter().filter(|&&x| x > now - WINDOW_MS).count();
            let mut views = Vec::new();
            for i in fleet.iter().filter(|i| i.alive) {
                let u = i
                    .limiter
                    .usage(&policy, &tenant, &client, None)
                    .await
                    .unwrap();
                views.push(u[0].count);
            }
            println!(
                "t={t} exact={exact_now} views={views:?} pending={:?}",
                fleet
                    .iter()
                    .filter(|i| i.alive)
                    .map(|i| i.limiter.pending_hits())
                    .collect::<Vec<_>>()
            );
        }
        let serving: Vec<&Instance> = fleet.iter().filter(|i| i.alive).collect();
        for q in &quiet_ids {
            if quiet_rng.random::<f64>() < 0.001 {
                let at = quiet_rng.random_range(0..serving.len());
                let d = serving[at]
                    .limiter
                    .check(
                        &calm_policy,
                        CheckInput {
                            tenant: &calm,
                            client: q,
                            resource: None,
                            cost: 1,
                            reserve: false,
                        },
                    )
                    .await;
                if d.allowed {
                    quiet_admitted += 1;
                } else {
                    quiet_denied += 1;
                }
            }
        }
        let arr = arrivals(pattern, t, serving.len(), &mut rng);
        for (i, count) in arr.iter().enumerate() {
            for _ in 0..*count {
                offered += 1;
                let d = check_one(&serving[i].limiter, &policy, &tenant, &client).await;
                if d.allowed {
                    log.push(now);
                    who.push(i);
                }
                if d.store_failure.is_none() {
                    if let Some(seen) = last_seen.get_mut(i) {
                        *seen = log.len();
                    }
                }
                if shape == Shape::Tokens {
                    exact_admitted += exact_bucket.admit(now) as u64;
                    continue;
                }
                while exact.front().is_some_and(|&x| x <= now - WINDOW_MS) {
                    exact.pop_front();
                }
                if (exact.len() as u64) < MAX {
                    exact.push_back(now);
                    exact_admitted += 1;
                }
            }
        }
    }
    assert_eq!(clock.now_ms(), T0 + DURATION_MS - 1);
    // The usage history adds up: what the live instances wrote at their drain, plus what the
    // killed ones still held unwritten (lost with them, as their unwritten hits are), is
    // exactly what the checks answered.
    for i in fleet.iter().filter(|i| i.alive) {
        assert_eq!(i.syncer.drain().await, 0, "a drain writes everything");
    }
    let (mut admitted, mut denied) = *shared.history.0.lock().unwrap();
    for i in fleet.iter().filter(|i| !i.alive) {
        for d in i.limiter.history().drain() {
            admitted += d.counts.admitted;
            denied += d.counts.denied;
        }
    }
    assert_eq!(
        (admitted, denied),
        (
            log.len() as u64 + quiet_admitted,
            offered - log.len() as u64 + quiet_denied
        ),
        "usage history against the answers"
    );
    assert_eq!(
        quiet_denied, 0,
        "the quiet clients are far below their limits"
    );
    let quiet_writes = shared
        .quiet_writes
        .load(std::sync::atomic::Ordering::Relaxed);
    let store_checks = shared
        .store_checks
        .load(std::sync::atomic::Ordering::Relaxed);
    let lost_hits = shared.lost_hits.load(std::sync::atomic::Ordering::Relaxed);
    if shape == Shape::Tokens {
        let later: Vec<i64> = log.iter().copied().filter(|&t| t >= T0 + 5_000).collect();
        return Outcome {
            over_steady: worst_over_bound(&later),
            over: worst_over_bound(&log),
            under: 1.0 - log.len() as f64 / exact_admitted as f64,
            admitted: log.len() as u64,
            offered,
            quiet_writes,
            failure_bound,
            store_checks,
            lost_hits,
        };
    }
    let worst = worst_window(&log, WINDOW_MS);
    if std::env::var("SIM_WORST").is_ok() {
        let (mut best, mut lo, mut at) = (0usize, 0usize, (0, 0));
        for hi in 0..log.len() {
            while log[hi] - log[lo] >= WINDOW_MS {
                lo += 1;
            }
            if hi - lo + 1 > best {
                best = hi - lo + 1;
                at = (lo, hi);
            }
        }
        let mut per = vec![0; who.iter().max().map_or(n, |w| n.max(w + 1))];
        let mut by_s = std::collections::BTreeMap::new();
        for k in at.0..=at.1 {
            per[who[k]] += 1;
            *by_s
                .entry((
                    (log[k] - T0)
                        / std::env::var("SIM_BIN")
                            .ok()
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(1000),
                    who[k],
                ))
                .or_insert(0) += 1;
        }
        println!(
            "worst {best} from {} to {} per instance {per:?} by second {by_s:?}",
            log[at.0] - T0,
            log[at.1] - T0
        );
    }
    // Without the first window's hits, the worst span is the worst window starting at or after
    // W (a span cut at W lies inside the window that starts at W).
    let later: Vec<i64> = log
        .iter()
        .copied()
        .filter(|&t| t >= T0 + WINDOW_MS)
        .collect();
    let steady = worst_window(&later, WINDOW_MS);
    Outcome {
        over_steady: steady as f64 / MAX as f64 - 1.0,
        over: worst as f64 / MAX as f64 - 1.0,
        under: 1.0 - log.len() as f64 / exact_admitted as f64,
        admitted: log.len() as u64,
        offered,
        quiet_writes,
        failure_bound,
        store_checks,
        lost_hits,
    }
}
