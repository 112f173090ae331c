use super::*;
use crate::store::history::counts;

fn delta(tenant: &str, client: &str, hour: i64, counts: Counts) -> UsageDelta {
    UsageDelta {
        tenant: tenant.into(),
        client: client.into(),
        hour,
        counts,
        cost_returned: 0,
    }
}

/// 2026-11-30T23:00Z: the month's last hour.
const H: i64 = 1_796_079_600_000;

#[test]
fn a_call_is_summed_per_cell_and_zeros_are_never_written() {
    let day = Step::Day.floor(H);
    let plan = plan_usage(&[
        delta("t", "a", H, counts(2, 4, 1, &[("per-min", 1)])),
        delta("t", "a", H, counts(1, 1, 0, &[])),
        delta(
            "t",
            "b",
            H,
            counts(0, 0, 2, &[("per-min", 1), ("x:y", 1), ("z", 0)]),
        ),
        delta("t", "c", H, counts(0, 0, 0, &[("per-min", 0)])), // nothing at all
        delta("t", "a", H + HOUR, counts(5, 5, 0, &[])),        // next month
    ])
    .unwrap();
    assert_eq!(
        plan.tenant_months.into_iter().collect::<Vec<_>>(),
        vec![(202611, "t".to_owned()), (202612, "t".to_owned())]
    );
    let lines = &plan.client_days[&("t".to_owned(), day)];
    assert_eq!(lines.len(), 2, "c added nothing: {lines:?}");
    assert_eq!(lines["a"], [3, 5, 1]);
    assert_eq!(lines["b"], [0, 0, 2]);
    let cells = |s: &str, m: i32| -> Vec<(Cell, i64)> {
        plan.points[&("t".to_owned(), s.to_owned(), m)]
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    let c = |step: &'static str, start: i64, f: &str, n: i64| ((step, start, f.to_owned()), n);
    assert_eq!(
        cells("a", 202611),
        vec![
            c("day", day, "admitted", 3),
            c("day", day, "cost", 5),
            c("day", day, "denied", 1),
            c("day", day, "denied_by:per-min", 1),
            c("hour", H, "admitted", 3),
            c("hour", H, "cost", 5),
            c("hour", H, "denied", 1),
            c("hour", H, "denied_by:per-min", 1),
        ]
    );
    // The tenant's totals: one cell per field and hour, summed over its clients.
    let totals = cells("*", 202611);
    assert!(totals.contains(&c("hour", H, "denied", 3)));
    assert!(totals.contains(&c("hour", H, "denied_by:per-min", 2)));
    assert!(totals.contains(&c("day", day, "denied_by:x:y", 1)));
    assert!(totals.iter().all(|(_, n)| *n != 0));
    assert!(!totals.iter().any(|((_, _, f), _)| f == "denied_by:z"));
    assert_eq!(
        cells("a", 202612),
        vec![
            c("day", H + HOUR, "admitted", 5),
            c("day", H + HOUR, "cost", 5),
            c("hour", H + HOUR, "admitted", 5),
            c("hour", H + HOUR, "cost", 5),
        ]
    );
    assert!(plan_usage(&[]).unwrap().points.is_empty());
    assert!(plan_usage(&[delta("t", "a", H, counts(u64::MAX, 0, 0, &[]))]).is_err());
}

const HOUR: i64 = crate::store::history::HOUR_MS;

#[test]
fn cost_given_back_is_a_negative_increment_of_cost() {
    let day = Step::Day.floor(H);
    let back = UsageDelta {
        cost_returned: 180,
        ..delta("t", "a", H, counts(0, 0, 0, &[]))
    };
    let plan = plan_usage(&[back, delta("t", "b", H, counts(1, 20, 0, &[]))]).unwrap();
    let lines = &plan.client_days[&("t".to_owned(), day)];
    assert_eq!((lines["a"], lines["b"]), ([0, -180, 0], [1, 20, 0]));
    let totals = &plan.points[&("t".to_owned(), "*".to_owned(), 202611)];
    assert_eq!(totals[&("hour", H, "cost".to_owned())], -160);
    // A figure below 0 (the estimate's increment was lost) reads as 0.
    assert_eq!(counter_value(Some(Counter(-5))), 0);
    assert_eq!(counter_value(Some(Counter(7))), 7);
}

#[test]
fn a_line_of_zeros_still_lists_its_client() {
    let v = line_values("t", 0, "c", [0, 0, 0]);
    assert!(matches!(v.0, MaybeUnset::Set(Counter(0))));
    let v = line_values("t", 0, "c", [0, 3, 0]);
    assert!(matches!(
        (v.0, v.1, v.2),
        (
            MaybeUnset::Unset,
            MaybeUnset::Set(Counter(3)),
            MaybeUnset::Unset
        )
    ));
}

#[test]
fn fields_read_back_into_counts() {
    let mut c = Counts::default();
    for (f, n) in [
        ("admitted", 3),
        ("cost", 7),
        ("denied", 2),
        ("denied_by:a:b", 2),
        ("denied_by:zero", 0),
        ("someday", 9),
    ] {
        add_field(&mut c, f, n);
    }
    assert_eq!(c, counts(3, 7, 2, &[("a:b", 2)]));
}

#[test]
fn days_start_in_the_range() {
    let d = DAY_MS;
    assert_eq!(days_in(0, 3 * d).collect::<Vec<_>>(), [0, d, 2 * d]);
    assert_eq!(days_in(1, 3 * d).collect::<Vec<_>>(), [d, 2 * d]);
    assert_eq!(days_in(0, 2 * d + 1).collect::<Vec<_>>(), [0, d, 2 * d]);
    assert!(days_in(d, d).next().is_none());
    assert!(days_in(2 * d, d).next().is_none());
}
