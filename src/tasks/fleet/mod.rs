//! This instance's place in the fleet: it claims a write shard through the store, renews the
//! lease on a heartbeat, and gives it back after the drain (see `store::lease` for the model).
//!
//! It writes what it learns into the limiter's [`Membership`] (N, its shard, whether its lease
//! may have ended), which the check path and `/readyz` read; that module says what follows.
//!
//! On a store with regions (Cassandra/ScyllaDB data centres) it first joins its region, whose
//! slot fixes the range of shards it claims from, and keeps the regions' heartbeats
//! ([`regions`]).

pub mod regions;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::limiter::Membership;
use crate::metrics::Metrics;
use crate::store::lease::{Claim, LeaseStore, Roster};

/// How long start-up keeps trying to claim a shard while the store fails for now (a cluster
/// that is busy, or has a node down): past it, start-up fails and says why.
const JOIN_PATIENCE: Duration = Duration::from_secs(30);

/// How the fleet task runs.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// How often the lease is renewed and the roster read.
    pub heartbeat: Duration,
    /// How long a lease lives without renewal; several heartbeats.
    pub lease_ttl: Duration,
    /// How often the region's heartbeat is written and the others' read.
    pub region_heartbeat: Duration,
    /// Another region's heartbeat older than this means it is cut off.
    pub region_stale: Duration,
    /// How long a region heard again stays cut off: until every counter was read back with
    /// what it wrote meanwhile (`sync.max_delay_ms` and two intervals).
    pub heal_grace: Duration,
    /// A shard this instance must hold (`store.shard`, counted from its region's first), or
    /// any free one.
    pub pin: Option<i16>,
    /// How long one store call of the task may take.
    pub timeout: Duration,
}

/// Why an instance cannot join.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("store.shard {shard} is held by a live instance ({owner}): pin another shard or leave store.shard unset")]
    PinTaken { shard: i16, owner: String },
    #[error("no free shard: {max} instances hold every shard of the fleet", max = crate::store::lease::MAX_SHARDS)]
    Full,
    #[error("claiming a shard: {0}")]
    Store(String),
}

/// The lease this task holds.
#[derive(Clone, Copy, Debug)]
struct Lease {
    shard: i16,
    /// Until when the lease surely lives: the start of the last successful renewal + TTL,
    /// less one heartbeat of slack.
    valid_until: Instant,
}

/// The heartbeat task's state.
pub struct Fleet {
    store: Arc<dyn LeaseStore>,
    cfg: FleetConfig,
    owner: String,
    view: Arc<Membership>,
    metrics: Arc<Metrics>,
    lease: Option<Lease>,
    /// The last shard held, tried first when claiming again.
    last: Option<i16>,
    /// This instance's region and its slot, on a store with regions.
    region: Option<(String, i16)>,
    /// The live leases at the last roster read.
    live: Vec<crate::store::lease::Member>,
    /// N as the shares take it, from the roster reads.
    members: Members,
    /// What the others reported of their writes.
    reports: Reports,
    watch: regions::Watch,
}

/// The other instances' reports of their writes ([`crate::store::lease::Member::written_ms`]),
/// as the roster reads showed them. A member that leaves the roster (its lease lapsed on a
/// stalled renewal) may still hold hits the store lacks: its last report is kept as long as it
/// still counts in N (a lease's life after a read first missed it), so that the shares keep
/// taking its buckets after the report as unsettled.
#[derive(Debug, Default)]
struct Reports {
    seen: Vec<Report>,
}

#[derive(Debug)]
struct Report {
    shard: i16,
    written_ms: i64,
    /// When a roster read last showed it.
    at: Instant,
    /// When a roster read first showed its `written_ms`.
    moved: Instant,
}

