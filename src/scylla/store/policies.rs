//! Policies on the scylla store: a regular table written with lightweight transactions.
//!
//! Create is `IF NOT EXISTS`, replace is `IF version = ?`, so two admins on two instances
//! cannot both write version 2: the loser re-reads (at LOCAL_SERIAL) and tries again, up to
//! [`MAX_CAS_ATTEMPTS`] times. Every change then bumps a counter row, the generation other
//! instances poll ([`Policies::generation`]).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::stream::{self, StreamExt, TryStreamExt};
use scylla::value::{Counter, CqlTimestamp};

use super::connection::Cql;
use super::errors::{internal, map_exec, map_next_row, map_pager, Op};
use super::partition::{policy_part, POLICY_PARTS};
use super::statements::{
    BumpGenerationValues, GenerationRow, InsertPolicyValues, ListOverridesValues,
    ListPoliciesValues, LoadPoliciesValues, PolicyKeyValues, PolicyRow, ReadGenerationValues,
    UpdatePolicyValues,
};
use crate::domain::{ClientId, TenantId};
use crate::store::{PolicyKey, PolicyRecord, StoreError, StoreResult};

/// Tries of a compare-and-set policy write before giving up under contention.
const MAX_CAS_ATTEMPTS: usize = 8;
/// The one row of `policy_generation`.
const GENERATION_ID: &str = "policies";
/// `kind` column of `policies`.
const KIND_TENANT: i8 = 0;
const KIND_OVERRIDE: i8 = 1;

fn policy_kind(key: &PolicyKey) -> (i8, &str) {
    match &key.client {
        None => (KIND_TENANT, ""),
        Some(c) => (KIND_OVERRIDE, c.as_str()),
    }
}

fn record_from_row(
    (tenant, client, body, version, updated_at): PolicyRow,
) -> StoreResult<PolicyRecord> {
    let tenant = TenantId::parse(&tenant).map_err(internal)?;
    let client = if client.is_empty() {
        None
    } else {
        Some(ClientId::parse(&client).map_err(internal)?)
    };
    Ok(PolicyRecord {
        key: PolicyKey { tenant, client },
        body,
        version: u64::try_from(version).map_err(internal)?,
        updated_at: DateTime::<Utc>::from_timestamp_millis(updated_at.0)
            .ok_or_else(|| internal("updated_at out of range"))?,
    })
}

/// The policies and their generation.
pub(super) struct Policies {
    cql: Arc<Cql>,
}

impl Policies {
    pub(super) fn new(cql: Arc<Cql>) -> Self {
        Policies { cql }
    }

    async fn read_policy(
        &self,
        key: &PolicyKey,
        serial: bool,
    ) -> StoreResult<Option<PolicyRecord>> {
        let (kind, client) = policy_kind(key);
        let values: PolicyKeyValues<'_> = (
            policy_part(key.tenant.as_str()),
            kind,
            key.tenant.as_str(),
            client,
        );
        let st = if serial {
            &self.cql.st.get_policy_serial
        } else {
            &self.cql.st.get_policy
        };
        let res = self
            .cql
            .session
            .execute_unpaged(st, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        match rows.maybe_first_row::<PolicyRow>().map_err(internal)? {
            None => Ok(None),
            Some(row) => record_from_row(row).map(Some),
        }
    }

