//! Reservations on a fleet: checks that hold an estimate, then settle at the real cost on any
//! instance (or are abandoned and expire, keeping the estimate), under 10x overload of a
//! budget; and an in-flight limit under 10x overload of concurrent work.
//!
//! What a reservation finally charges is counted at the instant it was taken (a settle lands in
//! the buckets of the reservation's time): the real cost when settled, the estimate when
//! abandoned. The bound measured: over any span of the window, what was charged, less the
//! under-estimates of the reservations settled in it (real cost above estimate), against the
//! budget.

use super::*;
use quotad::domain::HoldState;
use quotad::store::hold::{Charge, Hold};

/// The budget: this much real cost per [`WINDOW_MS`], tenant-wide.
pub(crate) const BUDGET: u64 = 100_000;
/// Real costs are uniform in 1..2 x this (mean this): 1% of the budget a request.
const MEAN_COST: u64 = 1_000;
/// How long an abandoned reservation is held before it expires.
const HOLD_MS: i64 = 5_000;
/// The in-flight run's cap.
pub(crate) const IN_FLIGHT: u64 = 8;

/// How estimates miss the real cost.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Estimates {
    /// 1 to 2 times the real cost.
    High,
    /// Half to 1 times the real cost.
    Low,
    /// Half to 2 times.
    Mixed,
}

impl Estimates {
    fn of(self, real: u64, rng: &mut rand::rngs::StdRng) -> u64 {
        let (lo, hi) = match self {
            Estimates::High => (1.0, 2.0),
            Estimates::Low => (0.5, 1.0),
            Estimates::Mixed => (0.5, 2.0),
        };
        ((real as f64) * rng.random_range(lo..=hi)).round().max(1.0) as u64
    }
}

pub(crate) struct HoldsOutcome {
    /// The worst span of the window: charged less settled under-estimates, over the budget,
    /// minus 1.
    pub(crate) over: f64,
    /// The same without taking the under-estimates off.
    pub(crate) over_raw: f64,
    pub(crate) taken: u64,
    pub(crate) offered: u64,
    pub(crate) abandoned: u64,
    /// The most reservations open at once (the in-flight run).
    pub(crate) most_in_flight: u64,
}

/// A reservation taken and not yet ended.
struct Open {
    at: i64,
    /// When its work ends (settle), or its hold runs out (abandoned).
    ends: i64,
    hold: Hold,
    real: u64,
    abandoned: bool,
}

/// `n` instances under 10x overload of the budget (or, `in_flight`, of [`IN_FLIGHT`]
/// concurrent works of 1 to 3 s), estimates as `est` says, a fraction `abandon` of the
/// reservations never ended.
pub(crate) async fn simulate_holds(
    n: usize,
    est: Estimates,
    abandon: f64,
    in_flight: bool,
    seed: u64,
) -> HoldsOutcome {
    let clock = ManualClock::new(T0);
    let shared = Arc::new(Shared::default());
    let limits = if in_flight {
        serde_json::json!([{"id": "slots", "max": IN_FLIGHT, "in_flight": "holds", "scope": "tenant"}])
    } else {
        serde_json::json!([{"id": "w", "max": BUDGET, "window": "10s", "scope": "tenant"}])
    };
    let doc: PolicyDoc = serde_json::from_value(serde_json::json!({ "limits": limits })).unwrap();
    let policy = Policy::from_doc(&doc, false).unwrap();
    let fleet: Vec<Instance> = (0..n)
        .map(|i| start_instance(&shared, &clock, i, n, EVERY_ROUND))
        .collect();
    for i in &fleet {
        i.membership.set_members(n as u32);
    }
    let tenant = TenantId::parse("acme").unwrap();
    let client = ClientId::parse("k").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut pending_reads: Vec<Vec<CounterRange>> = Vec::new();
    let mut open: Vec<Open> = Vec::new();
    // (taken at, finally charged, its under-estimate)
    let mut charged: Vec<(i64, u64, u64)> = Vec::new();
    let (mut offered, mut abandoned, mut most) = (0u64, 0u64, 0u64);
    // Arrivals a millisecond: 10x the budget's real cost, or ten times the cap's works (2 s
    // each on average) at once.
    let rate = if in_flight {
        10.0 * IN_FLIGHT as f64 / 2_000.0
    } else {
        10.0 * BUDGET as f64 / MEAN_COST as f64 / WINDOW_MS as f64
    };
    for t in 0..DURATION_MS {
        let now = T0 + t;
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
        // Ends due now, each on an instance picked at random (any instance may be asked).
        let (due, rest): (Vec<Open>, Vec<Open>) = open.drain(..).partition(|o| o.ends <= now);
        open = rest;
        for o in due {
            let (state, fin) = if o.abandoned {
                (HoldState::Expired, o.hold.estimate)
            } else {
                (HoldState::Settled, o.real)
            };
            let at = rng.random_range(0..n);
            let deltas = o.hold.end_deltas(state, o.real);
            fleet[at].limiter.adjust(deltas).await;
            let under = if o.abandoned {
                0
            } else {
                o.real.saturating_sub(o.hold.estimate)
            };
            charged.push((o.at, fin, under));
        }
        let mut arrivals = 0;
        while rng.random::<f64>() < rate / (1.0 + arrivals as f64) {
            arrivals += 1;
            if arrivals >= 8 {
                break;
            }
        }
        for _ in 0..arrivals {
            offered += 1;
            let real = rng.random_range(1..=2 * MEAN_COST - 1);
            let estimate = est.of(real, &mut rng);
            let input = CheckInput {
                tenant: &tenant,
                client: &client,
                resource: None,
                cost: estimate,
                reserve: true,
            };
            let inst = &fleet[rng.random_range(0..n)];
            let d = inst.limiter.check(&policy, input).await;
            if !d.allowed {
                continue;
            }
            let charges: Vec<Charge> = inst.limiter.hold_charges(&policy, input, now);
            let is_abandoned = rng.random::<f64>() < abandon;
            abandoned += is_abandoned as u64;
            let work = if in_flight {
                rng.random_range(1_000..=3_000)
            } else {
                rng.random_range(50..=2_000)
            };
            open.push(Open {
                at: now,
                ends: now + if is_abandoned { HOLD_MS } else { work },
                hold: Hold {
                    id: String::new(),
                    tenant: tenant.to_string(),
                    client: client.to_string(),
                    resource: None,
                    estimate,
                    taken_ms: now,
                    expires_ms: now + HOLD_MS,
                    charges,
                    state: HoldState::Open,
                    cost: None,
                    ended_ms: None,
                },
                real,
                abandoned: is_abandoned,
            });
        }
        most = most.max(open.len() as u64);
    }
    let (over, over_raw) = worst_charged(&charged);
    HoldsOutcome {
        over,
        over_raw,
        taken: charged.len() as u64 + open.len() as u64,
        offered,
        abandoned,
        most_in_flight: most,
    }
}

