//! Decision core: one check through the real `quotad::limiter::Limiter`, in memory, on the hit
//! path (every counter already loaded), with 1, 10^3 and 10^6 active keys and a single-tier or
//! a 3-tier policy (one tier tenant-scoped, so every check also locks the tenant's entry).
//!
//! Each check goes through `Limiter::check_now`, as the HTTP API's does: the in-memory
//! decision, without the future that waiting for the store needs. The bench panics if it ever
//! answers None in steady state (that would mean a key fell out of memory).
//!
//! Besides the criterion timings it prints, per case:
//! - heap allocations per check in steady state (a counting `#[global_allocator]`; target 0);
//! - live heap bytes per active counter after pre-warming (the limiter's own memory, without
//!   allocator slack or the HTTP server).
//!
//! Run: `cargo bench --bench decision` (add `-- --quick` for a shorter run).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::StreamExt;

use quotad::clock::{Clock, ManualClock};
use quotad::domain::{ClientId, Policy, PolicyDoc, TenantId};
use quotad::limiter::{CheckInput, Decision, Limiter, LimiterConfig};
use quotad::metrics::Metrics;
use quotad::store::embedded::EmbeddedStore;
use quotad::store::DynStore;

// ---- Counting allocator -------------------------------------------------------------------

/// Counts allocations (and live bytes) so the bench can show the hit path allocates nothing.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(l.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(l.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE_BYTES.fetch_sub(l.size() as i64, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(new as i64 - l.size() as i64, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---- The rig ------------------------------------------------------------------------------

const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
/// The largest `max` a limit may have: every check in the bench is admitted.
const MAX: u64 = 1 << 53;

#[derive(Clone, Copy, Debug)]
enum Tiers {
    One,
    Three,
}

impl Tiers {
    fn name(self) -> &'static str {
        match self {
            Tiers::One => "1-tier",
            Tiers::Three => "3-tier",
        }
    }

    fn policy(self) -> Policy {
        let json = match self {
            Tiers::One => serde_json::json!({"limits": [
                {"id": "per-minute", "max": MAX, "window": "1m"},
            ]}),
            Tiers::Three => serde_json::json!({"limits": [
                {"id": "per-second", "max": MAX, "window": "1s"},
                {"id": "per-hour", "max": MAX, "period": "hour"},
                {"id": "tenant-per-minute", "max": MAX, "window": "1m", "scope": "tenant"},
            ]}),
        };
        let doc: PolicyDoc = serde_json::from_value(json).expect("valid policy json");
        Policy::from_doc(&doc, false).expect("valid policy")
    }

    /// Counters each distinct client adds (the tenant-scoped one is shared).
    fn counters_per_client(self) -> usize {
        match self {
            Tiers::One => 1,
            Tiers::Three => 2,
        }
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    clock: ManualClock,
    limiter: Limiter,
    policy: Policy,
    tenant: TenantId,
    clients: Vec<ClientId>,
    /// Live heap bytes the pre-warmed limiter state holds, per counter.
    heap_per_counter: f64,
}