impl Reports {
    /// Takes a roster read's `members` at `now`, but `me`; returns the least report of those
    /// shown or kept.
    fn observe(
        &mut self,
        members: &[crate::store::lease::Member],
        me: &str,
        now: Instant,
        keep: Duration,
    ) -> Option<i64> {
        for m in members.iter().filter(|m| m.owner != me) {
            let i = self.seen.iter().position(|r| r.shard == m.shard);
            match (i, m.written_ms) {
                (Some(i), Some(w)) => {
                    let r = &mut self.seen[i];
                    if r.written_ms != w {
                        r.moved = now;
                    }
                    r.written_ms = w;
                    r.at = now;
                }
                (None, Some(w)) => self.seen.push(Report {
                    shard: m.shard,
                    written_ms: w,
                    at: now,
                    moved: now,
                }),
                // Not reporting (yet): nothing to wait for.
                (Some(i), None) => {
                    self.seen.swap_remove(i);
                }
                (None, None) => {}
            }
        }
        self.seen
            .retain(|r| now.saturating_duration_since(r.at) <= keep);
        self.least()
    }

    fn least(&self) -> Option<i64> {
        self.seen.iter().map(|r| r.written_ms).min()
    }

    /// The others whose report has not moved for `after`: a healthy instance's moves every
    /// sync round it writes with an answer, idle or not.
    fn stalled(&self, now: Instant, after: Duration) -> u32 {
        let n = self
            .seen
            .iter()
            .filter(|r| now.saturating_duration_since(r.moved) > after);
        n.count() as u32
    }
}

/// The fleet's size as the shares take it ([`Membership::set_members`]): the live leases,
/// this instance counted whether or not it holds one now (it serves checks either way), and
/// no smaller than before until roster reads have shown fewer for a lease's life. A lease
/// lapses when a renewal stalls on a slow or paused node, and is claimed again a heartbeat
/// later; meanwhile the roster shows one instance fewer, and an instance that took that for
/// the fleet shrinking would take the lapsed one's share while that one still serves, on
/// counts that lack its latest hits (the same stall holds up the reads back). Roster reads
/// that fail in between prove nothing: the wait starts at the first read that shows fewer. An
/// instance that is gone for good leaves N one lease's life after a read first misses it.
#[derive(Debug)]
struct Members {
    most: u32,
    /// Since when roster reads have shown fewer than `most`.
    fewer_since: Option<Instant>,
}

impl Members {
    fn new() -> Self {
        Members {
            most: 1,
            fewer_since: None,
        }
    }

    /// Takes a roster read's count at `now`; returns N.
    fn observe(&mut self, n: u32, now: Instant, hold: Duration) -> u32 {
        let n = n.max(1);
        if n >= self.most {
            self.most = n;
            self.fewer_since = None;
        } else {
            let since = *self.fewer_since.get_or_insert(now);
            if now.saturating_duration_since(since) > hold {
                self.most = n;
                self.fewer_since = None;
            }
        }
        self.most
    }
}