    /// Bumps the policy generation. Retried: an extra bump costs every instance one reload,
    /// a missing one would hide a change, so here (and only here) a counter write is resent.
    async fn bump_generation(&self) -> StoreResult<()> {
        let mut last = None;
        for _ in 0..3 {
            let values: BumpGenerationValues<'_> = (Counter(1), GENERATION_ID);
            match self
                .cql
                .session
                .execute_unpaged(&self.cql.st.bump_generation, values)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(map_exec(e, Op::Write)),
            }
        }
        Err(StoreError::Uncertain(format!(
            "the policy was written but the change counter could not be bumped: {}",
            last.map(|e| e.to_string()).unwrap_or_default()
        )))
    }

    pub(super) async fn put(
        &self,
        key: &PolicyKey,
        body: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<PolicyRecord> {
        let (kind, client) = policy_kind(key);
        let part = policy_part(key.tenant.as_str());
        let tenant = key.tenant.as_str();
        let at = CqlTimestamp(now.timestamp_millis());
        for _ in 0..MAX_CAS_ATTEMPTS {
            let current = self.read_policy(key, true).await?;
            let (done, version) = match current {
                None => {
                    let v: InsertPolicyValues<'_> = (part, kind, tenant, client, body, 1, at);
                    (self.cql.lwt(&self.cql.st.insert_policy, v).await?, 1u64)
                }
                Some(cur) => {
                    let old = i64::try_from(cur.version).map_err(internal)?;
                    let v: UpdatePolicyValues<'_> =
                        (body, old + 1, at, part, kind, tenant, client, old);
                    (
                        self.cql.lwt(&self.cql.st.update_policy, v).await?,
                        cur.version + 1,
                    )
                }
            };
            if done {
                self.bump_generation().await?;
                return Ok(PolicyRecord {
                    key: key.clone(),
                    body: body.to_owned(),
                    version,
                    updated_at: DateTime::<Utc>::from_timestamp_millis(at.0).unwrap_or(now),
                });
            }
        }
        Err(StoreError::Unavailable(format!(
            "policy {} changed concurrently {MAX_CAS_ATTEMPTS} times; try again",
            key.tenant
        )))
    }

    pub(super) async fn get(&self, key: &PolicyKey) -> StoreResult<Option<PolicyRecord>> {
        self.read_policy(key, false).await
    }

    pub(super) async fn delete(&self, key: &PolicyKey) -> StoreResult<bool> {
        let (kind, client) = policy_kind(key);
        let values: PolicyKeyValues<'_> = (
            policy_part(key.tenant.as_str()),
            kind,
            key.tenant.as_str(),
            client,
        );
        let existed = self.cql.lwt(&self.cql.st.delete_policy, values).await?;
        if existed {
            self.bump_generation().await?;
        }
        Ok(existed)
    }

    pub(super) async fn list(
        &self,
        after: Option<&TenantId>,
        limit: usize,
    ) -> StoreResult<Vec<PolicyRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Tenant ids are never empty, so every tenant sorts after "".
        let after = after.map_or("", |t| t.as_str());
        let lim = i32::try_from(limit).unwrap_or(i32::MAX);
        let parts: Vec<Vec<PolicyRow>> = stream::iter((0..POLICY_PARTS).map(|part| async move {
            let values: ListPoliciesValues<'_> = (part, KIND_TENANT, after, lim);
            let res = self
                .cql
                .session
                .execute_unpaged(&self.cql.st.list_policies, values)
                .await
                .map_err(|e| map_exec(e, Op::Read))?;
            let rows = res.into_rows_result().map_err(internal)?;
            let out = rows
                .rows::<PolicyRow>()
                .map_err(internal)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(internal)?;
            Ok::<_, StoreError>(out)
        }))
        .buffer_unordered(self.cql.max_concurrency)
        .try_collect()
        .await?;
        // Each partition is sorted by tenant; merging the few heads is a sort of <= 16*limit.
        let mut all: Vec<PolicyRow> = parts.into_iter().flatten().collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.truncate(limit);
        all.into_iter().map(record_from_row).collect()
    }

    pub(super) async fn list_overrides(
        &self,
        tenant: &TenantId,
        after: Option<&ClientId>,
        limit: usize,
    ) -> StoreResult<Vec<PolicyRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Client ids are never empty, so every override sorts after "".
        let values: ListOverridesValues<'_> = (
            policy_part(tenant.as_str()),
            KIND_OVERRIDE,
            tenant.as_str(),
            after.map_or("", |c| c.as_str()),
            i32::try_from(limit).unwrap_or(i32::MAX),
        );
        let res = self
            .cql
            .session
            .execute_unpaged(&self.cql.st.list_overrides, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let mut out = Vec::new();
        for row in rows.rows::<PolicyRow>().map_err(internal)? {
            out.push(record_from_row(row.map_err(internal)?)?);
        }
        Ok(out)
    }

    pub(super) async fn load(&self) -> StoreResult<Vec<PolicyRecord>> {
        let parts: Vec<Vec<PolicyRow>> = stream::iter((0..POLICY_PARTS).map(|part| async move {
            let values: LoadPoliciesValues = (part,);
            let pager = self
                .cql
                .session
                .execute_iter(self.cql.st.load_policies.clone(), values)
                .await
                .map_err(map_pager)?;
            pager
                .rows_stream::<PolicyRow>()
                .map_err(internal)?
                .map_err(map_next_row)
                .try_collect::<Vec<_>>()
                .await
        }))
        .buffer_unordered(self.cql.max_concurrency)
        .try_collect()
        .await?;
        let mut out: Vec<PolicyRecord> = parts
            .into_iter()
            .flatten()
            .map(record_from_row)
            .collect::<StoreResult<_>>()?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    pub(super) async fn generation(&self) -> StoreResult<u64> {
        let values: ReadGenerationValues<'_> = (GENERATION_ID,);
        let res = self
            .cql
            .session
            .execute_unpaged(&self.cql.st.read_generation, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let n = rows
            .maybe_first_row::<GenerationRow>()
            .map_err(internal)?
            .and_then(|(c,)| c)
            .map_or(0, |Counter(n)| n);
        Ok(u64::try_from(n).unwrap_or(0))
    }
}
