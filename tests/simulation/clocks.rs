//! Clocks that disagree: one instance's wall clock offset, or stepped mid-run, against a fleet
//! that cuts its buckets on the store's clock (`quotad::clock::FleetClock`).
//!
//! Each instance's limiter runs on a fleet clock over its own wall clock (the true time plus
//! its skew) and its own monotonic clock (the true time from an arbitrary start). Measured, it
//! reads the store's clock (the true time) at the start and every 5 s, as `tasks::clock`
//! does, with a 2 ms round trip; unmeasured, its limiter runs on its wall clock, as every
//! instance did before. One client of a tenant-wide limit at 10x, spread evenly over the
//! instances; the most admitted in any span of the window (the written bound of a token
//! bucket) is measured in true time.

use super::*;
use quotad::clock::{ClockState, FleetClock};

const CLOCK_DURATION_MS: i64 = 30_000;
const READ_EVERY_MS: i64 = 5_000;
/// A reading's round trip: a fast one, answered halfway (the reading is right).
const RTT_MS: i64 = 2;
/// A slow one, whose store read its clock at the very start of the call: the reading is off by
/// half the round trip, all of its uncertainty.
const SLOW_RTT_MS: i64 = 400;

/// The true time, as a clock that may be off by `offset` and step by `step` at `step_at`.
struct Skewed {
    truth: ManualClock,
    offset: i64,
    step_at: i64,
    step: i64,
}

impl Clock for Skewed {
    fn now_ms(&self) -> i64 {
        let t = self.truth.now_ms();
        t + self.offset + if t >= self.step_at { self.step } else { 0 }
    }
}

/// What instance 0's wall clock does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Skew {
    /// Off by this many ms all along.
    Off(i64),
    /// Right, then stepped by this many ms halfway.
    Step(i64),
}

/// What the fleet limits.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ClockShape {
    /// `max` per `window_ms`, sliding.
    Window { max: u64, window_ms: i64 },
    /// The token bucket of the token test (`BURST`, `RATE_PER_S`).
    Tokens,
}

