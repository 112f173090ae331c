//! Fleets in several regions: each region reads and writes its own replica of the counters, and
//! writes reach the other regions' replicas a replication lag later, as Cassandra's data
//! centres do. A cut link holds them back (as hints) until it heals. Each region writes a
//! heartbeat every `REGION_BEAT_MS`, replicated the same way; an instance that finds another
//! region's heartbeat older than `REGION_STALE_MS` keeps to its region's budget, as
//! `quotad::tasks::fleet` tells the limiter on a real store.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use quotad::store::lease::{Member, RegionBeat, MAX_SHARDS};
use quotad::tasks::fleet::regions::Watch;

use super::*;

/// `fleet.region_heartbeat_ms` and `fleet.region_stale_ms`, as configured by default.
pub(crate) const REGION_BEAT_MS: i64 = 250;
pub(crate) const REGION_STALE_MS: i64 = 1_000;
/// How long a write takes to reach another region's replica.
pub(crate) const REPLICATION_MS: i64 = 50;
/// When a round reads back, as `Syncer::run` waits on a fleet of regions: the settle time plus
/// the replication lag it measured from the heartbeats.
const REGION_SETTLE_MS: i64 = SETTLE_MS + REPLICATION_MS;
/// How long a region heard again stays cut off: `sync.max_delay_ms` and two intervals, as
/// `quotad::startup` sets it.
const HEAL_GRACE_MS: i64 = 2_000 + 2 * SYNC_MS;
/// Instances per region.
pub(crate) const PER_REGION: usize = 2;

/// After the link heals, writes are still held back this long (the nodes see each other as
/// up again, by gossip), then what was held back is replayed in the order it was written, one
/// write every `HINT_REPLAY_MS`, while new writes go straight through again.
const UP_AFTER_MS: i64 = 2_000;
const HINT_REPLAY_MS: i64 = 10;

/// What travels to another region's replica.
enum Payload {
    Count {
        key: CounterKey,
        start: i64,
        shard: usize,
        delta: i64,
    },
    /// A region's heartbeat: its row, and its entry in the heartbeat log.
    Beat { region: usize, at: i64 },
}

/// A write on its way to another region's replica; `hinted` while held back by a cut.
struct InFlight {
    at: i64,
    to: usize,
    hinted: bool,
    what: Payload,
}

/// Every region's replica, and the writes on their way between them.
pub(crate) struct Replicas {
    regions: usize,
    replicas: Vec<Mutex<Cells>>,
    inflight: Mutex<VecDeque<InFlight>>,
    /// Each region's newest heartbeat as each region's replica holds it: `[holder][writer]`,
    /// and every heartbeat it holds.
    beats: Mutex<Vec<Vec<i64>>>,
    beat_log: Mutex<Vec<Vec<std::collections::BTreeSet<i64>>>>,
    cut: AtomicBool,
    /// When the link last healed.
    healed: std::sync::atomic::AtomicI64,
    next_replay: std::sync::atomic::AtomicI64,
    now: std::sync::atomic::AtomicI64,
    history: Arc<Tally>,
}

impl Replicas {
    fn new(regions: usize, t0: i64) -> Self {
        Replicas {
            regions,
            replicas: (0..regions).map(|_| Mutex::default()).collect(),
            inflight: Mutex::default(),
            beats: Mutex::new(vec![vec![t0; regions]; regions]),
            beat_log: Mutex::new(vec![vec![Default::default(); regions]; regions]),
            cut: AtomicBool::new(false),
            healed: i64::MIN.into(),
            next_replay: i64::MIN.into(),
            now: t0.into(),
            history: Arc::default(),
        }
    }

    fn shards(&self) -> usize {
        self.regions * PER_REGION
    }

    /// Cuts or heals the link at `now`.
    fn set_cut(&self, cut: bool, now: i64) {
        if self.cut.swap(cut, Relaxed) && !cut {
            self.healed.store(now, Relaxed);
            self.next_replay.store(now + UP_AFTER_MS, Relaxed);
        }
    }

    /// Whether a write sent at `now` is held back: the link is cut, or not yet seen up again.
    fn held_back(&self, now: i64) -> bool {
        self.cut.load(Relaxed) || now < self.healed.load(Relaxed).saturating_add(UP_AFTER_MS)
    }

    /// Sends `what` to every other region's replica.
    fn send(
        &self,
        inflight: &mut VecDeque<InFlight>,
        from: usize,
        now: i64,
        what: impl Fn() -> Payload,
    ) {
        let hinted = self.held_back(now);
        for to in (0..self.regions).filter(|&q| q != from) {
            inflight.push_back(InFlight {
                at: now + REPLICATION_MS,
                to,
                hinted,
                what: what(),
            });
        }
    }

