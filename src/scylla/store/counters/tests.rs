//! The request plans of [`super`]: reads grouped by place, batches packed by place and size.

use super::super::partition::MAX_STARTS_PER_RANGE;
use super::*;
use crate::domain::Grain;
use crate::store::CounterKey;

fn range(subject: &str, limit: &str, grain: Grain, from: i64, to: i64) -> CounterRange {
    CounterRange {
        key: CounterKey {
            tenant: "acme".into(),
            subject: subject.into(),
            limit: limit.into(),
            grain,
        },
        from,
        to,
    }
}

fn one_place(_: &str, _: &str) -> Place {
    None
}

/// k1 and k3 live at one node, k2 at another.
fn two_places(_: &str, subject: &str) -> Place {
    let port = if subject == "k2" { 2 } else { 1 };
    Some(SocketAddr::from(([127, 0, 0, 1], port)))
}

#[test]
fn the_clients_of_one_place_are_one_query() {
    let s = Grain::Fixed(1_000);
    let ranges = [
        range("k1", "per-sec", Grain::Fixed(100), 1_000, 1_300),
        range("k1", "per-min", s, 0, 2_000),
        range("k2", "per-min", s, 0, 1_000),
        range("k1", "empty", s, 5_000, 4_000),
        range("k3", "per-min", s, 0, 1_000),
    ];
    let q = plan_reads(&ranges, one_place);
    assert_eq!(
        q,
        vec![Query {
            tenant: "acme",
            subjects: vec!["k1", "k2", "k3"],
            ask: Ask::Starts(vec![0, 1_000, 1_100, 1_200, 1_300, 2_000]),
            ranges: vec![0, 1, 2, 4],
        }]
    );
    let q = plan_reads(&ranges, two_places);
    assert_eq!(q.len(), 2, "{q:?}");
    assert_eq!(
        (q[0].subjects.clone(), q[0].ranges.clone()),
        (vec!["k1", "k3"], vec![0, 1, 4])
    );
    assert_eq!(
        (q[1].subjects.clone(), q[1].ranges.clone()),
        (vec!["k2"], vec![2])
    );
}

#[test]
fn wide_ranges_are_spans_and_long_lists_are_split() {
    let s = Grain::Fixed(1_000);
    let wide = 1_000 * MAX_STARTS_PER_RANGE as i64;
    let two = [range("k1", "a", s, 0, wide), range("k1", "b", s, 0, 0)];
    let q = plan_reads(&two, one_place);
    assert_eq!(q.len(), 2);
    assert!(q
        .iter()
        .any(|q| q.ask == Ask::Span(0, wide) && q.ranges == [0]));
    assert!(q
        .iter()
        .any(|q| q.ask == Ask::Starts(vec![0]) && q.ranges == [1]));
    // Wide ranges of clients of one place: one span over all of them.
    let spans = [
        range("k1", "a", s, 0, wide),
        range("k2", "a", s, 5_000, wide + 9_000),
    ];
    let q = plan_reads(&spans, one_place);
    assert_eq!(
        q,
        vec![Query {
            tenant: "acme",
            subjects: vec!["k1", "k2"],
            ask: Ask::Span(0, wide + 9_000),
            ranges: vec![0, 1],
        }]
    );
    assert_eq!(
        plan_reads(&spans, two_places).len(),
        2,
        "k2 lives elsewhere"
    );
    // Three limits of 60 distinct starts each: 180 starts in two lists.
    let ranges: Vec<CounterRange> = (0..3)
        .map(|i| {
            let from = i * 60_000;
            range("k1", "l", s, from, from + 59_000)
        })
        .collect();
    let q = plan_reads(&ranges, one_place);
    let sizes: Vec<usize> = q
        .iter()
        .map(|q| match &q.ask {
            Ask::Starts(v) => v.len(),
            Ask::Span(..) => 0,
        })
        .collect();
    assert_eq!(sizes, vec![MAX_IN_VALUES, 180 - MAX_IN_VALUES]);
    // 250 clients: queries of at most 100.
    let names: Vec<String> = (0..250).map(|i| format!("c{i:03}")).collect();
    let many: Vec<CounterRange> = names.iter().map(|n| range(n, "l", s, 0, 0)).collect();
    let q = plan_reads(&many, one_place);
    let sizes: Vec<usize> = q.iter().map(|q| q.subjects.len()).collect();
    assert_eq!(sizes, vec![100, 100, 50]);
    let read: usize = q.iter().map(|q| q.ranges.len()).sum();
    assert_eq!(read, 250, "every range in one query");
}

fn client<'a>(subject: &'a str, n: usize) -> ClientWrite<'a> {
    ClientWrite {
        tenant: "acme",
        subject,
        rows: (0..n).map(|i| (i as i64, "per-minute", 1_000, 1)).collect(),
    }
}

#[test]
fn batches_hold_many_clients_of_one_place_and_stay_small() {
    let names: Vec<String> = (0..200).map(|i| format!("k{i:03}")).collect();
    let clients: Vec<ClientWrite<'_>> = names.iter().map(|n| client(n, 3)).collect();
    let places: Vec<Place> = names.iter().map(|n| two_places("acme", n)).collect();
    let batches = pack(&clients, &places);
    // 600 rows of about 70 bytes: a few batches, not 200.
    assert!(batches.len() <= 6, "{} batches", batches.len());
    let mut seen = vec![0; clients.len()];
    for b in &batches {
        let rows: usize = b.iter().map(|(_, r)| r.len()).sum();
        let bytes: usize = b
            .iter()
            .flat_map(|(i, r)| {
                clients[*i].rows[r.clone()]
                    .iter()
                    .map(|row| row_bytes(&clients[*i], row.1))
            })
            .sum();
        assert!(
            rows <= MAX_BATCH_ROWS && bytes <= MAX_BATCH_BYTES,
            "{rows} rows, {bytes} bytes"
        );
        let place = places[b[0].0];
        assert!(
            b.iter().all(|(i, _)| places[*i] == place),
            "one place a batch"
        );
        for (i, r) in b {
            assert_eq!(*r, 0..3, "a client's rows in one batch");
            seen[*i] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n == 1), "each client once");
    // A client bigger than a batch: in pieces, alone, every row once.
    let big = [client("huge", 3 * MAX_BATCH_ROWS + 5), client("small", 2)];
    let batches = pack(&big, &[None, None]);
    let pieces: Vec<(usize, Range<usize>)> = batches.iter().flatten().cloned().collect();
    let rows: usize = pieces
        .iter()
        .filter(|(i, _)| *i == 0)
        .map(|(_, r)| r.len())
        .sum();
    assert_eq!(rows, 3 * MAX_BATCH_ROWS + 5);
    assert!(batches
        .iter()
        .all(|b| b.iter().map(|(_, r)| r.len()).sum::<usize>() <= MAX_BATCH_ROWS));
    assert!(pack(&[], &[]).is_empty());
}
