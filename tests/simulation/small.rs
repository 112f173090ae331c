//! Small limits on a fleet: every unit admitted, never one more, and answers that agree with
//! what the fleet has counted.
//!
//! Limits of 1 to 60 an hour (or a day, or a token bucket refilling one an hour), so that no
//! unit comes back during a run: a fleet that leaves a unit to nobody admits fewer than `max`
//! for good. Each run checks every answer against the exact count of the fleet's admissions:
//! a 429 only where the binding limit is full, with `remaining` 0 and a `Retry-After` after
//! which the same check is admitted; a 200 never showing more `remaining` than is left.

use super::*;

/// What the small limit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Small {
    /// `max` an hour, one client.
    Client,
    /// `max` an hour for the tenant, four clients taking turns.
    Tenant,
    /// `max` a calendar day, one client.
    Day,
    /// A token bucket of burst `max`, refilling one an hour, one client.
    Tokens,
    /// Two tiers, all or nothing: `max` an hour per client and `2 x max - 1` for the tenant
    /// (64 at most: a small limit too), two clients taking turns.
    Tiers,
}

/// How the checks arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pace {
    /// One check every 20 ms, round robin over the instances.
    OneAtATime,
    /// Ten times what the limit admits, within 2 s, at random instances (several in one ms).
    Overload,
}

pub(crate) struct SmallOutcome {
    pub(crate) admitted: u64,
    pub(crate) expected: u64,
    pub(crate) offered: u64,
    /// Checks decided through the store (increment and read back).
    pub(crate) store_checks: u64,
    /// Answers that disagree with the fleet's count, and a `Retry-After` not kept.
    pub(crate) problems: Vec<String>,
}

const HOUR_MS: i64 = 3_600_000;
const TICK_MS: i64 = 20;
/// The pause between the checks and the last few, one at a time.
const PAUSE_MS: i64 = 8_000;

/// The policy of a shape at `max`, the clients that take turns, and what an exact fleet admits
/// given enough demand.
fn small_policy(shape: Small, max: u64) -> (Policy, Vec<ClientId>, u64) {
    let tenant_max = (2 * max - 1).min(64);
    let (limits, clients, expected) = match shape {
        Small::Client => (
            serde_json::json!([{"id": "w", "max": max, "window": "1h"}]),
            1,
            max,
        ),
        Small::Tenant => (
            serde_json::json!([{"id": "w", "max": max, "window": "1h", "scope": "tenant"}]),
            4,
            max,
        ),
        Small::Day => (
            serde_json::json!([{"id": "w", "max": max, "period": "day"}]),
            1,
            max,
        ),
        Small::Tokens => (
            serde_json::json!([{"id": "w", "burst": max, "rate": 1, "per": "1h"}]),
            1,
            max,
        ),
        Small::Tiers => (
            serde_json::json!([
                {"id": "c", "max": max, "window": "1h"},
                {"id": "t", "max": tenant_max, "window": "1h", "scope": "tenant"}
            ]),
            2,
            tenant_max.min(2 * max),
        ),
    };
    let doc: PolicyDoc = serde_json::from_value(serde_json::json!({"limits": limits})).unwrap();
    let clients = (0..clients)
        .map(|i| ClientId::parse(&format!("k{i}")).unwrap())
        .collect();
    (Policy::from_doc(&doc, false).unwrap(), clients, expected)
}

/// The checks of a run: (ms from the start, instance).
fn small_arrivals(pace: Pace, n: usize, expected: u64, seed: u64) -> Vec<(i64, usize)> {
    let mut out = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let first = match pace {
        Pace::OneAtATime => {
            for i in 0..(2 * expected + 5) as i64 {
                out.push((i * TICK_MS, i as usize % n));
            }
            (2 * expected + 5) as i64 * TICK_MS
        }
        Pace::Overload => {
            for _ in 0..10 * expected {
                out.push((rng.random_range(0..2_000), rng.random_range(0..n)));
            }
            out.sort();
            2_000
        }
    };
    for i in 0..10 {
        out.push((first + PAUSE_MS + i * TICK_MS, i as usize % n));
    }
    out
}