/// The worst span of [`WINDOW_MS`]: (charged less under-estimates, charged), each over the
/// budget, minus 1.
fn worst_charged(charged: &[(i64, u64, u64)]) -> (f64, f64) {
    let mut c = charged.to_vec();
    c.sort_unstable();
    let (mut net, mut raw) = (0i128, 0i128);
    let (mut worst_net, mut worst_raw) = (0i128, 0i128);
    let mut first = 0;
    for (i, &(at, fin, under)) in c.iter().enumerate() {
        net += fin as i128 - under as i128;
        raw += fin as i128;
        while c[first].0 <= at - WINDOW_MS {
            net -= c[first].1 as i128 - c[first].2 as i128;
            raw -= c[first].1 as i128;
            first += 1;
        }
        let _ = i;
        worst_net = worst_net.max(net);
        worst_raw = worst_raw.max(raw);
    }
    let b = BUDGET as f64;
    (worst_net as f64 / b - 1.0, worst_raw as f64 / b - 1.0)
}

/// What a fleet may charge beyond a budget, over any span of the window, once the
/// under-estimates of the reservations settled in it are taken off: the window's own bound
/// (one bucket's admissions), which at these costs has stayed within one reservation's largest
/// estimate (2 x 1999 of 100,000) on every seed tried (docs/reservations.md).
const RESERVATION_BOUND: f64 = 2.0 * 1_999.0 / BUDGET as f64;

#[tokio::test(flavor = "current_thread")]
async fn reservations_keep_a_budget_within_the_written_bound() {
    println!(
        "budget {BUDGET} per {WINDOW_MS} ms, costs 1 to 1999 (mean 1000), 10x overload, sync every {SYNC_MS} ms"
    );
    println!(
        "{:<6} {:>3} {:>9} {:>12} {:>10} {:>8} {:>8}",
        "est.", "N", "abandoned", "over-under", "over", "taken", "offered"
    );
    let mut failures = Vec::new();
    for n in [1usize, 3, 10] {
        for est in [Estimates::High, Estimates::Low, Estimates::Mixed] {
            for abandon in [0.0, 0.1] {
                let o = simulate_holds(n, est, abandon, false, seed()).await;
                println!(
                    "{:<6} {:>3} {:>8.0}% {:>11.3}% {:>9.3}% {:>8} {:>8}",
                    format!("{est:?}"),
                    n,
                    abandon * 100.0,
                    o.over * 100.0,
                    o.over_raw * 100.0,
                    o.taken,
                    o.offered
                );
                assert!(o.abandoned > 0 || abandon == 0.0);
                if o.over > RESERVATION_BOUND + 1e-9 {
                    failures.push(format!(
                        "{est:?} N={n} abandon {abandon}: {:.3}%",
                        o.over * 100.0
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test(flavor = "current_thread")]
async fn an_in_flight_limit_holds_no_more_than_max_on_a_fleet() {
    for n in [3usize, 10] {
        let o = simulate_holds(n, Estimates::Mixed, 0.1, true, seed()).await;
        println!(
            "in flight, N={n}: at most {} open of {IN_FLIGHT}, {} taken of {} offered",
            o.most_in_flight, o.taken, o.offered
        );
        assert!(
            o.most_in_flight <= IN_FLIGHT,
            "N={n}: {} open",
            o.most_in_flight
        );
        assert_eq!(o.most_in_flight, IN_FLIGHT, "N={n}: the cap is used whole");
    }
}