    fn apply(&self, w: InFlight) {
        match w.what {
            Payload::Count {
                key,
                start,
                shard,
                delta,
            } => {
                let mut cells = self.replicas[w.to].lock().unwrap();
                let cell = cells
                    .entry((key, start))
                    .or_insert_with(|| vec![0; self.shards()]);
                cell[shard] += delta;
            }
            Payload::Beat { region, at } => {
                let row = &mut self.beats.lock().unwrap()[w.to][region];
                *row = (*row).max(at);
                self.beat_log.lock().unwrap()[w.to][region].insert(at);
            }
        }
    }

    /// Delivers what has arrived by `now`: writes sent while the link was up once their lag
    /// has passed, and once it is seen up again, what it held back, in order.
    fn deliver(&self, now: i64) {
        self.now.store(now, Relaxed);
        if self.cut.load(Relaxed) {
            return;
        }
        let mut inflight = self.inflight.lock().unwrap();
        let mut replay = self.next_replay.load(Relaxed);
        let mut kept = VecDeque::new();
        while let Some(w) = inflight.pop_front() {
            if w.hinted {
                if now >= replay {
                    replay = replay.max(now) + HINT_REPLAY_MS;
                    self.apply(w);
                } else {
                    kept.push_back(w);
                }
            } else if w.at <= now {
                self.apply(w);
            } else {
                kept.push_back(w);
            }
        }
        self.next_replay.store(replay, Relaxed);
        *inflight = kept;
    }

    /// Region `r` writes its heartbeat at `now`.
    fn beat(&self, r: usize, now: i64) {
        self.beats.lock().unwrap()[r][r] = now;
        self.beat_log.lock().unwrap()[r][r].insert(now);
        let mut inflight = self.inflight.lock().unwrap();
        self.send(&mut inflight, r, now, || Payload::Beat {
            region: r,
            at: now,
        });
    }

    /// The heartbeats of region `writer` in `[from, to)` that `holder`'s replica holds.
    fn beats_between(&self, holder: usize, writer: usize, from: i64, to: i64) -> Vec<i64> {
        self.beat_log.lock().unwrap()[holder][writer]
            .range(from..to)
            .copied()
            .collect()
    }

    /// Every replica's total of every cell: after a heal and delivery, all alike.
    pub(crate) fn totals(&self) -> Vec<i64> {
        self.replicas
            .iter()
            .map(|c| c.lock().unwrap().values().flatten().sum())
            .collect()
    }
}

/// One instance's view: its region's replica, its own shard.
struct RegionView {
    shared: Arc<Replicas>,
    region: usize,
    shard: usize,
}

#[async_trait]
impl CounterStore for RegionView {
    fn kind(&self) -> &'static str {
        "simulation"
    }
    async fn increment(&self, deltas: &[Delta]) -> StoreResult<()> {
        let s = &self.shared;
        let now = s.now.load(Relaxed);
        let mut cells = s.replicas[self.region].lock().unwrap();
        let mut inflight = s.inflight.lock().unwrap();
        for d in deltas {
            let cell = cells
                .entry((d.key.clone(), d.start))
                .or_insert_with(|| vec![0; s.shards()]);
            cell[self.shard] += d.delta;
            s.send(&mut inflight, self.region, now, || Payload::Count {
                key: d.key.clone(),
                start: d.start,
                shard: self.shard,
                delta: d.delta,
            });
        }
        Ok(())
    }
    async fn read(&self, ranges: &[CounterRange]) -> StoreResult<Vec<Vec<BucketTotal>>> {
        let cells = self.shared.replicas[self.region].lock().unwrap();
        let ours = self.region * PER_REGION..(self.region + 1) * PER_REGION;
        Ok(read_cells(&cells, ranges, self.shard, ours))
    }
    async fn delete_expired(&self, _now_ms: i64, _budget: usize) -> StoreResult<u64> {
        Ok(0)
    }
    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }
}

/// What a run of regions came to.
pub(crate) struct RegionsOutcome {
    /// Most hits in any window, over `MAX`, as a fraction: the whole run, and the windows that
    /// lie wholly before the cut, wholly in it once every instance knew, and wholly after the
    /// heal (`f64::MIN` where there is no such phase).
    pub(crate) over: f64,
    pub(crate) phases: [f64; 3],
    /// The written partition bound, as a fraction over `MAX` (0 without a cut).
    pub(crate) bound: f64,
    /// The longest any instance took to keep to its budget after the cut began, ms.
    pub(crate) detected_after: i64,
    /// Per region, what it admitted.
    pub(crate) per_region: Vec<u64>,
}

