//! What the sync task's counter writes cost on the embedded store at steady state: `CLIENTS`
//! clients (default 10,000) of the 3-tier policy `scripts/bench-http.sh` uses (a 1 s window in
//! 100 ms buckets, a calendar hour, a tenant-wide 1 min window in 1 s buckets), every client hit
//! throughout, written as the sync task writes it: one batch of deltas every 250 ms of simulated
//! time, the janitor every `JANITOR_MS` (default 60 s, as configured by default) of simulated time.
//! Prints the mean write time per round over each simulated 10 s, the janitor's time and rows,
//! and the database file's size, so a change of layout can be compared round for round.
//!
//! `cargo bench --bench store_rounds` (CLIENTS=1000 SECONDS=20 for a quick run).

use std::sync::Arc;
use std::time::Instant;

use quotad::domain::Grain;
use quotad::store::embedded::EmbeddedStore;
use quotad::store::{CounterKey, CounterStore, Delta};

const T0: i64 = 1_795_392_000_000; // 2026-11-23T00:00:00Z
const ROUND_MS: i64 = 250;

fn env(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn file_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

fn main() {
    let clients = env("CLIENTS", 10_000) as usize;
    let seconds = env("SECONDS", 60);
    let janitor_ms = env("JANITOR_MS", 60_000);
    let budget = env("JANITOR_BUDGET", 10_000) as usize;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tenant: Arc<str> = "bench".into();
    let (second, hour, tenant_minute): (Arc<str>, Arc<str>, Arc<str>) = (
        "per-second".into(),
        "per-hour".into(),
        "tenant-per-minute".into(),
    );
    // In the order a limiter's sync round lists them: by hash, not by name.
    let mut keys: Vec<[CounterKey; 2]> = (0..clients)
        .map(|c| {
            let subject: Arc<str> = format!("c-{c}").into();
            [
                CounterKey {
                    tenant: tenant.clone(),
                    subject: subject.clone(),
                    limit: second.clone(),
                    grain: Grain::Fixed(100),
                },
                CounterKey {
                    tenant: tenant.clone(),
                    subject,
                    limit: hour.clone(),
                    grain: Grain::Fixed(3_600_000),
                },
            ]
        })
        .collect();
    keys.sort_by_cached_key(|k| {
        use std::hash::{BuildHasher, BuildHasherDefault};
        BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .hash_one(&k[0].subject)
    });
    let tenant_key = CounterKey {
        tenant: tenant.clone(),
        subject: "*".into(),
        limit: tenant_minute,
        grain: Grain::Fixed(1_000),
    };
    println!("store_rounds: {clients} clients, {seconds} s simulated, janitor every {janitor_ms} ms (budget {budget})");
    let mut spent = 0.0f64;
    let mut rounds = 0u32;
    let mut next_janitor = T0 + janitor_ms;
    let mut deltas = Vec::with_capacity(clients * 4 + 4);
    let mut t = T0;
    while t < T0 + seconds * 1_000 {
        // Hits arrived in [t, t + ROUND_MS): every 100 ms bucket they span, per client.
        deltas.clear();
        for k in &keys {
            let mut b = t;
            while b < t + ROUND_MS {
                deltas.push(Delta {
                    key: k[0].clone(),
                    start: b - b % 100,
                    delta: 3,
                });
                b = b - b % 100 + 100;
            }
            deltas.push(Delta {
                key: k[1].clone(),
                start: t - t % 3_600_000,
                delta: 7,
            });
        }
        let mut b = t;
        while b < t + ROUND_MS {
            deltas.push(Delta {
                key: tenant_key.clone(),
                start: b - b % 1_000,
                delta: 9,
            });
            b = b - b % 1_000 + 1_000;
        }
        let started = Instant::now();
        rt.block_on(store.increment(&deltas)).unwrap();
        spent += started.elapsed().as_secs_f64();
        rounds += 1;
        t += ROUND_MS;
        if t >= next_janitor {
            let started = Instant::now();
            let n = rt.block_on(store.delete_expired(t, budget)).unwrap();
            println!(
                "  t={:>4}s janitor deleted {n} buckets in {:.0} ms",
                (t - T0) / 1_000,
                started.elapsed().as_secs_f64() * 1e3
            );
            next_janitor = t + janitor_ms;
        }
        if (t - T0) % 10_000 == 0 {
            println!(
                "  t={:>4}s {} deltas a round, mean write {:.1} ms a round, file {:.1} MiB",
                (t - T0) / 1_000,
                deltas.len(),
                spent * 1e3 / rounds as f64,
                file_bytes(dir.path()) as f64 / (1 << 20) as f64
            );
            spent = 0.0;
            rounds = 0;
        }
    }
}