impl Fleet {
    /// Claims a shard before the instance serves. A pin that another live instance holds, or a
    /// full shard space, stops start-up.
    pub async fn join(
        store: Arc<dyn LeaseStore>,
        cfg: FleetConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Fleet, JoinError> {
        let mut fleet = Fleet {
            store,
            owner: instance_name(),
            view: Arc::new(Membership::joining()),
            metrics,
            lease: None,
            last: None,
            region: None,
            live: Vec::new(),
            members: Members::new(),
            reports: Reports::default(),
            watch: regions::Watch::default(),
            cfg,
        };
        let started = Instant::now();
        let region = patiently(started, fleet.cfg.timeout, || fleet.store.local_region()).await?;
        if let Some(region) = region {
            let slot = patiently(started, fleet.cfg.timeout, || {
                fleet.store.join_region(&region)
            })
            .await?;
            fleet.view.set_region(&region);
            fleet.region = Some((region, slot));
        }
        // A claim that timed out may have landed: the shard it took is renewed by nobody and
        // expires, and the next try takes another.
        let claim = patiently(started, fleet.cfg.timeout, || {
            fleet
                .store
                .claim(&fleet.owner, fleet.cfg.pin, None, fleet.cfg.lease_ttl)
        })
        .await?;
        match claim {
            Claim::Held(shard) => fleet.hold(shard, started),
            Claim::Taken { shard, owner } => return Err(JoinError::PinTaken { shard, owner }),
            Claim::Full => return Err(JoinError::Full),
        }
        fleet.refresh_roster().await;
        fleet.region_round().await;
        tracing::info!(owner = %fleet.owner, region = ?fleet.region.as_ref().map(|r| &r.0), shard = ?fleet.lease.map(|l| l.shard), members = fleet.view.members(), "joined the fleet");
        Ok(fleet)
    }

    /// What the check path reads.
    pub fn membership(&self) -> Arc<Membership> {
        self.view.clone()
    }

    /// Heartbeats until `leave` turns true (after the drain), then gives the lease back.
    pub async fn run(mut self, mut leave: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.cfg.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut region_tick = tokio::time::interval(self.cfg.region_heartbeat);
        region_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        region_tick.tick().await;
        let regions = self.region.is_some();
        loop {
            let lease = tokio::select! {
                _ = leave.wait_for(|stop| *stop) => break,
                _ = tick.tick() => true,
                _ = region_tick.tick(), if regions => false,
            };
            // A region round never holds up the lease: a heartbeat that falls due meanwhile
            // drops it. Its calls may each wait the store's request timeout (a paused
            // replica), longer than a lease lives.
            let lease = lease
                || tokio::select! {
                    _ = self.region_round() => false,
                    _ = tick.tick() => true,
                };
            if lease {
                self.heartbeat().await;
            }
        }
        self.release().await;
    }

    /// One heartbeat: renew (or claim again), report how far this instance's writes have
    /// reached the store, then read the roster.
    pub async fn heartbeat(&mut self) {
        let started = Instant::now();
        match self.lease {
            Some(lease) => self.renew(lease, started).await,
            None => self.claim_again(started).await,
        }
        self.report_written().await;
        self.refresh_roster().await;
    }

    /// Writes [`Membership::written_ms`] for the others, while the lease is held.
    async fn report_written(&mut self) {
        let (Some(lease), Some(written)) = (self.lease, self.view.written_ms()) else {
            return;
        };
        if !self.view.holds_lease() {
            return;
        }
        let report =
            self.store
                .report_written(lease.shard, &self.owner, written, self.cfg.lease_ttl);
        if let Err(e) = self.call(report).await {
            tracing::warn!(shard = lease.shard, error = %e, "reporting this instance's writes failed");
        }
    }

    async fn renew(&mut self, lease: Lease, started: Instant) {
        let renewed = self
            .call(
                self.store
                    .renew(lease.shard, &self.owner, self.cfg.lease_ttl),
            )
            .await;
        match renewed {
            Ok(true) => self.hold(lease.shard, started),
            Ok(false) => {
                if started < lease.valid_until {
                    // Our lease should still live, yet the store says another owner has it.
                    self.metrics.fleet().conflict();
                    tracing::error!(
                        shard = lease.shard,
                        "lease taken by another instance while still ours"
                    );
                } else {
                    tracing::warn!(
                        shard = lease.shard,
                        "lease ended before it was renewed; claiming again"
                    );
                }
                self.drop_lease();
                self.claim_again(started).await;
            }
            Err(e) => {
                self.metrics.fleet().renewal_failed();
                tracing::warn!(shard = lease.shard, error = %e, "lease renewal failed");
                if started >= lease.valid_until {
                    // It may have ended: stop admitting from its share until renewed.
                    self.view.set_held(false);
                }
            }
        }
    }

    async fn claim_again(&mut self, started: Instant) {
        let claimed = self
            .call(
                self.store
                    .claim(&self.owner, self.cfg.pin, self.last, self.cfg.lease_ttl),
            )
            .await;
        match claimed {
            Ok(Claim::Held(shard)) => {
                tracing::info!(shard, "claimed a shard");
                self.hold(shard, started);
            }
            Ok(Claim::Taken { shard, owner }) => {
                tracing::warn!(shard, %owner, "the pinned shard is held by another instance")
            }
            Ok(Claim::Full) => tracing::error!("no free shard: the fleet is full"),
            Err(e) => {
                self.metrics.fleet().renewal_failed();
                tracing::warn!(error = %e, "claiming a shard failed")
            }
        }
    }

    fn hold(&mut self, shard: i16, started: Instant) {
        let slack = self.cfg.heartbeat.min(self.cfg.lease_ttl / 2);
        self.lease = Some(Lease {
            shard,
            valid_until: started + self.cfg.lease_ttl - slack,
        });
        self.last = Some(shard);
        self.view.hold(shard);
    }

    fn drop_lease(&mut self) {
        self.lease = None;
        self.view.release();
    }

    /// Reads who is live, tells the store where to write and what to sum, and N to the view.
    async fn refresh_roster(&mut self) {
        let roster = match self.call(self.store.roster()).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the fleet's members failed");
                self.apply(None);
                return;
            }
        };
        if let Some(lease) = self.lease {
            let holder = roster.members.iter().find(|m| m.shard == lease.shard);
            if holder.is_some_and(|m| m.owner != self.owner) {
                self.metrics.fleet().conflict();
                tracing::error!(
                    shard = lease.shard,
                    "another instance holds this instance's shard"
                );
                self.drop_lease();
            }
        }
        self.apply(Some(&roster));
    }

    fn apply(&mut self, roster: Option<&Roster>) {
        if let Some(r) = roster {
            self.live.clone_from(&r.members);
        }
        let write = self
            .lease
            .map(|l| l.shard)
            .filter(|_| self.view.holds_lease());
        if let Some(r) = roster {
            let mut read = r.used.clone();
            if let Some(s) = write.filter(|s| !read.contains(s)) {
                read.push(s);
                read.sort_unstable();
            }
            self.store.adopt(write, &read);
            let me = r.members.iter().any(|m| m.owner == self.owner);
            let seen = r.members.len() as u32 + u32::from(!me);
            let n = self
                .members
                .observe(seen, Instant::now(), self.cfg.lease_ttl);
            self.view.set_members(n);
            let least =
                self.reports
                    .observe(&r.members, &self.owner, Instant::now(), self.cfg.lease_ttl);
            let every = self.cfg.heartbeat.as_millis().min(i64::MAX as u128) as i64;
            self.view.set_others_written(least, every);
            let stalled = self.reports.stalled(Instant::now(), 2 * self.cfg.heartbeat);
            let was = self.metrics.fleet().writes_stalled(stalled);
            if stalled > was {
                tracing::warn!(members = stalled, written_before_ms = least, "another instance's writes have gone unanswered for two heartbeats: shares hold still until it reports again");
            } else if stalled < was {
                tracing::info!(
                    members = stalled,
                    "instances whose writes went unanswered report again"
                );
            }
            let slot = self.region.as_ref().map_or(0, |r| r.1);
            let here = r
                .members
                .iter()
                .filter(|m| crate::store::lease::slot_of(m.shard) == slot)
                .count() as u32;
            self.view.set_region_members(here);
            self.metrics.fleet().seen(n, write);
        } else {
            self.metrics.fleet().seen(self.view.members(), write);
        }
    }

    async fn release(&mut self) {
        if let Some(lease) = self.lease.take() {
            match self
                .call(self.store.release(lease.shard, &self.owner))
                .await
            {
                Ok(_) => tracing::info!(shard = lease.shard, "released the shard lease"),
                Err(e) => {
                    tracing::warn!(error = %e, "releasing the lease failed; it expires by itself")
                }
            }
        }
        self.drop_lease();
    }

    async fn call<T>(
        &self,
        f: impl std::future::Future<Output = crate::store::StoreResult<T>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(self.cfg.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }
}

/// Runs a start-up call of the store until it succeeds, fails for good, or [`JOIN_PATIENCE`]
/// has passed since `started` (each try within `timeout`): a busy or partly down cluster fails
/// some calls for now, and a lightweight transaction that timed out is tried again.
async fn patiently<T, F, Fut>(started: Instant, timeout: Duration, call: F) -> Result<T, JoinError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = crate::store::StoreResult<T>>,
{
    let mut wait = Duration::from_millis(100);
    loop {
        let failed = match tokio::time::timeout(timeout, call()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !e.is_transient() => return Err(JoinError::Store(e.to_string())),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        if started.elapsed() >= JOIN_PATIENCE {
            return Err(JoinError::Store(failed));
        }
        tracing::warn!(error = %failed, "joining the fleet: a store call failed; trying again");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(2));
    }
}

/// A name unique to this process: host, pid and a random part (a restarted process on the
/// same host with the same pid is still another owner).
pub fn instance_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "quotad".into());
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

#[cfg(test)]
mod tests;
