//! The policy cache: every tenant's policy and client overrides, in memory.
//!
//! Checks read an immutable snapshot through `ArcSwap` (no lock, no allocation); a refresher
//! polls the store's policies generation every `quotas.refresh_ms` and rebuilds the snapshot
//! when it moved, so a change made through any instance is enforced everywhere within one
//! refresh interval. A change made through this instance is applied at once.
//!
//! Overrides are merged with their tenant's policy when the snapshot is built, so a check pays
//! one or two hash lookups. A client override applies only while its tenant has a policy (or a
//! default policy is configured): a tenant without a quota is unknown, overrides or not.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::domain::{Policy, PolicyDoc};
use crate::store::{DynStore, PolicyRecord, StoreError};

#[derive(Default)]
struct TenantPolicies {
    base: Option<Arc<Policy>>,
    /// Overrides as stored (unmerged), so a default policy can be merged on lookup.
    raw_overrides: HashMap<Arc<str>, Arc<Policy>>,
    /// Overrides merged with `base`.
    merged: HashMap<Arc<str>, Arc<Policy>>,
}

#[derive(Default)]
struct Snapshot {
    generation: u64,
    tenants: HashMap<Arc<str>, TenantPolicies>,
}

pub struct PolicyCache {
    store: DynStore,
    snapshot: ArcSwap<Snapshot>,
    default: Option<Arc<Policy>>,
    /// The default merged with each override that has no tenant policy, built on reload.
    default_merged: ArcSwap<HashMap<(Arc<str>, Arc<str>), Arc<Policy>>>,
}

/// Parses a stored record. A record that no longer parses is skipped with an error log rather
/// than taking the tenant's other policies down with it.
fn parse(r: &PolicyRecord) -> Option<Policy> {
    let doc: PolicyDoc = match serde_json::from_str(&r.body) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(tenant = %r.key.tenant, error = %e, "stored policy is not valid JSON; ignored");
            return None;
        }
    };
    match Policy::from_doc(&doc, r.key.client.is_some()) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::error!(tenant = %r.key.tenant, error = %e, "stored policy is invalid; ignored");
            None
        }
    }
}

impl PolicyCache {
    pub fn new(store: DynStore, default: Option<Policy>) -> Self {
        Self {
            store,
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            default: default.map(Arc::new),
            default_merged: ArcSwap::from_pointee(HashMap::new()),
        }
    }

    /// The policy for one client of a tenant, or None when the tenant has no quota.
    pub fn resolve(&self, tenant: &str, client: &str) -> Option<Arc<Policy>> {
        let snap = self.snapshot.load();
        match snap.tenants.get(tenant) {
            Some(t) if t.base.is_some() => t.merged.get(client).or(t.base.as_ref()).cloned(),
            Some(t) if self.default.is_some() && t.raw_overrides.contains_key(client) => self
                .default_merged
                .load()
                .get(&(Arc::from(tenant), Arc::from(client)))
                .cloned()
                .or_else(|| self.default.clone()),
            _ => self.default.clone(),
        }
    }

    /// Whether the tenant has a policy of its own or a default applies (for `/v1/usage`).
    pub fn has_quota(&self, tenant: &str) -> bool {
        self.default.is_some()
            || self
                .snapshot
                .load()
                .tenants
                .get(tenant)
                .is_some_and(|t| t.base.is_some())
    }

    /// Reloads everything from the store if its generation moved (or `force`).
    pub async fn reload(&self, force: bool) -> Result<bool, StoreError> {
        let generation = self.store.policies_generation().await?;
        if !force && generation == self.snapshot.load().generation {
            return Ok(false);
        }
        let records = self.store.load_policies().await?;
        let mut tenants: HashMap<Arc<str>, TenantPolicies> = HashMap::new();
        for r in &records {
            let Some(p) = parse(r) else { continue };
            let t = tenants.entry(r.key.tenant.as_arc().clone()).or_default();
            match &r.key.client {
                None => t.base = Some(Arc::new(p)),
                Some(c) => {
                    t.raw_overrides.insert(c.as_arc().clone(), Arc::new(p));
                }
            }
        }
        let mut default_merged = HashMap::new();
        for (name, t) in tenants.iter_mut() {
            for (c, o) in &t.raw_overrides {
                match (&t.base, &self.default) {
                    (Some(b), _) => {
                        t.merged.insert(c.clone(), Arc::new(b.merged_with(o)));
                    }
                    (None, Some(d)) => {
                        default_merged
                            .insert((name.clone(), c.clone()), Arc::new(d.merged_with(o)));
                    }
                    (None, None) => {}
                }
            }
        }
        self.default_merged.store(Arc::new(default_merged));
        self.snapshot.store(Arc::new(Snapshot {
            generation,
            tenants,
        }));
        Ok(true)
    }

    /// Polls the store every `every` until `shutdown`.
    pub async fn run(self: Arc<Self>, every: Duration, mut shutdown: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            if let Err(e) = self.reload(false).await {
                tracing::warn!(error = %e, "policy refresh failed; keeping the cached policies");
            }
        }
    }
}
