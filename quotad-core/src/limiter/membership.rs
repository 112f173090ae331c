//! What the limiter knows of the fleet, read on the check path without a lock: how many
//! instances hold a lease now (N in the share formula), the shard this one writes, and whether
//! it holds its lease. The fleet task (`fleet`), which claims and renews the lease, writes it;
//! a process alone (the embedded store, tests) keeps [`Membership::alone`].
//!
//! An instance that cannot renew stops admitting from a share it may no longer hold: once its
//! lease may have ended, `holds_lease` turns false, the limiter decides as the policy's
//! `on_store_failure` says, and `/readyz` answers 503 until a lease is held again.
//!
//! In a fleet of several regions (data centres) it also knows its region, the members there,
//! and since when another region has gone unheard ([`Membership::cut_since`]): from then on
//! every counter keeps to its region's budget (`share`).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;

/// A region as this instance last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSeen {
    pub region: String,
    /// This instance's own region.
    pub local: bool,
    /// Instances holding a lease there, as this region's replicas show the leases.
    pub members: u32,
    /// How old its newest heartbeat is here (replication lag plus up to one heartbeat); 0 for
    /// this region.
    pub lag_ms: i64,
    /// Unheard for longer than `fleet.region_stale_ms`: counters keep to their budgets.
    pub cut_off: bool,
}

/// What the process knows of the fleet, read on the check path.
#[derive(Debug)]
pub struct Membership {
    members: AtomicU32,
    /// The shard held, or -1.
    shard: AtomicI32,
    held: AtomicBool,
    /// Regions heard of, this one included; 1 without regions.
    regions: AtomicU32,
    /// Members of this instance's region (all of them without regions).
    region_members: AtomicU32,
    /// Since when (Unix ms) another region has gone unheard; 0 while every one is heard.
    cut_since: AtomicI64,
    /// The replication lag from the regions heard, ms.
    lag_ms: AtomicI64,
    /// How uncertain this instance's reading of the fleet's clock is, ms (`tasks::clock`);
    /// `i64::MAX` while it has not been read; 0 alone.
    clock_uncertainty_ms: AtomicI64,
    region: OnceLock<Arc<str>>,
    seen: ArcSwap<Vec<RegionSeen>>,
    /// Before when (Unix ms, the limiter's clock) every hit this instance admitted was
    /// acknowledged by the store, as the sync task found it; `i64::MIN` until a round has.
    written_ms: AtomicI64,
    /// The least of the others' reports of the same, as the roster last showed them;
    /// `i64::MAX` while no other instance has reported.
    others_written_ms: AtomicI64,
    /// How often the reports are written and read (the lease heartbeat), ms.
    report_every_ms: AtomicI64,
}

impl Membership {
    /// A process that is the whole fleet (the embedded store, tests): one member, holding.
    pub fn alone() -> Self {
        Self {
            members: AtomicU32::new(1),
            shard: AtomicI32::new(0),
            held: AtomicBool::new(true),
            ..Self::joining()
        }
    }

    /// A fleet member that holds nothing yet.
    pub fn joining() -> Self {
        Self {
            members: AtomicU32::new(1),
            shard: AtomicI32::new(-1),
            held: AtomicBool::new(false),
            regions: AtomicU32::new(1),
            region_members: AtomicU32::new(1),
            cut_since: AtomicI64::new(0),
            lag_ms: AtomicI64::new(0),
            clock_uncertainty_ms: AtomicI64::new(0),
            region: OnceLock::new(),
            seen: ArcSwap::from_pointee(Vec::new()),
            written_ms: AtomicI64::new(i64::MIN),
            others_written_ms: AtomicI64::new(i64::MAX),
            report_every_ms: AtomicI64::new(0),
        }
    }

    /// Instances holding a lease now, this one included; at least 1.
    #[inline]
    pub fn members(&self) -> u32 {
        self.members.load(Ordering::Relaxed)
    }

    /// Whether this instance may admit from its share: it holds a lease that has not ended.
    #[inline]
    pub fn holds_lease(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }

    /// The shard this instance writes, while it holds one.
    pub fn shard(&self) -> Option<i16> {
        let s = self.shard.load(Ordering::Relaxed);
        (s >= 0 && self.holds_lease()).then_some(s as i16)
    }

    /// How uncertain this instance's reading of the fleet's clock is, ms (`i64::MAX`: not read).
    #[inline]
    pub fn clock_uncertainty_ms(&self) -> i64 {
        self.clock_uncertainty_ms.load(Ordering::Relaxed)
    }

