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
    /// Overrides as stored.
    overrides: HashMap<Arc<str>, Arc<Policy>>,
    /// Overrides merged with `base` (or with the default policy when the tenant has none).
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

/// The policy for one client of a tenant in `snap`.
fn lookup<'a>(
    snap: &'a Snapshot,
    default: &'a Option<Arc<Policy>>,
    tenant: &str,
    client: &str,
) -> Option<&'a Arc<Policy>> {
    let base = match snap.tenants.get(tenant) {
        Some(t) => {
            if let Some(m) = t.merged.get(client) {
                return Some(m);
            }
            t.base.as_ref()
        }
        None => None,
    };
    base.or(default.as_ref())
}

/// [`PolicyCache::view`].
pub struct PolicyView<'c> {
    snapshot: Arc<Snapshot>,
    default: &'c Option<Arc<Policy>>,
}

impl PolicyView<'_> {
    /// [`PolicyCache::resolve`], in this view.
    pub fn resolve(&self, tenant: &str, client: &str) -> Option<&Arc<Policy>> {
        lookup(&self.snapshot, self.default, tenant, client)
    }
}

impl PolicyCache {
    pub fn new(store: DynStore, default: Option<Policy>) -> Self {
        Self {
            store,
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            default: default.map(Arc::new),
        }
    }

    /// The policy for one client of a tenant, or None when the tenant has no quota.
    pub fn resolve(&self, tenant: &str, client: &str) -> Option<Arc<Policy>> {
        self.with(tenant, client, Arc::clone)
    }

    /// `f` on the policy for one client of a tenant, lent from the snapshot for as long as
    /// `f` runs: no reference count is written, where a clone wrote one that every worker
    /// shares. None when the tenant has no quota.
    pub fn with<R>(
        &self,
        tenant: &str,
        client: &str,
        f: impl FnOnce(&Arc<Policy>) -> R,
    ) -> Option<R> {
        lookup(&self.snapshot.load(), &self.default, tenant, client).map(f)
    }

    /// The policies as they are now, for many lookups (a batch's items): one snapshot load,
    /// and each policy lent rather than cloned (no shared reference count written per item).
    pub fn view(&self) -> PolicyView<'_> {
        PolicyView {
            snapshot: self.snapshot.load_full(),
            default: &self.default,
        }
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
                    t.overrides.insert(c.as_arc().clone(), Arc::new(p));
                }
            }
        }
        for t in tenants.values_mut() {
            let Some(base) = t.base.as_ref().or(self.default.as_ref()) else {
                continue;
            };
            for (c, o) in &t.overrides {
                t.merged.insert(c.clone(), Arc::new(base.merged_with(o)));
            }
        }
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