/// `regions` regions of `PER_REGION` instances with a hot client at 10x its limit spread
/// evenly over every instance (`pattern`), the link cut over `cut` (ms from the start),
/// syncing as on Cassandra (`sync.max_delay_ms` = 2 s). `split` is the policy's fixed split.
pub(crate) async fn simulate_regions(
    regions: usize,
    pattern: Pattern,
    cut: Option<(i64, i64)>,
    split: Option<&[f64]>,
    duration_ms: i64,
) -> RegionsOutcome {
    let clock = ManualClock::new(T0);
    let shared = Arc::new(Replicas::new(regions, T0));
    let names: Vec<String> = (0..regions).map(|r| format!("dc{}", r + 1)).collect();
    let mut doc = serde_json::json!({
        "limits": [{"id": "w", "max": MAX, "window": "10s", "scope": "tenant"}],
    });
    if let Some(split) = split {
        let m: serde_json::Map<String, serde_json::Value> = names
            .iter()
            .zip(split)
            .map(|(n, f)| (n.clone(), serde_json::json!(f)))
            .collect();
        doc["regions"] = serde_json::Value::Object(m);
    }
    let doc: PolicyDoc = serde_json::from_value(doc).unwrap();
    let policy = Policy::from_doc(&doc, false).unwrap();
    let mut fleet = Vec::new();
    for (r, name) in names.iter().enumerate() {
        for k in 0..PER_REGION {
            let view = Arc::new(RegionView {
                shared: shared.clone(),
                region: r,
                shard: r * PER_REGION + k,
            });
            let membership = Arc::new(Membership::alone());
            membership.set_region(name);
            membership.set_members((regions * PER_REGION) as u32);
            membership.set_region_members(PER_REGION as u32);
            membership.set_regions(regions as u32, None);
            let (limiter, syncer) =
                limiter_and_syncer(view, shared.history.clone(), &clock, &membership, 2_000);
            fleet.push((r, limiter, syncer, membership));
        }
    }
    let tenant = TenantId::parse("acme").unwrap();
    let client = ClientId::parse("k").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let mut pending_reads: Vec<Vec<CounterRange>> = vec![Vec::new(); fleet.len()];
    let mut log: Vec<i64> = Vec::new();
    let mut log_regions: Vec<usize> = Vec::new();
    let mut per_region = vec![0u64; regions];
    let mut detected_after = 0i64;
    let mut knows = vec![false; fleet.len()];
    let mut watches: Vec<Watch> = fleet.iter().map(|_| Watch::default()).collect();
    let mut offered = 0u64;
    for t in 0..duration_ms {
        let now = T0 + t;
        clock.set(now);
        if let Some((from, to)) = cut {
            shared.set_cut((from..to).contains(&t), now);
        }
        shared.deliver(now);
        if t % REGION_BEAT_MS == 0 {
            for r in 0..regions {
                shared.beat(r, now);
            }
            // Each instance judges the heartbeats of its region's replica as the fleet task does
            // (`quotad::tasks::fleet::regions::Watch`), with the leases as they stand there (a remote
            // region's run out `LEASE_TTL_MS` after it was last heard).
            let beats = shared.beats.lock().unwrap().clone();
            for (i, (r, _, _, m)) in fleet.iter().enumerate() {
                // A region heard again after a cut: look for its heartbeats of the cut.
                for replay in watches[i].replays(REGION_STALE_MS) {
                    let q = names.iter().position(|n| *n == replay.region).unwrap();
                    let ats = shared.beats_between(*r, q, replay.from, replay.to);
                    watches[i].found(&replay, &ats, REGION_BEAT_MS, now);
                }
                let rows: Vec<RegionBeat> = (0..regions)
                    .map(|q| RegionBeat {
                        region: names[q].clone(),
                        slot: q as i16,
                        at_ms: beats[*r][q],
                    })
                    .collect();
                let members: Vec<Member> = (0..regions)
                    .filter(|&q| q == *r || now - beats[*r][q] <= LEASE_TTL_MS)
                    .flat_map(|q| (0..PER_REGION).map(move |k| q * MAX_SHARDS as usize + k))
                    .map(|shard| Member::new(shard as i16, format!("o{shard}")))
                    .collect();
                let j = watches[i].judge(
                    &rows,
                    (&names[*r], *r as i16),
                    &members,
                    now,
                    REGION_STALE_MS,
                    HEAL_GRACE_MS,
                );
                m.set_members(members.len() as u32);
                m.set_regions(j.regions, j.cut_since);
                if let (Some((from, _)), Some(_)) = (cut, m.cut_since()) {
                    if t >= from && !knows[i] {
                        knows[i] = true;
                        detected_after = detected_after.max(t - from);
                    }
                }
            }
        }
        if t % SYNC_MS == 0 {
            for (i, (_, _, s, _)) in fleet.iter().enumerate() {
                pending_reads[i] = s.write().await.unwrap().0;
            }
        }
        if t % SYNC_MS == REGION_SETTLE_MS {
            for (i, (_, _, s, _)) in fleet.iter().enumerate() {
                s.read_back(&pending_reads[i]).await;
            }
        }
        let arr = arrivals(pattern, t, fleet.len(), &mut rng);
        for (i, count) in arr.iter().enumerate() {
            for _ in 0..*count {
                offered += 1;
                let (r, limiter, _, _) = &fleet[i];
                let d = check_one(limiter, &policy, &tenant, &client).await;
                assert!(d.store_failure.is_none(), "every region's store answers");
                if d.allowed {
                    log.push(now);
                    log_regions.push(*r);
                    per_region[*r] += 1;
                }
            }
        }
    }
    // Drain every instance, heal, deliver: every replica holds every admitted hit.
    for (_, _, s, _) in &fleet {
        assert_eq!(s.drain().await, 0, "a drain writes everything");
    }
    shared.set_cut(false, T0 + duration_ms);
    let mut at = T0 + duration_ms;
    while !shared.inflight.lock().unwrap().is_empty() {
        at += 1_000;
        shared.deliver(at);
    }
    let totals = shared.totals();
    assert!(
        totals.iter().all(|&n| n == log.len() as i64),
        "every region's replica holds every admitted hit: {totals:?} against {}",
        log.len()
    );
    if std::env::var("SIM_DEBUG").is_ok() {
        // Where the worst windows lie: each second, the most hits of a window ending in it.
        for second in (WINDOW_MS..duration_ms).step_by(1_000) {
            let most = (second..second + 1_000)
                .step_by(10)
                .map(|end| {
                    let per: Vec<usize> = (0..regions)
                        .map(|r| {
                            log.iter()
                                .zip(&log_regions)
                                .filter(|&(&x, &q)| {
                                    q == r && x >= T0 + end - WINDOW_MS && x < T0 + end
                                })
                                .count()
                        })
                        .collect();
                    (per.iter().sum::<usize>(), end, per)
                })
                .max()
                .unwrap();
            println!("window ending {}: {} {:?}", most.1, most.0, most.2);
        }
    }
    let (admitted, denied) = *shared.history.0.lock().unwrap();
    assert_eq!(
        (admitted, denied),
        (log.len() as u64, offered - log.len() as u64)
    );
    let bound = cut.map_or(0.0, |(from, _)| {
        let at = T0 + from;
        // What each region held in the window at the cut, against its fixed part (with the
        // earned default, a region's budget is its part of what the window held: nothing).
        let mismatch: f64 = split.map_or(0.0, |split| {
            (0..regions)
                .map(|r| {
                    let held = log
                        .iter()
                        .zip(&log_regions)
                        .filter(|&(&x, &q)| q == r && x > at - WINDOW_MS && x <= at)
                        .count() as f64;
                    (held - split[r] * MAX as f64).max(0.0)
                })
                .sum()
        });
        (partition_bound(&log, at, detected_after, regions) + mismatch) / MAX as f64 - 1.0
    });
    // The windows that lie wholly in one phase: before the cut (after the first window),
    // during it once every instance knew, and after the heal.
    let within = |from: i64, to: i64| {
        let hits: Vec<i64> = log
            .iter()
            .copied()
            .filter(|&x| x >= T0 + from && x < T0 + to)
            .collect();
        worst_window(&hits, WINDOW_MS) as f64 / MAX as f64 - 1.0
    };
    let phases = match cut {
        None => [within(WINDOW_MS, duration_ms), f64::MIN, f64::MIN],
        Some((from, to)) => [
            within(WINDOW_MS, from),
            within(from + detected_after + REGION_BEAT_MS, to),
            within(to, duration_ms),
        ],
    };
    RegionsOutcome {
        over: worst_window(&log, WINDOW_MS) as f64 / MAX as f64 - 1.0,
        phases,
        bound,
        detected_after,
        per_region,
    }
}

/// The written bound of a partition (docs/regions.md), in hits, before the regions' parts
/// beyond their fixed budgets: `max + R x H_D`, where `H_D` is the headroom the window had at
/// the cut (`max` less what it held) plus what left it while the regions did not yet know
/// (`detected`).
pub(crate) fn partition_bound(log: &[i64], cut_at: i64, detected: i64, regions: usize) -> f64 {
    let held = log
        .iter()
        .filter(|&&x| x > cut_at - WINDOW_MS && x <= cut_at)
        .count() as f64;
    let freed = log
        .iter()
        .filter(|&&x| x > cut_at - WINDOW_MS && x <= cut_at - WINDOW_MS + detected)
        .count() as f64;
    let headroom = (MAX as f64 - held).max(0.0) + freed;
    MAX as f64 + regions as f64 * headroom
}
