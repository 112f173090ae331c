//! What a day of usage history costs on the embedded store: one tenant with `CLIENTS` clients
//! (default 100,000), written as the sync task writes it (a batch of deltas per round), once with
//! each client active in one hour of the day and once with every client active every hour.
//! Prints the rows written (by the store's layout: a point per active client and hour, an index
//! line per active client and day, a tenant point per hour and day), the bytes the database file
//! grew by, and the write time.
//!
//! Then the case a loaded service is in: the same `ROUND_CLIENTS` clients (default 10,000) active
//! in every sync round of one hour, so each round adds to rows that exist; prints the time a
//! delta takes to write (2 rows a client: its hour point and its line in the index).
//!
//! `cargo bench --bench history_rows` (CLIENTS=10000 for a quick run).

use std::time::Instant;

use quotad::store::embedded::EmbeddedStore;
use quotad::store::history::{Counts, HistoryStore, UsageDelta, HOUR_MS};

const DAY0: i64 = 1_795_392_000_000; // 2026-11-23T00:00:00Z
const ROUND: usize = 10_000;

fn delta(client: usize, hour: i64) -> UsageDelta {
    let mut counts = Counts {
        admitted: 40,
        cost: 45,
        denied: 0,
        ..Counts::default()
    };
    if client % 10 == 0 {
        counts.denied = 3;
        counts.denied_by.insert("per-second".into(), 3);
    }
    UsageDelta {
        tenant: "acme".into(),
        client: format!("client-{client:06}"),
        hour: DAY0 + hour * HOUR_MS,
        counts,
        cost_returned: 0,
    }
}

fn file_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

fn run(rt: &tokio::runtime::Runtime, clients: usize, hours_each: i64) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let empty = file_bytes(dir.path());
    let started = Instant::now();
    let mut client_hours = 0u64;
    for hour in 0..24 {
        let active: Vec<UsageDelta> = (0..clients)
            .filter(|c| hours_each == 24 || (*c as i64) % 24 == hour)
            .map(|c| delta(c, hour))
            .collect();
        client_hours += active.len() as u64;
        for round in active.chunks(ROUND) {
            rt.block_on(store.add_usage(round)).unwrap();
        }
    }
    rt.block_on(quotad::store::CounterStore::flush(&store))
        .unwrap();
    let took = started.elapsed();
    drop(store);
    let grew = file_bytes(dir.path()) - empty;
    let rows = client_hours + clients as u64 + 25;
    println!(
        "{clients} clients, each active {hours_each} h: {rows} rows ({client_hours} client-hours \
         + {} client-days + 25 tenant points), {:.1} MiB on disk ({:.0} B/row), written in {:.2} s",
        clients,
        grew as f64 / (1 << 20) as f64,
        grew as f64 / rows as f64,
        took.as_secs_f64()
    );
}

fn main() {
    let clients = std::env::var("CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    run(&rt, clients, 1);
    run(&rt, clients, 24);
    let round_clients = std::env::var("ROUND_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    rounds(&rt, round_clients, 60);
}

/// `clients` clients active in each of `rounds` rounds of one hour: every round after the first
/// adds to the rows the first made.
fn rounds(rt: &tokio::runtime::Runtime, clients: usize, rounds: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let active: Vec<UsageDelta> = (0..clients).map(|c| delta(c, 5)).collect();
    rt.block_on(store.add_usage(&active)).unwrap();
    let started = Instant::now();
    for _ in 0..rounds {
        rt.block_on(store.add_usage(&active)).unwrap();
    }
    let took = started.elapsed();
    println!(
        "{clients} clients in each of {rounds} rounds of one hour: {:.2} ms a round, {:.0} ns a delta",
        took.as_secs_f64() * 1e3 / rounds as f64,
        took.as_nanos() as f64 / (rounds * clients) as f64
    );
}