/// A run of `n` instances on a small limit (see the module comment).
pub(crate) async fn simulate_small(
    n: usize,
    max: u64,
    shape: Small,
    pace: Pace,
    seed: u64,
) -> SmallOutcome {
    let clock = ManualClock::new(T0);
    let shared = Arc::new(Shared::default());
    let fleet: Vec<Instance> = (0..n)
        .map(|i| start_instance(&shared, &clock, i, n, EVERY_ROUND))
        .collect();
    for i in &fleet {
        i.membership.set_members(n as u32);
    }
    let (policy, clients, expected) = small_policy(shape, max);
    let tenant = TenantId::parse("acme").unwrap();
    let tenant_max = policy.limits.iter().map(|l| l.max).max().unwrap();
    let arrivals = small_arrivals(pace, n, expected, seed);
    let end = arrivals.last().map_or(0, |a| a.0) + 1;
    // The fleet's exact count: per client, and for the tenant.
    let mut per_client = vec![0u64; clients.len()];
    let mut admitted = 0u64;
    let mut problems = Vec::new();
    // The last denial: when, whose, and the wait it named.
    let mut last_denial: Option<(i64, usize, i64)> = None;
    let mut next = arrivals.iter().peekable();
    let mut pending_reads: Vec<Vec<CounterRange>> = Vec::new();
    let mut turn = 0usize;
    for t in 0..end {
        let now = T0 + t;
        let checks_now = next.peek().is_some_and(|a| a.0 == t);
        if t % SYNC_MS != 0 && t % SYNC_MS != SETTLE_MS && !checks_now {
            continue;
        }
        clock.set(now);
        if t % SYNC_MS == 0 {
            pending_reads.clear();
            for i in &fleet {
                pending_reads.push(i.syncer.write().await.unwrap().0);
            }
        }
        if t % SYNC_MS == SETTLE_MS {
            for (i, ranges) in fleet.iter().zip(&pending_reads) {
                i.syncer.read_back(ranges).await;
            }
        }
        while let Some(&&(_, at)) = next.peek().filter(|a| a.0 == t) {
            next.next();
            let c = turn % clients.len();
            turn += 1;
            let d = check_one(&fleet[at].limiter, &policy, &tenant, &clients[c]).await;
            let b = d.binding.clone().expect("a limit applies");
            if std::env::var("SIM_DEBUG").is_ok() {
                println!("t={t} at={at} c={c} {d:?}");
            }
            // What is truly left of the binding limit after this answer.
            let full = |admitted: u64, mine: u64| {
                if b.limit_id == "t" || shape == Small::Tenant {
                    tenant_max - admitted
                } else {
                    max - mine
                }
            };
            if d.allowed {
                admitted += 1;
                per_client[c] += 1;
                let left = full(admitted, per_client[c]);
                if b.remaining > left {
                    problems.push(format!(
                        "t={t}: a 200 says {} remaining of {}, {left} left",
                        b.remaining, b.limit_id
                    ));
                }
            } else {
                let left = full(admitted, per_client[c]);
                if left > 0 || b.remaining > 0 {
                    problems.push(format!(
                        "t={t}: a 429 by {} with {left} left, saying {} remaining",
                        b.limit_id, b.remaining
                    ));
                }
                match d.retry_after_ms {
                    Some(r) if r >= 10 * 60_000 => last_denial = Some((now, c, r)),
                    r => problems.push(format!("t={t}: a 429 with Retry-After {r:?} ms")),
                }
            }
        }
    }
    // The fleet writes everything; then, at the wait the last denial named, with nothing
    // else counted since, the same check is admitted.
    for i in &fleet {
        assert_eq!(i.syncer.drain().await, 0, "a drain writes everything");
    }
    if let Some((at, c, wait)) = last_denial {
        clock.set(at + wait);
        let d = check_one(&fleet[0].limiter, &policy, &tenant, &clients[c]).await;
        if !d.allowed {
            problems.push(format!(
                "the same check {wait} ms after its 429 was refused again (Retry-After {:?})",
                d.retry_after_ms
            ));
        }
        assert!(wait <= 25 * HOUR_MS, "a wait of {wait} ms");
    }
    SmallOutcome {
        admitted,
        expected,
        offered: arrivals.len() as u64,
        store_checks: shared
            .store_checks
            .load(std::sync::atomic::Ordering::Relaxed),
        problems,
    }
}
