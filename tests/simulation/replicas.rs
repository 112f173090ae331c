//! A replicated store that loses a replica: the fleet's bound through writes of unknown
//! outcome.

use super::*;

/// A replica of three lost for 10 s, the cluster answering through the others: every third
/// counter update (one the lost replica was to lead) is not applied and is answered as of
/// unknown outcome, and reads answer. The instance that wrote it knows what it admitted: its
/// own hits a read does not show stay counted, against its own share, until a read shows them.
/// The other instances cannot see them, so over any window the fleet admits at most `max`,
/// plus its 1%, plus the hits in lost updates (the others' part of them, printed against
/// (N-1)/N of them); and no fewer than a perfect sliding log less 1%.
#[tokio::test(flavor = "current_thread")]
async fn a_lost_replica_leaves_the_fleet_within_the_others_part_of_the_lost_hits() {
    let events = [
        (12_000, Event::Store(LEADER_LOST)),
        (22_000, Event::Store(UP)),
    ];
    let mut failures = Vec::new();
    for pattern in [Pattern::EvenOverload, Pattern::SkewedOverload] {
        for n in [2usize, 3] {
            let o = simulate_fleet(
                n,
                &events,
                pattern,
                seed(),
                "cached",
                Shape::Window,
                EVERY_ROUND,
            )
            .await;
            let over_hits = o.over * MAX as f64;
            let bound = o.lost_hits as f64 + 0.01 * MAX as f64;
            println!(
                "{:<16} {:>3} over {:>6.1} hits ({:>4.2} of the {} hits lost; (N-1)/N {:>4.2}) under {:>7.3}% admitted {}",
                format!("{pattern:?}"),
                n,
                over_hits,
                over_hits / o.lost_hits.max(1) as f64,
                o.lost_hits,
                (n - 1) as f64 / n as f64,
                o.under * 100.0,
                o.admitted,
            );
            if o.lost_hits == 0 || over_hits > bound + 1e-9 || o.under > 0.01 + 1e-9 {
                failures.push(format!(
                    "{pattern:?} N={n}: over {over_hits} hits, bound {bound}, under {:.3}%",
                    o.under * 100.0
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
