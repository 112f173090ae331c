//! Idempotency keys on the scylla store (`migrations/0005_idempotency.cql`): a claim is
//! `INSERT ... IF NOT EXISTS USING TTL`, the response `UPDATE ... USING TTL ... IF fingerprint = ?`, a release
//! `DELETE ... IF fingerprint = ?`. Paxos makes the claim one step against any other instance's,
//! so two requests with one key never both go ahead while its row lives.

use std::sync::Arc;
use std::time::Duration;

use super::connection::Cql;
use super::errors::{internal, map_exec, Op};
use super::statements::{
    AbandonIdempotencyValues, ClaimIdempotencyValues, FinishIdempotencyValues,
    GetIdempotencyValues, IdempotencyRow,
};
use crate::store::idempotency::{Begun, Remembered};
use crate::store::lease::ttl_secs;
use crate::store::StoreResult;

/// Reads of a claim that did not apply, before answering "claimed by another request": the
/// winner's row can expire between the claim and the read, and then the claim is tried again.
const MAX_CLAIM_ATTEMPTS: usize = 4;

/// The idempotency keys of admin requests.
pub(super) struct Idempotency {
    cql: Arc<Cql>,
}

impl Idempotency {
    pub(super) fn new(cql: Arc<Cql>) -> Self {
        Idempotency { cql }
    }

    pub(super) async fn begin(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> StoreResult<Begun> {
        for _ in 0..MAX_CLAIM_ATTEMPTS {
            let values: ClaimIdempotencyValues<'_> = (scope, key, fingerprint, ttl_secs(ttl));
            if self.cql.lwt(&self.cql.st.claim_idempotency, values).await? {
                return Ok(Begun::Claimed);
            }
            let values: GetIdempotencyValues<'_> = (scope, key);
            let res = self
                .cql
                .session
                .execute_unpaged(&self.cql.st.get_idempotency, values)
                .await
                .map_err(|e| map_exec(e, Op::Read))?;
            let rows = res.into_rows_result().map_err(internal)?;
            if let Some((Some(fp), response)) =
                rows.maybe_first_row::<IdempotencyRow>().map_err(internal)?
            {
                return Ok(Begun::Seen(Remembered {
                    fingerprint: fp,
                    response,
                }));
            }
        }
        Err(crate::store::StoreError::Unavailable(
            "an idempotency key kept changing hands; try again".into(),
        ))
    }

    pub(super) async fn finish(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        response: &str,
        ttl: Duration,
    ) -> StoreResult<()> {
        let values: FinishIdempotencyValues<'_> = (
            ttl_secs(ttl),
            fingerprint,
            response,
            scope,
            key,
            fingerprint,
        );
        self.cql
            .lwt(&self.cql.st.finish_idempotency, values)
            .await?;
        Ok(())
    }

    pub(super) async fn abandon(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
    ) -> StoreResult<()> {
        let values: AbandonIdempotencyValues<'_> = (scope, key, fingerprint);
        self.cql
            .lwt(&self.cql.st.abandon_idempotency, values)
            .await?;
        Ok(())
    }
}
