//! Policies on the embedded store ([`Policies`]): `tenant_policies` (tenant) and
//! `client_policies` (tenant \0 client) map a policy's key to the JSON of its record; `meta`
//! holds the policies generation, bumped in the transaction of every change.

use chrono::{DateTime, Utc};
use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};

use super::db::Db;
use super::err;
use crate::domain::{ClientId, TenantId};
use crate::store::{PolicyKey, PolicyRecord, StoreError, StoreResult};

const TENANT_POLICIES: TableDefinition<&str, &[u8]> = TableDefinition::new("tenant_policies");
const CLIENT_POLICIES: TableDefinition<&str, &[u8]> = TableDefinition::new("client_policies");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const GENERATION: &str = "policies_generation";

pub(super) fn create_tables(tx: &WriteTransaction) -> StoreResult<()> {
    tx.open_table(TENANT_POLICIES).map_err(err)?;
    tx.open_table(CLIENT_POLICIES).map_err(err)?;
    tx.open_table(META).map_err(err)?;
    Ok(())
}

#[derive(Serialize, Deserialize)]
struct StoredRecord {
    body: String,
    version: u64,
    updated_at: DateTime<Utc>,
}

fn client_key(tenant: &str, client: &str) -> String {
    format!("{tenant}\0{client}")
}

fn decode_record(key: PolicyKey, bytes: &[u8]) -> StoreResult<PolicyRecord> {
    let r: StoredRecord = serde_json::from_slice(bytes)
        .map_err(|e| StoreError::Internal(format!("corrupt policy record: {e}")))?;
    Ok(PolicyRecord {
        key,
        body: r.body,
        version: r.version,
        updated_at: r.updated_at,
    })
}

fn split_client_key(k: &str) -> StoreResult<PolicyKey> {
    let (t, c) = k
        .split_once('\0')
        .ok_or_else(|| StoreError::Internal("corrupt client policy key".into()))?;
    let bad = |e: crate::domain::FieldError| StoreError::Internal(e.to_string());
    Ok(PolicyKey {
        tenant: TenantId::parse(t).map_err(bad)?,
        client: Some(ClientId::parse(c).map_err(bad)?),
    })
}

fn bump_generation(tx: &WriteTransaction) -> StoreResult<()> {
    let mut meta = tx.open_table(META).map_err(err)?;
    let g = meta.get(GENERATION).map_err(err)?.map(|v| v.value());
    meta.insert(GENERATION, g.unwrap_or(0) + 1).map_err(err)?;
    Ok(())
}

/// The tenants' policies and the clients' overrides.
pub(super) struct Policies {
    db: Db,
}

impl Policies {
    pub(super) fn new(db: Db) -> Self {
        Policies { db }
    }