    /// The clock task read the fleet's clock within `ms` (`i64::MAX`: it could not).
    pub fn set_clock_uncertainty(&self, ms: i64) {
        self.clock_uncertainty_ms
            .store(ms.max(0), Ordering::Relaxed);
    }

    /// N, as the fleet's roster says (and simulations and tests that move it by hand).
    pub fn set_members(&self, n: u32) {
        self.members.store(n.max(1), Ordering::Relaxed);
    }

    /// Whether the lease is held: the fleet task clears it when the lease may have ended
    /// (and tests take it away by hand).
    pub fn set_held(&self, held: bool) {
        self.held.store(held, Ordering::Relaxed);
    }

    /// A lease on `shard` was claimed or renewed.
    pub fn hold(&self, shard: i16) {
        self.shard.store(shard as i32, Ordering::Relaxed);
        self.held.store(true, Ordering::Relaxed);
    }

    /// No lease is held, nor any shard.
    pub fn release(&self) {
        self.shard.store(-1, Ordering::Relaxed);
        self.held.store(false, Ordering::Relaxed);
    }

    /// Regions heard of, this one included: R in the regions' budgets; 1 without regions.
    #[inline]
    pub fn regions(&self) -> u32 {
        self.regions.load(Ordering::Relaxed)
    }

    /// Members of this instance's region: N in the shares within the region.
    #[inline]
    pub fn region_members(&self) -> u32 {
        self.region_members.load(Ordering::Relaxed)
    }

    /// Since when (Unix ms) another region has gone unheard, while one is.
    #[inline]
    pub fn cut_since(&self) -> Option<i64> {
        let c = self.cut_since.load(Ordering::Relaxed);
        (c != 0).then_some(c)
    }

    /// How far behind the other regions' writes reach this region's replicas, ms (0 alone).
    pub fn replication_lag_ms(&self) -> i64 {
        self.lag_ms.load(Ordering::Relaxed)
    }

    /// The replication lag the regions' heartbeats show.
    pub fn set_replication_lag_ms(&self, lag: i64) {
        self.lag_ms.store(lag.max(0), Ordering::Relaxed);
    }

    /// This instance's region, once it joined one.
    pub fn region(&self) -> Option<&Arc<str>> {
        self.region.get()
    }

    /// The regions as last seen (empty without regions).
    pub fn regions_seen(&self) -> Arc<Vec<RegionSeen>> {
        self.seen.load_full()
    }

    /// Names this instance's region (once).
    pub fn set_region(&self, region: &str) {
        let _ = self.region.set(Arc::from(region));
    }

    /// N within this instance's region.
    pub fn set_region_members(&self, n: u32) {
        self.region_members.store(n.max(1), Ordering::Relaxed);
    }

    /// What the last reading of the regions' heartbeats found: how many regions there are,
    /// and since when one has been unheard (`None`: every one is heard).
    pub fn set_regions(&self, regions: u32, cut_since: Option<i64>) {
        self.regions.store(regions.max(1), Ordering::Relaxed);
        self.cut_since
            .store(cut_since.map_or(0, |c| c.max(1)), Ordering::Relaxed);
    }

    /// The regions for `/readyz` and the console.
    pub fn set_seen(&self, seen: Vec<RegionSeen>) {
        self.seen.store(Arc::new(seen));
    }

    /// Before when every hit this instance admitted was acknowledged by the store (`None`
    /// until a round found so).
    pub fn written_ms(&self) -> Option<i64> {
        let w = self.written_ms.load(Ordering::Relaxed);
        (w != i64::MIN).then_some(w)
    }

    /// A sync round found every hit admitted before `ms` acknowledged; never moves back.
    pub fn note_written(&self, ms: i64) {
        self.written_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// The least of the other instances' reports of their writes, and how often reports are
    /// made (ms): `None` while no other instance has reported.
    #[inline]
    pub fn others_written(&self) -> Option<(i64, i64)> {
        let w = self.others_written_ms.load(Ordering::Relaxed);
        let every = self.report_every_ms.load(Ordering::Relaxed);
        (w != i64::MAX).then_some((w, every))
    }

    /// What the roster showed of the others' reports (`None`: no other has reported), made
    /// every `every_ms`.
    pub fn set_others_written(&self, least: Option<i64>, every_ms: i64) {
        self.others_written_ms
            .store(least.unwrap_or(i64::MAX), Ordering::Relaxed);
        self.report_every_ms
            .store(every_ms.max(0), Ordering::Relaxed);
    }
}
