//! A deterministic simulation of a fleet: N real limiters (each with its own sync task) over one
//! shared store, on a virtual clock, against an exact sliding log.
//!
//! The shared store here is an in-memory map with one shard per instance (what the scylla store
//! does with one counter shard per instance): reads return every shard's sum and the reader's
//! own part, so the limiters' demand-weighted shares work as in production. Time moves in 1 ms
//! steps; as in `Syncer::run`, every instance writes at each multiple of `SYNC_MS` and reads back
//! `SETTLE_MS` later.
//!
//! It reports, for each traffic pattern and N = 1, 2, 3, 10: the most hits admitted over any
//! window of the limit (exact sliding log) as a fraction of `max` (over-admission), and the hits
//! admitted as a fraction of what a perfect sliding-log limiter admits on the same arrivals
//! (under-admission). Run `cargo test --test simulation -- --nocapture` to see the table.
//! A second test runs the same fleets in strict consistency, where nothing may be over-admitted.
//! A third runs them with a token bucket limit instead, against an exact token bucket. Another
//! runs small limits (1 to 60) on fleets of 2, 3 and 10, where every unit must be admitted and
//! none more.
//!
//! Two more run reservations (`holds`): a budget kept with estimates too high and too low,
//! and an in-flight limit.
//!
//! The parts: `store` (the shared counters), `model` (the traffic patterns and the exact
//! limiters the fleet is measured against), `fleet` (the instances and the run), `small` (the
//! small limits' runs), `holds` (reservations' runs); the tests are here.

mod clocks;
mod first;
mod fleet;
mod holds;
mod model;
mod regions;
mod replicas;
mod small;
mod store;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use quotad::clock::{Clock, ManualClock};
use quotad::domain::{ClientId, Policy, PolicyDoc, TenantId};
use quotad::limiter::Membership;
use quotad::limiter::{CheckInput, Limiter, LimiterConfig};
use quotad::metrics::Metrics;
use quotad::store::history::{ClientTotal, HistoryStore, Step, UsageDelta, UsagePoint};
use quotad::store::{
    BucketTotal, CounterKey, CounterRange, CounterStore, Delta, DynCounterStore, Increments,
    StoreError, StoreResult,
};
use quotad::tasks::sync::{SyncConfig, Syncer};
use rand::{Rng, SeedableRng};

use fleet::*;
use model::*;
use regions::*;
use small::*;
use store::*;

const T0: i64 = 1_767_225_600_000;
const SYNC_MS: i64 = 250;
/// What `Syncer::run` waits between a round's write and its read (a tenth of the interval).
const SETTLE_MS: i64 = 25;
const WINDOW_MS: i64 = 10_000;
const MAX: u64 = 1_000;
const DURATION_MS: i64 = 60_000;
/// Fleet membership (`quotad::tasks::fleet`): how often an instance renews its lease and reads the
/// roster, and how long an unrenewed lease lives (the defaults of `[fleet]`).
const HEARTBEAT_MS: i64 = 1_000;
const LEASE_TTL_MS: i64 = 5_000;
/// The token bucket of the third test: the same long-run rate as the window (`MAX` per
/// `WINDOW_MS`), a burst of a fifth of it: it fills in 2 s, in counter buckets of 100 ms.
const BURST: u64 = 200;
const RATE_PER_S: u64 = 100;
/// The tokens one counter bucket refills: the written error bound of a token bucket.
const BUCKET_REFILL: f64 = 10.0;

