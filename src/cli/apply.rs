//! Policies as files: `quotad apply -f quotas.yaml [--dry-run] [--prune]` and `quotad export`.
//!
//! A quotas file names tenants; each holds its policy (the same fields as the API's policy
//! document; without `limits`, the tenant has no policy of its own) and its clients' overrides:
//!
//! ```yaml
//! tenants:
//!   acme:
//!     limits:
//!       - {id: per-second, max: 10, window: 1s}
//!     clients:
//!       vip:
//!         limits:
//!           - {id: per-second, max: 100, window: 1s}
//! ```
//!
//! Every document is validated as the admin API validates it, and compared with the store in its
//! canonical form (every default spelled out), so a file that says the same thing in fewer words
//! changes nothing, and `quotad export | quotad apply -f - --dry-run` shows no change. Changes are
//! written through the store with the API's versioning, and appended to the audit log.

use std::collections::BTreeMap;

use chrono::Utc;
use serde::{Deserialize, Serialize};

use crate::domain::{ClientId, LimitDoc, Policy, PolicyDoc, TenantId};
use crate::store::{DynStore, PolicyKey, PolicyRecord};

/// A quotas file.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QuotaFile {
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantEntry>,
}

/// One tenant of a quotas file: its policy's fields, and its clients' overrides.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantEntry {
    /// Absent: the tenant has no policy of its own (its overrides still apply under a default
    /// policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Vec<LimitDoc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_store_failure: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions: Option<BTreeMap<String, f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub clients: BTreeMap<String, PolicyDoc>,
}

/// A file that cannot be applied: the message names the file, the tenant and the field.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ApplyError(pub String);

/// What the file asks for: the canonical document of every policy and override it names.
pub type Desired = BTreeMap<(String, Option<String>), PolicyDoc>;

/// Reads a quotas file: JSON when its name ends in `.json`, YAML otherwise (`-` is standard
/// input, read as YAML, which also reads JSON).
pub fn parse(name: &str, text: &str) -> Result<Desired, ApplyError> {
    let file: QuotaFile = if name.ends_with(".json") {
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de)
            .map_err(|e| ApplyError(format!("{name}: {}: {}", path_of(e.path()), e.inner())))?
    } else {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            // The YAML parser's message often starts with the path already.
            let (path, inner) = (path_of(e.path()), e.inner().to_string());
            if inner.starts_with(path.split('.').next().unwrap_or_default()) {
                ApplyError(format!("{name}: {inner}"))
            } else {
                ApplyError(format!("{name}: {path}: {inner}"))
            }
        })?
    };
    let mut out = Desired::new();
    for (tenant, entry) in &file.tenants {
        let at = format!("{name}: tenants.{tenant}");
        TenantId::parse(tenant).map_err(|e| ApplyError(format!("{at}: {}", e.message)))?;
        if let Some(limits) = &entry.limits {
            let doc = PolicyDoc {
                limits: limits.clone(),
                mode: entry.mode.clone(),
                consistency: entry.consistency.clone(),
                on_store_failure: entry.on_store_failure.clone(),
                regions: entry.regions.clone(),
                hold: entry.hold.clone(),
            };
            out.insert((tenant.clone(), None), canonical(&doc, false, &at)?);
        } else if entry.mode.is_some()
            || entry.consistency.is_some()
            || entry.on_store_failure.is_some()
            || entry.regions.is_some()
            || entry.hold.is_some()
        {
            return Err(ApplyError(format!(
                "{at}.limits: a tenant with mode, consistency, on_store_failure, regions or hold needs limits"
            )));
        }
        for (client, doc) in &entry.clients {
            let at = format!("{at}.clients.{client}");
            ClientId::parse(client).map_err(|e| ApplyError(format!("{at}: {}", e.message)))?;
            out.insert(
                (tenant.clone(), Some(client.clone())),
                canonical(doc, true, &at)?,
            );
        }
    }
    Ok(out)
}

fn path_of(p: &serde_path_to_error::Path) -> String {
    let s = p.to_string();
    if s == "." {
        "(top)".into()
    } else {
        s
    }
}

/// The document as the store keeps it, validated as the API validates it.
fn canonical(doc: &PolicyDoc, is_override: bool, at: &str) -> Result<PolicyDoc, ApplyError> {
    Policy::from_doc(doc, is_override)
        .map(|p| p.to_doc())
        .map_err(|e| ApplyError(format!("{at}.{}: {}", e.field, e.message)))
}

/// One policy or override to add, replace or remove.
#[derive(Clone, Debug)]
pub struct Change {
    pub tenant: String,
    pub client: Option<String>,
    pub before: Option<PolicyRecord>,
    /// The canonical document to write; None removes.
    pub after: Option<PolicyDoc>,
    /// What changes, one line each (`+ limits[burst]: ...`).
    pub lines: Vec<String>,
}

impl Change {
    /// `acme` or `acme/vip`, and what happens to it.
    pub fn title(&self) -> String {
        let what = if self.client.is_some() {
            "override"
        } else {
            "policy"
        };
        let verb = match (&self.before, &self.after) {
            (None, Some(_)) => "added",
            (Some(_), Some(_)) => "changed",
            _ => "removed",
        };
        match &self.client {
            None => format!("{}: {what} {verb}", self.tenant),
            Some(c) => format!("{}/{c}: {what} {verb}", self.tenant),
        }
    }
}

/// The stored documents, by key.
async fn current(
    store: &DynStore,
) -> Result<BTreeMap<(String, Option<String>), PolicyRecord>, ApplyError> {
    let all = store
        .load_policies()
        .await
        .map_err(|e| ApplyError(format!("reading the store: {e}")))?;
    Ok(all
        .into_iter()
        .map(|r| {
            (
                (
                    r.key.tenant.to_string(),
                    r.key.client.as_ref().map(ToString::to_string),
                ),
                r,
            )
        })
        .collect())
}

