//! The audit log on the embedded store.
//!
//! Table `audit`: scope \0 at(8) id -> JSON [`AuditEntry`], where scope is the entry's tenant,
//! or `*` for the log of all tenants: each entry is written under both.

use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use super::db::Db;
use super::{decode, enc_i64, encode, err};
use crate::store::audit::{AuditEntry, AuditQuery};
use crate::store::StoreResult;

const AUDIT: TableDefinition<&[u8], &[u8]> = TableDefinition::new("audit");
/// The scope of the log of every tenant.
const ALL: &str = "*";

pub(super) fn create_tables(tx: &WriteTransaction) -> StoreResult<()> {
    tx.open_table(AUDIT).map_err(err)?;
    Ok(())
}

/// scope \0 at(8) id.
fn audit_key(scope: &str, at_ms: i64, id: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(scope.len() + id.len() + 9);
    v.extend_from_slice(scope.as_bytes());
    v.push(0);
    v.extend_from_slice(&enc_i64(at_ms));
    v.extend_from_slice(id.as_bytes());
    v
}

/// The audit log, under each entry's tenant and under `*`.
pub(super) struct Audit {
    db: Db,
}

impl Audit {
    pub(super) fn new(db: Db) -> Self {
        Audit { db }
    }

    pub(super) async fn append(&self, entry: &AuditEntry) -> StoreResult<()> {
        let entry = entry.clone();
        self.db
            .blocking(move |db| {
                let bytes = encode(&entry)?;
                let at = entry.at.timestamp_millis();
                let tx = db.begin_write().map_err(err)?;
                {
                    let mut audit = tx.open_table(AUDIT).map_err(err)?;
                    for scope in [entry.tenant.as_str(), ALL] {
                        audit
                            .insert(audit_key(scope, at, &entry.id).as_slice(), bytes.as_slice())
                            .map_err(err)?;
                    }
                }
                tx.commit().map_err(err)
            })
            .await
    }

    pub(super) async fn page(&self, q: &AuditQuery) -> StoreResult<Vec<AuditEntry>> {
        let q = q.clone();
        self.db
            .blocking(move |db| {
                let scope = q.tenant.as_deref().unwrap_or(ALL);
                let lo = audit_key(scope, q.from, "");
                let mut hi = audit_key(scope, q.to, "");
                if let Some(c) = &q.before {
                    hi = hi.min(audit_key(scope, c.at_ms, &c.id));
                }
                let tx = db.begin_read().map_err(err)?;
                let audit = tx.open_table(AUDIT).map_err(err)?;
                let mut out = Vec::new();
                if lo >= hi {
                    return Ok(out);
                }
                for item in audit
                    .range(lo.as_slice()..hi.as_slice())
                    .map_err(err)?
                    .rev()
                    .take(q.limit)
                {
                    let (_, v) = item.map_err(err)?;
                    out.push(decode(v.value())?);
                }
                Ok(out)
            })
            .await
    }

    pub(super) async fn delete_before(&self, before: i64, budget: usize) -> StoreResult<u64> {
        self.db
            .blocking(move |db| {
                let tx = db.begin_write().map_err(err)?;
                let mut removed = 0;
                {
                    let mut audit = tx.open_table(AUDIT).map_err(err)?;
                    let lo = audit_key(ALL, i64::MIN, "");
                    let hi = audit_key(ALL, before, "");
                    let old: Vec<AuditEntry> = audit
                        .range(lo.as_slice()..hi.as_slice())
                        .map_err(err)?
                        .take(budget)
                        .map(|item| item.map_err(err).and_then(|(_, v)| decode(v.value())))
                        .collect::<StoreResult<_>>()?;
                    for e in old {
                        let at = e.at.timestamp_millis();
                        for scope in [e.tenant.as_str(), ALL] {
                            audit
                                .remove(audit_key(scope, at, &e.id).as_slice())
                                .map_err(err)?;
                        }
                        removed += 1;
                    }
                }
                tx.commit().map_err(err)?;
                Ok(removed)
            })
            .await
    }
}
