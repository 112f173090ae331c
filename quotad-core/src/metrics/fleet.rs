//! The metrics of fleet membership: the fleet task's lease (N, this instance's shard, lease
//! trouble) and, in several data centres, each region as this one sees it.

use prometheus::{IntCounter, IntGauge, IntGaugeVec, Opts, Registry};

/// Fleet membership (the fleet task's lease): N, this instance's shard, and lease trouble.
pub struct FleetMetrics {
    members: IntGauge,
    /// One series, `shard` = the shard held or `none`, value 1.
    instance: IntGaugeVec,
    renewals_failed: IntCounter,
    conflicts: IntCounter,
    writes_stalled: IntGauge,
    /// Per region: its members, how far behind its writes are here, whether it is cut off.
    region_members: IntGaugeVec,
    region_lag: prometheus::GaugeVec,
    region_cut_off: IntGaugeVec,
}

impl FleetMetrics {
    pub(super) fn new(registry: &Registry) -> Self {
        let members = IntGauge::new(
            "quotad_fleet_members",
            "Instances holding a shard lease in the store, this one included (N in the shares).",
        )
        .expect("valid metric");
        let instance = IntGaugeVec::new(
            Opts::new(
                "quotad_instance_info",
                "This instance: `shard` is the write shard it holds a lease on, or `none`.",
            ),
            &["shard"],
        )
        .expect("valid metric");
        let renewals_failed = IntCounter::new(
            "quotad_lease_renewals_failed_total",
            "Lease renewals or claims that failed (store error or timeout); once the lease may \
             have ended, the instance decides as on_store_failure says.",
        )
        .expect("valid metric");
        let conflicts = IntCounter::new(
            "quotad_lease_conflicts_total",
            "Times another instance was found holding this instance's shard (two writers on \
             one shard: counts stay exact, shares are off until one claims another shard).",
        )
        .expect("valid metric");
        let writes_stalled = IntGauge::new(
            "quotad_fleet_writes_stalled",
            "Other instances whose report of their answered writes has not moved for two \
             heartbeats (their sync writes fail or go unanswered): shares hold still meanwhile.",
        )
        .expect("valid metric");
        let region_members = IntGaugeVec::new(
            Opts::new(
                "quotad_region_members",
                "Instances holding a shard lease in each region, as this region's replicas show                  the leases (a fleet in several data centres).",
            ),
            &["region"],
        )
        .expect("valid metric");
        let region_lag = prometheus::GaugeVec::new(
            Opts::new(
                "quotad_region_replication_lag_seconds",
                "How old the newest heartbeat of each other region is in this region's                  replicas: how far its writes lag behind here, plus up to one heartbeat.",
            ),
            &["region"],
        )
        .expect("valid metric");
        let region_cut_off = IntGaugeVec::new(
            Opts::new(
                "quotad_region_cut_off",
                "1 while a region has been unheard for fleet.region_stale_ms: counters keep to                  their region's budget.",
            ),
            &["region"],
        )
        .expect("valid metric");
        for c in [
            Box::new(members.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(instance.clone()),
            Box::new(renewals_failed.clone()),
            Box::new(conflicts.clone()),
            Box::new(writes_stalled.clone()),
            Box::new(region_members.clone()),
            Box::new(region_lag.clone()),
            Box::new(region_cut_off.clone()),
        ] {
            registry.register(c).expect("unique metric");
        }
        members.set(1);
        instance.with_label_values(&["none"]).set(1);
        Self {
            members,
            instance,
            renewals_failed,
            conflicts,
            writes_stalled,
            region_members,
            region_lag,
            region_cut_off,
        }
    }

    /// The fleet as this instance sees it after a heartbeat.
    pub fn seen(&self, members: u32, shard: Option<i16>) {
        self.members.set(members as i64);
        self.instance.reset();
        let label = shard.map_or_else(|| "none".to_owned(), |s| s.to_string());
        self.instance.with_label_values(&[&label]).set(1);
    }

    /// A region as this instance last saw it (`fleet::regions`): its members, and for another
    /// region how old its heartbeat is here and whether it is cut off.
    pub fn region(&self, region: &str, members: u32, remote: Option<(i64, bool)>) {
        let f = self;
        let l = [region];
        f.region_members
            .with_label_values(&l)
            .set(i64::from(members));
        if let Some((lag_ms, cut_off)) = remote {
            f.region_lag
                .with_label_values(&l)
                .set(lag_ms as f64 / 1_000.0);
            f.region_cut_off
                .with_label_values(&l)
                .set(i64::from(cut_off));
        }
    }

    /// Sets the other instances whose writes stalled; returns the number before.
    pub fn writes_stalled(&self, n: u32) -> u32 {
        let was = self.writes_stalled.get();
        self.writes_stalled.set(i64::from(n));
        was.clamp(0, i64::from(u32::MAX)) as u32
    }

    pub fn renewal_failed(&self) {
        self.renewals_failed.inc();
    }

    pub fn conflict(&self) {
        self.conflicts.inc();
    }
}