fn stored_doc(r: &PolicyRecord) -> Result<PolicyDoc, ApplyError> {
    serde_json::from_str(&r.body).map_err(|e| {
        ApplyError(format!(
            "the store's policy of {} is not a policy: {e}",
            r.key.tenant
        ))
    })
}

/// What applying `desired` would change, in key order; with `prune`, removing what it does not
/// name.
pub async fn plan(
    store: &DynStore,
    desired: &Desired,
    prune: bool,
) -> Result<Vec<Change>, ApplyError> {
    let mut now = current(store).await?;
    let mut changes = Vec::new();
    for ((tenant, client), want) in desired {
        let before = now.remove(&(tenant.clone(), client.clone()));
        let lines = match &before {
            None => {
                let nothing = PolicyDoc {
                    limits: Vec::new(),
                    mode: None,
                    consistency: None,
                    on_store_failure: None,
                    regions: None,
                    hold: None,
                };
                limit_lines(&nothing, want, true)
            }
            Some(r) => {
                let have = stored_doc(r)?;
                if &have == want {
                    continue;
                }
                limit_lines(&have, want, false)
            }
        };
        changes.push(Change {
            tenant: tenant.clone(),
            client: client.clone(),
            before,
            after: Some(want.clone()),
            lines,
        });
    }
    if prune {
        for ((tenant, client), r) in now {
            changes.push(Change {
                tenant,
                client,
                before: Some(r),
                after: None,
                lines: Vec::new(),
            });
        }
        changes.sort_by(|a, b| (&a.tenant, &a.client).cmp(&(&b.tenant, &b.client)));
    }
    Ok(changes)
}

/// The differences of two documents, limit by limit and setting by setting.
fn limit_lines(have: &PolicyDoc, want: &PolicyDoc, new: bool) -> Vec<String> {
    let mut out = Vec::new();
    let show = |l: &LimitDoc| serde_json::to_string(l).unwrap_or_default();
    for l in &want.limits {
        match have.limits.iter().find(|h| h.id == l.id) {
            None => out.push(format!("+ limits[{}]: {}", l.id, show(l))),
            Some(h) if h != l => {
                out.push(format!("~ limits[{}]: {} -> {}", l.id, show(h), show(l)))
            }
            Some(_) => {}
        }
    }
    for h in &have.limits {
        if !want.limits.iter().any(|l| l.id == h.id) {
            out.push(format!("- limits[{}]", h.id));
        }
    }
    if !new {
        for (name, a, b) in [
            ("mode", &have.mode, &want.mode),
            ("consistency", &have.consistency, &want.consistency),
            (
                "on_store_failure",
                &have.on_store_failure,
                &want.on_store_failure,
            ),
            ("hold", &have.hold, &want.hold),
        ] {
            if a != b {
                let s = |v: &Option<String>| v.clone().unwrap_or_default();
                out.push(format!("~ {name}: {} -> {}", s(a), s(b)));
            }
        }
        if have.regions != want.regions {
            let s =
                |v: &Option<BTreeMap<String, f64>>| serde_json::to_string(v).unwrap_or_default();
            out.push(format!(
                "~ regions: {} -> {}",
                s(&have.regions),
                s(&want.regions)
            ));
        }
    }
    out
}

/// Writes the changes through the store, each with an audit entry naming `actor`. Stops at the
/// first store error (what was written before it stays written, and is in the audit log).
pub async fn apply(store: &DynStore, changes: &[Change], actor: &str) -> Result<(), ApplyError> {
    let request_id = format!("apply-{:016x}", rand::random::<u64>());
    for c in changes {
        let key = PolicyKey {
            tenant: TenantId::parse(&c.tenant).map_err(|e| ApplyError(e.message))?,
            client: c
                .client
                .as_deref()
                .map(ClientId::parse)
                .transpose()
                .map_err(|e| ApplyError(e.message))?,
        };
        let failed = |e: crate::store::StoreError| ApplyError(format!("{}: {e}", c.title()));
        let after = match &c.after {
            Some(doc) => {
                let body = serde_json::to_string(doc).map_err(|e| ApplyError(e.to_string()))?;
                Some(
                    store
                        .put_policy(&key, &body, Utc::now())
                        .await
                        .map_err(failed)?,
                )
            }
            None => {
                store.delete_policy(&key).await.map_err(failed)?;
                None
            }
        };
        let entry = crate::http::audit_entry(
            actor,
            "operator",
            &key,
            c.before.as_ref(),
            after.as_ref(),
            request_id.clone(),
        );
        if let Err(e) = store.append_audit(&entry).await {
            // As in the API: the change stands; the entry is logged in full.
            tracing::error!(error = %e, entry = %serde_json::to_string(&entry).unwrap_or_default(),
                "the change was made but the audit log could not take its entry");
        }
    }
    Ok(())
}

/// Everything in the store, as a quotas file.
pub async fn export(store: &DynStore) -> Result<QuotaFile, ApplyError> {
    let mut file = QuotaFile::default();
    for ((tenant, client), r) in current(store).await? {
        let doc = stored_doc(&r)?;
        let entry = file.tenants.entry(tenant).or_default();
        match client {
            Some(c) => {
                entry.clients.insert(c, doc);
            }
            None => {
                entry.limits = Some(doc.limits);
                entry.mode = doc.mode;
                entry.consistency = doc.consistency;
                entry.on_store_failure = doc.on_store_failure;
            }
        }
    }
    Ok(file)
}