/// The seed of the arrivals: `SIM_SEED`, 7 unless set.
fn seed() -> u64 {
    std::env::var("SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7)
}

/// The targets a run of `n` instances must meet.
fn meets_target(pattern: Pattern, n: usize, o: &Outcome) -> bool {
    match (pattern, n) {
        // Under the limit nothing may be denied and nothing is over.
        (Pattern::EvenUnderLimit, _) => o.under.abs() < 1e-9 && o.over <= 0.0,
        // One instance: exact.
        (_, 1) => o.over <= 0.0,
        // The target: admitted <= limit x 1.01 over any window, and (ours)
        // no more than 1% fewer hits admitted than a perfect sliding log.
        _ => o.over <= 0.01 + 1e-9 && o.under <= 0.01 + 1e-9,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn fleet_over_admission_is_measured_against_an_exact_sliding_log() {
    let patterns = [
        Pattern::EvenUnderLimit,
        Pattern::EvenOverload,
        Pattern::SkewedOverload,
        Pattern::EdgeBursts,
        Pattern::Flood,
    ];
    println!(
        "max {MAX} per {WINDOW_MS} ms sliding window, sync every {SYNC_MS} ms, {DURATION_MS} ms simulated"
    );
    println!(
        "{:<16} {:>3} {:>9} {:>9} {:>9} {:>10} {:>10} {:>12}",
        "pattern", "N", "over", "steady", "under", "admitted", "offered", "store/1000"
    );
    let mut failures = Vec::new();
    let only: Option<usize> = std::env::var("SIM_N").ok().and_then(|v| v.parse().ok());
    for pattern in patterns {
        for n in [1usize, 2, 3, 10] {
            let only_p = std::env::var("SIM_P").ok();
            if only.is_some_and(|o| o != n)
                || only_p
                    .as_ref()
                    .is_some_and(|p| *p != format!("{pattern:?}"))
            {
                continue;
            }
            let o = simulate(n, pattern, seed(), "cached").await;
            println!(
                "{:<16} {:>3} {:>8.3}% {:>8.3}% {:>8.3}% {:>10} {:>10} {:>12.1}",
                format!("{pattern:?}"),
                n,
                o.over * 100.0,
                o.over_steady * 100.0,
                o.under * 100.0,
                o.admitted,
                o.offered,
                o.store_checks as f64 * 1000.0 / o.offered as f64
            );
            if !meets_target(pattern, n, &o) {
                failures.push(format!(
                    "{pattern:?} N={n}: over {:.3}%, under {:.3}%",
                    o.over * 100.0,
                    o.under * 100.0
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Strict consistency: every check is counted by the store before its answer, so however the
/// fleet's traffic falls, nothing is over-admitted.
#[tokio::test(flavor = "current_thread")]
async fn strict_fleets_never_over_admit() {
    println!("strict consistency, max {MAX} per {WINDOW_MS} ms, {DURATION_MS} ms simulated");
    for pattern in [
        Pattern::EvenOverload,
        Pattern::SkewedOverload,
        Pattern::EdgeBursts,
    ] {
        for n in [3usize, 10] {
            let o = simulate(n, pattern, 7, "strict").await;
            println!(
                "{:<16} {:>3} over {:>7.3}% under {:>7.3}% admitted {}",
                format!("{pattern:?}"),
                n,
                o.over * 100.0,
                o.under * 100.0,
                o.admitted
            );
            assert!(
                o.over <= 0.0,
                "{pattern:?} N={n}: over {:.3}%",
                o.over * 100.0
            );
            // Exact, not merely safe: as many admitted as the sliding log, within 1%.
            assert!(
                o.under <= 0.01,
                "{pattern:?} N={n}: under {:.3}%",
                o.under * 100.0
            );
        }
    }
}

/// A fleet that changes under 10x overload: 3 instances, a 4th joins, then one is killed
/// without draining (its lease runs out) and one stops cleanly, leaving 2. N follows the
/// leases (heartbeat and TTL as configured by default); the targets still hold.
#[tokio::test(flavor = "current_thread")]
async fn a_fleet_that_grows_and_shrinks_keeps_the_bound() {
    let events = [
        (15_000, Event::Join),
        (30_000, Event::Kill(1)),
        (40_000, Event::Leave(2)),
    ];
    println!("3 -> 4 (join at 15 s) -> 3 (kill at 30 s) -> 2 (leave at 40 s), max {MAX} per {WINDOW_MS} ms");
    let mut failures = Vec::new();
    for pattern in [
        Pattern::EvenUnderLimit,
        Pattern::EvenOverload,
        Pattern::SkewedOverload,
        Pattern::EdgeBursts,
    ] {
        let o = simulate_fleet(
            3,
            &events,
            pattern,
            seed(),
            "cached",
            Shape::Window,
            EVERY_ROUND,
        )
        .await;
        println!(
            "{:<16} over {:>7.3}% steady {:>7.3}% under {:>7.3}% admitted {} offered {}",
            format!("{pattern:?}"),
            o.over * 100.0,
            o.over_steady * 100.0,
            o.under * 100.0,
            o.admitted,
            o.offered
        );
        // Never fewer than two instances serve, so the fleet's targets apply.
        if !meets_target(pattern, 2, &o) {
            failures.push(format!(
                "{pattern:?}: over {:.3}%, under {:.3}%",
                o.over * 100.0,
                o.under * 100.0
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A token bucket on the same fleets: the written bound (burst + rate x span + one counter
/// bucket's refill, over any span) holds on one instance, and a fleet stays within 1% of it;
/// and no fewer than 1% below what an exact token bucket admits on the same arrivals.
#[tokio::test(flavor = "current_thread")]
async fn token_bucket_fleets_keep_the_written_bound() {
    println!(
        "token bucket: burst {BURST}, {RATE_PER_S}/s, bound + {BUCKET_REFILL} tokens, sync every {SYNC_MS} ms, {DURATION_MS} ms simulated"
    );
    println!(
        "{:<16} {:>3} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "pattern", "N", "over", "steady", "under", "admitted", "offered"
    );
    let mut failures = Vec::new();
    for pattern in [
        Pattern::EvenUnderLimit,
        Pattern::EvenOverload,
        Pattern::SkewedOverload,
        Pattern::EdgeBursts,
    ] {
        for n in [1usize, 3, 10] {
            let o = simulate_fleet(
                n,
                &[],
                pattern,
                seed(),
                "cached",
                Shape::Tokens,
                EVERY_ROUND,
            )
            .await;
            println!(
                "{:<16} {:>3} {:>8.3}% {:>8.3}% {:>8.3}% {:>10} {:>10}",
                format!("{pattern:?}"),
                n,
                o.over * 100.0,
                o.over_steady * 100.0,
                o.under * 100.0,
                o.admitted,
                o.offered
            );
            let ok = match (pattern, n) {
                (Pattern::EvenUnderLimit, _) => o.under.abs() < 1e-9 && o.over <= 0.0,
                (_, 1) => o.over <= 0.0 && o.under <= 0.01,
                _ => o.over <= 0.01 + 1e-9 && o.under <= 0.01 + 1e-9,
            };
            if !ok {
                failures.push(format!(
                    "{pattern:?} N={n}: over {:.3}%, under {:.3}%",
                    o.over * 100.0,
                    o.under * 100.0
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The Cassandra/ScyllaDB default: a counter nothing presses is written every 2 s
/// (`sync.max_delay_ms`), not every round. Beside the hot client at 10x its limit, 200 clients
/// of another tenant check once a second each, far below their limits: the fleet bound holds
/// for the hot one, and the quiet ones cost a write per client per 2 s per instance at most,
/// not one per round.
#[tokio::test(flavor = "current_thread")]
async fn lazy_sync_keeps_the_bound_and_writes_what_needs_counting() {
    let lazy = Lazy {
        delay_ms: 2_000,
        quiet: 200,
    };
    println!(
        "sync.max_delay_ms {} ms, {} quiet clients, max {MAX} per {WINDOW_MS} ms",
        lazy.delay_ms, lazy.quiet
    );
    println!(
        "{:<16} {:>3} {:>9} {:>9} {:>9} {:>14} {:>14}",
        "pattern", "N", "over", "steady", "under", "quiet writes", "every round"
    );
    let mut failures = Vec::new();
    for pattern in [
        Pattern::EvenUnderLimit,
        Pattern::EvenOverload,
        Pattern::SkewedOverload,
        Pattern::EdgeBursts,
        Pattern::Flood,
    ] {
        for n in [1usize, 2, 3, 10] {
            let o = simulate_fleet(n, &[], pattern, seed(), "cached", Shape::Window, lazy).await;
            // What writing every quiet client every round would have cost, had each been
            // checked on every instance in every round; the bound: one write per client and
            // instance per delay, plus the drain's.
            let every_round = (lazy.quiet * n) as u64 * (DURATION_MS / SYNC_MS) as u64;
            let bound = (lazy.quiet * n) as u64 * (DURATION_MS / lazy.delay_ms + 1) as u64;
            println!(
                "{:<16} {:>3} {:>8.3}% {:>8.3}% {:>8.3}% {:>14} {:>14}",
                format!("{pattern:?}"),
                n,
                o.over * 100.0,
                o.over_steady * 100.0,
                o.under * 100.0,
                o.quiet_writes,
                every_round
            );
            // The same bound on over-admission; under-admission may reach 2% (the reserve for
            // what other instances hold unwritten; 0.1-1.3% with seeds 1, 2, 3 and 7).
            let ok = match (pattern, n) {
                (Pattern::EvenUnderLimit, _) | (_, 1) => meets_target(pattern, n, &o),
                _ => o.over <= 0.01 + 1e-9 && o.under <= 0.02 + 1e-9,
            };
            if !ok {
                failures.push(format!(
                    "{pattern:?} N={n}: over {:.3}%, under {:.3}%",
                    o.over * 100.0,
                    o.under * 100.0
                ));
            }
            if o.quiet_writes > bound {
                failures.push(format!(
                    "{pattern:?} N={n}: {} quiet writes, more than {bound}",
                    o.quiet_writes
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Strict fleets through store failures (`on_store_failure = "local"`): a pause of 300 ms
/// (increments land, no answer in time), an outage of 3 s (every call refused) and a pause of
/// 5 s. Each instance carries on from the totals its last strict check read, within its share
/// of that headroom; over any window the fleet admits at most `max` plus the written bound of
/// a failure (docs/accuracy.md): the hits the store had counted that each instance had not
/// seen at its last answer, averaged over the instances.
#[tokio::test(flavor = "current_thread")]
async fn strict_fleets_keep_the_failure_bound_through_stalls() {
    let events = [
        (12_000, Event::Store(STALLED)),
        (12_300, Event::Store(UP)),
        (25_000, Event::Store(DOWN)),
        (28_000, Event::Store(UP)),
        (43_000, Event::Store(STALLED)),
        (48_000, Event::Store(UP)),
    ];
    println!("strict, stalls 12-12.3 s and 43-48 s, down 25-28 s, max {MAX} per {WINDOW_MS} ms");
    let mut failures = Vec::new();
    for pattern in [
        Pattern::EvenOverload,
        Pattern::SkewedOverload,
        Pattern::EdgeBursts,
    ] {
        for n in [3usize, 10] {
            let o = simulate_fleet(
                n,
                &events,
                pattern,
                seed(),
                "strict",
                Shape::Window,
                EVERY_ROUND,
            )
            .await;
            let over_hits = o.over * MAX as f64;
            println!(
                "{:<16} {:>3} over {:>6.1} hits (bound {:>5.1}) under {:>7.3}% admitted {}",
                format!("{pattern:?}"),
                n,
                over_hits,
                o.failure_bound,
                o.under * 100.0,
                o.admitted
            );
            if over_hits > o.failure_bound.ceil() {
                failures.push(format!(
                    "{pattern:?} N={n}: {over_hits} hits over, bound {}",
                    o.failure_bound
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// One limit across regions (docs/regions.md): 2 and 3 regions of two instances
/// each, syncing as on Cassandra, a client at 10x its limit spread over all of them, writes
/// reaching the other regions 50 ms later. Connected, the fleet keeps within 1% of `max`. With
/// the link cut for 30 s and healed, the over-admission stays within the written partition
/// bound (plus the fleet's 1%), windows wholly inside the cut once every instance knew of it
/// keep within 1%, and after the heal every region's replica holds every admitted hit.
#[tokio::test(flavor = "current_thread")]
async fn regions_keep_one_limit_and_the_partition_bound() {
    println!(
        "{:<7} {:<15} {:<6} {:>4} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8}  per region",
        "regions",
        "pattern",
        "budget",
        "cut",
        "over",
        "bound",
        "before",
        "during",
        "after",
        "detected"
    );
    let pct = |x: f64| {
        if x == f64::MIN {
            "-".to_owned()
        } else {
            format!("{:.1}%", x * 100.0)
        }
    };
    let mut failures = Vec::new();
    for regions in [2usize, 3] {
        let even: Vec<f64> = vec![1.0 / regions as f64; regions];
        for pattern in [Pattern::EvenOverload, Pattern::SkewedOverload] {
            for (cut, split) in [
                (None, None),
                (Some((20_000, 50_000)), None),
                (Some((20_000, 50_000)), Some(even.as_slice())),
            ] {
                let o = simulate_regions(regions, pattern, cut, split, 80_000).await;
                println!(
                    "{:<7} {:<15} {:<6} {:>4} {:>7} {:>7} {:>7} {:>7} {:>7} {:>5} ms  {:?}",
                    regions,
                    format!("{pattern:?}"),
                    if split.is_some() { "split" } else { "earned" },
                    if cut.is_some() { "30 s" } else { "none" },
                    pct(o.over),
                    pct(if cut.is_some() { o.bound } else { f64::MIN }),
                    pct(o.phases[0]),
                    pct(o.phases[1]),
                    pct(o.phases[2]),
                    o.detected_after,
                    o.per_region
                );
                let name = format!("{regions} regions {pattern:?} cut {cut:?} split {split:?}");
                let mut fail = |what: String| failures.push(format!("{name}: {what}"));
                // Connected, and inside the cut once known: the fleet's 1%.
                if o.phases[0] > 0.01 || o.phases[1] > 0.01 {
                    fail(format!("over by {:?}", o.phases));
                }
                if cut.is_none() && o.over > 0.01 {
                    fail(format!("over {:.2}% connected", o.over * 100.0));
                }
                // Across the cut: the written bound, plus the fleet's 1%.
                if cut.is_some() && o.over > o.bound + 0.01 {
                    fail(format!(
                        "over {:.2}% past the bound {:.2}%",
                        o.over * 100.0,
                        o.bound * 100.0
                    ));
                }
                // After the heal, regions that earned their budgets are a connected fleet again;
                // a fixed split that did not match the traffic leaves a shift to even out
                // (docs/regions.md: up to 5.1% with seeds 1 to 3).
                let after = if split.is_some() { 0.05 } else { 0.01 };
                if o.phases[2] > after {
                    fail(format!("{:.2}% over after the heal", o.phases[2] * 100.0));
                }
                if cut.is_some() && o.detected_after > REGION_STALE_MS + 2 * REGION_BEAT_MS {
                    fail(format!("detected after {} ms", o.detected_after));
                }
                // No region is starved while cut off.
                if o.per_region.contains(&0) {
                    fail("a region admitted nothing".into());
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Small limits (1 to 60, never refilled during a run) on fleets of 2, 3 and 10: every kind of
/// limit, one check at a time and at 10x. The fleet admits exactly what an exact limiter does,
/// a 429 comes only when the binding limit is full and says so, a 200 never shows more
/// `remaining` than is left, and the same check is admitted at the `Retry-After` of its 429.
#[tokio::test(flavor = "current_thread")]
async fn small_limits_admit_every_unit_and_never_one_more() {
    println!(
        "{:<7} {:<11} {:>4} {:>3} {:>9} {:>9} {:>8} {:>12}",
        "shape", "pace", "max", "N", "admitted", "expected", "offered", "store/1000"
    );
    let mut failures = Vec::new();
    for shape in [
        Small::Client,
        Small::Tenant,
        Small::Day,
        Small::Tokens,
        Small::Tiers,
    ] {
        for pace in [Pace::OneAtATime, Pace::Overload] {
            for max in [1u64, 2, 5, 10, 60] {
                for n in [2usize, 3, 10] {
                    // SIM_SMALL="Tiers 60 10" runs one case.
                    let case = format!("{shape:?} {max} {n}");
                    if std::env::var("SIM_SMALL").is_ok_and(|c| c != case) {
                        continue;
                    }
                    let o = simulate_small(n, max, shape, pace, seed()).await;
                    if max == 5 || max == 60 {
                        println!(
                            "{:<7} {:<11} {:>4} {:>3} {:>9} {:>9} {:>8} {:>12.1}",
                            format!("{shape:?}"),
                            format!("{pace:?}"),
                            max,
                            n,
                            o.admitted,
                            o.expected,
                            o.offered,
                            o.store_checks as f64 * 1000.0 / o.offered as f64
                        );
                    }
                    let name = format!("{shape:?} {pace:?} max {max} N={n}");
                    if o.admitted != o.expected {
                        failures.push(format!("{name}: admitted {} of {}", o.admitted, o.expected));
                    }
                    for p in o.problems.iter().take(3) {
                        failures.push(format!("{name}: {p}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