    pub(super) async fn put(
        &self,
        key: &PolicyKey,
        body: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<PolicyRecord> {
        let key = key.clone();
        let body = body.to_owned();
        self.db
            .blocking(move |db| {
                let tx = db.begin_write().map_err(err)?;
                let record = {
                    let def = if key.client.is_some() {
                        CLIENT_POLICIES
                    } else {
                        TENANT_POLICIES
                    };
                    let name = match &key.client {
                        Some(c) => client_key(key.tenant.as_str(), c.as_str()),
                        None => key.tenant.to_string(),
                    };
                    let mut table = tx.open_table(def).map_err(err)?;
                    let prev = table
                        .get(name.as_str())
                        .map_err(err)?
                        .map(|v| decode_record(key.clone(), v.value()))
                        .transpose()?;
                    let stored = StoredRecord {
                        body,
                        version: prev.map(|p| p.version + 1).unwrap_or(1),
                        updated_at: now,
                    };
                    let bytes = serde_json::to_vec(&stored)
                        .map_err(|e| StoreError::Internal(e.to_string()))?;
                    table.insert(name.as_str(), bytes.as_slice()).map_err(err)?;
                    PolicyRecord {
                        key,
                        body: stored.body,
                        version: stored.version,
                        updated_at: stored.updated_at,
                    }
                };
                bump_generation(&tx)?;
                tx.commit().map_err(err)?;
                Ok(record)
            })
            .await
    }

    pub(super) async fn get(&self, key: &PolicyKey) -> StoreResult<Option<PolicyRecord>> {
        let key = key.clone();
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(err)?;
                let (def, name) = match &key.client {
                    Some(c) => (CLIENT_POLICIES, client_key(key.tenant.as_str(), c.as_str())),
                    None => (TENANT_POLICIES, key.tenant.to_string()),
                };
                let table = tx.open_table(def).map_err(err)?;
                let got = table.get(name.as_str()).map_err(err)?;
                got.map(|v| decode_record(key.clone(), v.value()))
                    .transpose()
            })
            .await
    }

    pub(super) async fn delete(&self, key: &PolicyKey) -> StoreResult<bool> {
        let key = key.clone();
        self.db
            .blocking(move |db| {
                let tx = db.begin_write().map_err(err)?;
                let existed = {
                    let (def, name) = match &key.client {
                        Some(c) => (CLIENT_POLICIES, client_key(key.tenant.as_str(), c.as_str())),
                        None => (TENANT_POLICIES, key.tenant.to_string()),
                    };
                    let mut table = tx.open_table(def).map_err(err)?;
                    let removed = table.remove(name.as_str()).map_err(err)?.is_some();
                    removed
                };
                if existed {
                    bump_generation(&tx)?;
                }
                tx.commit().map_err(err)?;
                Ok(existed)
            })
            .await
    }

    pub(super) async fn list(
        &self,
        after: Option<&TenantId>,
        limit: usize,
    ) -> StoreResult<Vec<PolicyRecord>> {
        let after = after.map(|a| a.to_string());
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(err)?;
                let table = tx.open_table(TENANT_POLICIES).map_err(err)?;
                let iter = match &after {
                    Some(a) => table.range::<&str>((
                        std::ops::Bound::Excluded(a.as_str()),
                        std::ops::Bound::Unbounded,
                    )),
                    None => table.range::<&str>(..),
                }
                .map_err(err)?;
                let mut out = Vec::new();
                for item in iter.take(limit) {
                    let (k, v) = item.map_err(err)?;
                    let tenant = TenantId::parse(k.value())
                        .map_err(|e| StoreError::Internal(e.to_string()))?;
                    out.push(decode_record(
                        PolicyKey {
                            tenant,
                            client: None,
                        },
                        v.value(),
                    )?);
                }
                Ok(out)
            })
            .await
    }

    pub(super) async fn list_overrides(
        &self,
        tenant: &TenantId,
        after: Option<&ClientId>,
        limit: usize,
    ) -> StoreResult<Vec<PolicyRecord>> {
        // Keys are `tenant \0 client`: the tenant's overrides lie between `tenant \0` and
        // `tenant \x01`.
        let from = client_key(tenant.as_str(), after.map_or("", |c| c.as_str()));
        let to = format!("{tenant}\u{1}");
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(err)?;
                let table = tx.open_table(CLIENT_POLICIES).map_err(err)?;
                let iter = table
                    .range::<&str>((
                        std::ops::Bound::Excluded(from.as_str()),
                        std::ops::Bound::Excluded(to.as_str()),
                    ))
                    .map_err(err)?;
                let mut out = Vec::new();
                for item in iter.take(limit) {
                    let (k, v) = item.map_err(err)?;
                    out.push(decode_record(split_client_key(k.value())?, v.value())?);
                }
                Ok(out)
            })
            .await
    }

    pub(super) async fn load(&self) -> StoreResult<Vec<PolicyRecord>> {
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(err)?;
                let mut out = Vec::new();
                let tenants = tx.open_table(TENANT_POLICIES).map_err(err)?;
                for item in tenants.iter().map_err(err)? {
                    let (k, v) = item.map_err(err)?;
                    let tenant = TenantId::parse(k.value())
                        .map_err(|e| StoreError::Internal(e.to_string()))?;
                    out.push(decode_record(
                        PolicyKey {
                            tenant,
                            client: None,
                        },
                        v.value(),
                    )?);
                }
                let clients = tx.open_table(CLIENT_POLICIES).map_err(err)?;
                for item in clients.iter().map_err(err)? {
                    let (k, v) = item.map_err(err)?;
                    out.push(decode_record(split_client_key(k.value())?, v.value())?);
                }
                Ok(out)
            })
            .await
    }

    pub(super) async fn generation(&self) -> StoreResult<u64> {
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(err)?;
                let meta = tx.open_table(META).map_err(err)?;
                let g = meta.get(GENERATION).map_err(err)?.map(|v| v.value());
                Ok(g.unwrap_or(0))
            })
            .await
    }
}