impl Rig {
    fn new(rt: &tokio::runtime::Runtime, tiers: Tiers, keys: usize) -> Rig {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).expect("embedded store"));
        let clock = ManualClock::new(T0 + 500);
        // As in the service, each check parses its own client id: the pre-warm's ids are made
        // inside the heap's count and dropped before it is read, so what the limiter keeps of
        // them counts, and the measured checks use ids of their own (an entry that kept a
        // shared id would be one more allocation, and the check one more cache miss, there).
        let ids = || -> Vec<ClientId> {
            (0..keys)
                .map(|i| ClientId::parse(&format!("client-{i:07}")).expect("valid client id"))
                .collect()
        };
        let policy = tiers.policy();
        let tenant = TenantId::parse("acme").expect("valid tenant id");
        let before = LIVE_BYTES.load(Ordering::Relaxed);
        let clients = ids();
        let limiter = Limiter::new(
            store,
            Arc::new(clock.clone()),
            Arc::new(Metrics::new(false)),
            LimiterConfig {
                // Room for every key: this measures the in-memory path, not the caps.
                max_counters: 4 * keys + 1,
                max_clients_per_tenant: keys,
                ..LimiterConfig::default()
            },
        );
        // Pre-warm: the first check of each key reads the (empty) store, off the measured path.
        rt.block_on(async {
            futures::stream::iter(clients.iter())
                .map(|c| {
                    limiter.check(
                        &policy,
                        CheckInput {
                            tenant: &tenant,
                            client: c,
                            resource: None,
                            cost: 1,
                            reserve: false,
                        },
                    )
                })
                .buffer_unordered(64)
                .for_each(|d| {
                    assert!(d.allowed, "pre-warm check denied: {d:?}");
                    futures::future::ready(())
                })
                .await;
        });
        drop(clients);
        let counters = keys * tiers.counters_per_client() + matches!(tiers, Tiers::Three) as usize;
        let heap = LIVE_BYTES.load(Ordering::Relaxed) - before;
        let clients = ids();
        Rig {
            _dir: dir,
            clock,
            limiter,
            policy,
            tenant,
            clients,
            heap_per_counter: heap as f64 / counters as f64,
        }
    }

    /// One check on the hit path; panics if it would have needed the store.
    #[inline]
    fn check(&self, client: &ClientId) -> Decision {
        self.limiter
            .check_now(
                &self.policy,
                CheckInput {
                    tenant: &self.tenant,
                    client,
                    resource: None,
                    cost: 1,
                    reserve: false,
                },
            )
            .expect("check needed the store on the hit path: a key was not in memory")
    }

    /// The key for the i-th check: a fixed stride through the keys (co-prime with their
    /// number), so consecutive checks touch unrelated entries, as independent clients do.
    #[inline]
    fn key(&self, i: u64) -> &ClientId {
        let n = self.clients.len() as u64;
        &self.clients[((i.wrapping_mul(2_654_435_761)) % n) as usize]
    }

    fn run(&self, from: u64, iters: u64) -> Duration {
        let start = Instant::now();
        for i in from..from + iters {
            let d = self.check(self.key(i));
            black_box(&d);
        }
        start.elapsed()
    }

    /// What the bench itself costs per check: fetching the i-th key and reading its string
    /// (a cache miss or two at 10^6 keys), with no limiter call. Subtract from `check` to see
    /// the limiter alone.
    fn run_key_fetch(&self, from: u64, iters: u64) -> Duration {
        let start = Instant::now();
        for i in from..from + iters {
            let k = self.key(i).as_str().as_bytes();
            black_box(k[k.len() - 1]);
        }
        start.elapsed()
    }

    /// Heap allocations per check over `n` steady-state checks.
    fn allocs_per_check(&self, n: u64) -> f64 {
        self.run(0, n.min(self.clients.len() as u64)); // every key once more, off the count
        let before = ALLOCS.load(Ordering::Relaxed);
        self.run(0, n);
        (ALLOCS.load(Ordering::Relaxed) - before) as f64 / n as f64
    }

    /// The clock moves 1 ms every 4 checks (so each of 10^3 keys comes back every 250 ms,
    /// inside every window: a key whose window empties is evicted and re-read from the store)
    /// and a sync is emulated every 250 simulated ms (a round's pass, whose hits count as
    /// written, as after a successful store write), so buckets roll, fill the whole window and
    /// get pruned, as in a long-running process.
    /// Returns (time spent in checks only, allocations in checks only).
    fn run_rolling(&self, from: u64, iters: u64) -> (Duration, u64) {
        let mut spent = Duration::ZERO;
        let mut allocs = 0;
        let mut i = from;
        let end = from + iters;
        while i < end {
            let chunk = 1000.min(end - i);
            let a0 = ALLOCS.load(Ordering::Relaxed);
            let t0 = Instant::now();
            for j in i..i + chunk {
                if j % 4 == 0 {
                    self.clock.advance(1);
                }
                let d = self.check(self.key(j));
                black_box(&d);
            }
            spent += t0.elapsed();
            allocs += ALLOCS.load(Ordering::Relaxed) - a0;
            i += chunk;
            let now = self.clock.now_ms();
            // A round's pass: evicts, and takes the pending hits as written.
            drop(self.limiter.collect(now, true, true));
        }
        (spent, allocs)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

// ---- Benchmarks ---------------------------------------------------------------------------

/// `DECISION_KEYS=1,1000` limits the key counts (pre-warming 10^6 keys takes a while, which
/// matters under a profiler); default 1, 10^3, 10^6.
fn key_counts() -> Vec<usize> {
    std::env::var("DECISION_KEYS")
        .ok()
        .map(|v| {
            v.split(',')
                .map(|k| k.trim().parse().expect("DECISION_KEYS: numbers"))
                .collect()
        })
        .unwrap_or_else(|| vec![1, 1_000, 1_000_000])
}

fn decision(c: &mut Criterion) {
    let rt = runtime();
    let mut report = Vec::new();
    let mut g = c.benchmark_group("check");
    g.throughput(Throughput::Elements(1));
    let counts = key_counts();
    for tiers in [Tiers::One, Tiers::Three] {
        for &keys in &counts {
            let t0 = Instant::now();
            let rig = Rig::new(&rt, tiers, keys);
            let warm = t0.elapsed();
            let allocs = rig.allocs_per_check(200_000);
            let mut next = 0u64;
            g.bench_with_input(BenchmarkId::new(tiers.name(), keys), &keys, |b, _| {
                b.iter_custom(|iters| {
                    let d = rig.run(next, iters);
                    next += iters;
                    d
                })
            });
            if matches!(tiers, Tiers::One) {
                let mut next = 0u64;
                g.bench_with_input(BenchmarkId::new("key-fetch-only", keys), &keys, |b, _| {
                    b.iter_custom(|iters| {
                        let d = rig.run_key_fetch(next, iters);
                        next += iters;
                        d
                    })
                });
            }
            report.push(format!(
                "{:<7} keys={:<8} allocs/check={:.3} heap bytes/counter={:.0} (pre-warm {:.1?})",
                tiers.name(),
                keys,
                allocs,
                rig.heap_per_counter,
                warm
            ));
        }
    }
    // Steady state over time: buckets roll and syncs run between checks.
    for tiers in [Tiers::One, Tiers::Three]
        .into_iter()
        .filter(|_| counts.contains(&1_000))
    {
        let keys = 1_000;
        let rig = Rig::new(&rt, tiers, keys);
        rig.run_rolling(0, 200_000); // fill every window
        let (_, allocs) = rig.run_rolling(200_000, 200_000);
        let mut next = 400_000u64;
        g.bench_with_input(
            BenchmarkId::new(format!("{}-rolling", tiers.name()), keys),
            &keys,
            |b, _| {
                b.iter_custom(|iters| {
                    let (d, _) = rig.run_rolling(next, iters);
                    next += iters;
                    d
                })
            },
        );
        report.push(format!(
            "{:<7} keys={:<8} allocs/check={:.3} (clock moving 1 ms/check, sync every 250 ms)",
            format!("{}-rolling", tiers.name()),
            keys,
            allocs as f64 / 200_000.0,
        ));
    }
    g.finish();
    println!("\nallocations and memory (steady state):");
    for line in report {
        println!("  {line}");
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = decision
}
criterion_main!(benches);