pub(crate) async fn simulate_clocks(
    n: usize,
    shape: ClockShape,
    skew: Skew,
    measured: bool,
    slow: bool,
    seed: u64,
) -> f64 {
    let truth = ManualClock::new(T0);
    let shared = Arc::new(Shared::default());
    let (limit, per_ms) = match shape {
        ClockShape::Window { max, window_ms } => (
            serde_json::json!({"id": "w", "max": max, "window": format!("{window_ms}ms"), "scope": "tenant"}),
            10.0 * max as f64 / window_ms as f64,
        ),
        ClockShape::Tokens => (
            serde_json::json!({"id": "w", "burst": BURST, "rate": RATE_PER_S, "per": "1s", "scope": "tenant"}),
            10.0 * RATE_PER_S as f64 / 1_000.0,
        ),
    };
    let doc: PolicyDoc = serde_json::from_value(serde_json::json!({ "limits": [limit] })).unwrap();
    let policy = Policy::from_doc(&doc, false).unwrap();
    let mut fleet = Vec::new();
    for i in 0..n {
        let (offset, step_at, step) = match (i, skew) {
            (0, Skew::Off(ms)) => (ms, i64::MAX, 0),
            (0, Skew::Step(ms)) => (0, T0 + CLOCK_DURATION_MS / 2, ms),
            _ => (0, i64::MAX, 0),
        };
        let wall: Arc<dyn Clock> = Arc::new(Skewed {
            truth: truth.clone(),
            offset,
            step_at,
            step,
        });
        // A monotonic clock counts from its own start.
        let mono = Arc::new(Skewed {
            truth: truth.clone(),
            offset: -T0 + 1_000 * i as i64,
            step_at: i64::MAX,
            step: 0,
        });
        let fleet_clock = Arc::new(FleetClock::new(wall.clone(), mono));
        let clock: Arc<dyn Clock> = if measured { fleet_clock.clone() } else { wall };
        let view = Arc::new(ShardView {
            shared: shared.clone(),
            shard: i,
            shards: n,
        });
        let membership = Arc::new(Membership::alone());
        membership.set_members(n as u32);
        let fleet_view = membership.clone();
        let cfg = LimiterConfig {
            fleet: membership,
            sync_interval_ms: SYNC_MS,
            max_sync_delay_ms: SYNC_MS,
            ..LimiterConfig::default()
        };
        let (limiter, syncer, _) = instance(view, shared.history.clone(), clock, cfg);
        fleet.push((limiter, syncer, fleet_clock, fleet_view));
    }
    let tenant = TenantId::parse("acme").unwrap();
    let client = ClientId::parse("k").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut reads: Vec<Vec<CounterRange>> = Vec::new();
    let (mut log, mut owed, mut next) = (Vec::new(), 0.0f64, 0usize);
    for t in 0..CLOCK_DURATION_MS {
        let now = T0 + t;
        truth.set(now);
        if measured && t % READ_EVERY_MS == 0 {
            for (i, (_, _, c, m)) in fleet.iter().enumerate() {
                // Asked now, answered a round trip later, the store's clock read halfway; the
                // uncertainty reaches the check path as `tasks::clock` passes it on.
                let sent = c.monotonic_ms();
                if slow && i == 0 {
                    c.observe(sent, sent + SLOW_RTT_MS, now);
                } else {
                    c.observe(sent, sent + RTT_MS, now + RTT_MS / 2);
                }
                if let ClockState::Measured { uncertainty_ms, .. } = c.state() {
                    m.set_clock_uncertainty(uncertainty_ms);
                }
            }
        }
        if t % SYNC_MS == 0 {
            reads.clear();
            for (_, syncer, _, _) in &fleet {
                reads.push(syncer.write().await.unwrap().0);
            }
        }
        if t % SYNC_MS == SETTLE_MS {
            for ((_, syncer, _, _), ranges) in fleet.iter().zip(&reads) {
                syncer.read_back(ranges).await;
            }
        }
        // 10x the rate, arrivals jittered around it.
        owed += per_ms * rng.random_range(0.5..1.5);
        while owed >= 1.0 {
            owed -= 1.0;
            let (limiter, _, _, _) = &fleet[next % n];
            next += 1;
            if check_one(limiter, &policy, &tenant, &client).await.allowed {
                log.push(now);
            }
        }
    }
    match shape {
        ClockShape::Window { max, window_ms } => {
            worst_window(&log, window_ms) as f64 / max as f64 - 1.0
        }
        ClockShape::Tokens => worst_over_bound(&log),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_fleet_on_the_stores_clock_keeps_the_bound_whatever_one_instance_clock_says() {
    let shapes = [
        (
            "100 per 10 s",
            ClockShape::Window {
                max: 100,
                window_ms: 10_000,
            },
        ),
        (
            "50 per 1 s",
            ClockShape::Window {
                max: 50,
                window_ms: 1_000,
            },
        ),
        ("token bucket", ClockShape::Tokens),
    ];
    let skews = [
        Skew::Off(100),
        Skew::Off(-100),
        Skew::Off(1_000),
        Skew::Off(-1_000),
        Skew::Step(1_000),
        Skew::Step(-1_000),
    ];
    println!("one instance's clock off, 10x, {CLOCK_DURATION_MS} ms: over the bound, measured (uncorrected)");
    let mut failures = Vec::new();
    for (name, shape) in shapes {
        for n in [3usize, 10] {
            let mut line = format!("{name:<13} N={n:<3}");
            for skew in skews {
                let fixed = simulate_clocks(n, shape, skew, true, false, seed()).await;
                let raw = simulate_clocks(n, shape, skew, false, false, seed()).await;
                line += &format!(" {skew:?} {:>6.2}% ({:>6.2}%)", fixed * 100.0, raw * 100.0);
                if fixed > 0.01 + 1e-9 {
                    failures.push(format!("{name} N={n} {skew:?}: {:.3}%", fixed * 100.0));
                }
            }
            println!("{line}");
        }
    }
    // The skewed instance's readings off by all their uncertainty u (a 400 ms round trip,
    // u = 201 ms), the others' right: within the written bound, what the fleet admits in 2u
    // beyond the fleet's own 1%.
    let u = SLOW_RTT_MS / 2 + 1;
    for (name, shape) in &shapes[..2] {
        let ClockShape::Window { window_ms, .. } = *shape else {
            unreachable!()
        };
        let bound = 0.01 + 2.0 * u as f64 / window_ms as f64;
        for n in [3usize, 10] {
            for skew in [Skew::Off(1_000), Skew::Off(-1_000)] {
                let over = simulate_clocks(n, *shape, skew, true, true, seed()).await;
                println!(
                    "{name:<13} N={n:<3} {skew:?}, readings {u} ms uncertain: {:.2}% (bound {:.1}%)",
                    over * 100.0,
                    bound * 100.0
                );
                if over > bound + 1e-9 {
                    failures.push(format!(
                        "{name} N={n} {skew:?} uncertain: {:.3}%",
                        over * 100.0
                    ));
                }
            }
        }
    }
    // What the correction is for: uncorrected, a clock a second off overshoots a 1 s window.
    let raw = simulate_clocks(3, shapes[1].1, Skew::Off(1_000), false, false, seed()).await;
    assert!(
        raw > 0.05,
        "uncorrected, +1 s on a 1 s window: {:.3}%",
        raw * 100.0
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
