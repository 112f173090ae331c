//! Idempotency keys in redb: `idempotency` maps `scope \0 key` to (fingerprint, response,
//! whether the response is known, expiry in ms since the epoch). One write transaction is one
//! step, as the lightweight transaction is on the scylla store. Expired keys are swept by the
//! next claim (the table holds at most a day of admin requests).

use std::time::Duration;

use chrono::Utc;
use redb::{ReadableTable, TableDefinition};

use super::db::Db;
use super::err;
use crate::store::idempotency::{Begun, Remembered};
use crate::store::StoreResult;

const IDEMPOTENCY: TableDefinition<&str, (&str, &str, bool, i64)> =
    TableDefinition::new("idempotency");

pub(super) fn create_tables(tx: &redb::WriteTransaction) -> StoreResult<()> {
    tx.open_table(IDEMPOTENCY).map_err(err)?;
    Ok(())
}

fn row_key(scope: &str, key: &str) -> String {
    format!("{scope}\0{key}")
}

fn expiry(ttl: Duration) -> i64 {
    Utc::now()
        .timestamp_millis()
        .saturating_add(ttl.as_millis().min(i64::MAX as u128) as i64)
}

/// The idempotency keys of admin requests.
pub(super) struct Idempotency {
    db: Db,
}

impl Idempotency {
    pub(super) fn new(db: Db) -> Self {
        Idempotency { db }
    }

    pub(super) async fn begin(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> StoreResult<Begun> {
        let (k, fp) = (row_key(scope, key), fingerprint.to_owned());
        self.db
            .blocking(move |db| {
                let now = Utc::now().timestamp_millis();
                let tx = db.begin_write().map_err(err)?;
                let out;
                {
                    let mut t = tx.open_table(IDEMPOTENCY).map_err(err)?;
                    let mut expired = Vec::new();
                    for row in t.iter().map_err(err)? {
                        let (rk, v) = row.map_err(err)?;
                        if v.value().3 <= now {
                            expired.push(rk.value().to_owned());
                        }
                    }
                    for rk in expired {
                        t.remove(rk.as_str()).map_err(err)?;
                    }
                    let seen = t.get(k.as_str()).map_err(err)?.map(|v| {
                        let (fingerprint, response, known, _) = v.value();
                        Remembered {
                            fingerprint: fingerprint.to_owned(),
                            response: known.then(|| response.to_owned()),
                        }
                    });
                    out = match seen {
                        Some(r) => Begun::Seen(r),
                        None => {
                            t.insert(k.as_str(), (fp.as_str(), "", false, expiry(ttl)))
                                .map_err(err)?;
                            Begun::Claimed
                        }
                    };
                }
                tx.commit().map_err(err)?;
                Ok(out)
            })
            .await
    }

    pub(super) async fn finish(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        response: &str,
        ttl: Duration,
    ) -> StoreResult<()> {
        let (k, fp, response) = (
            row_key(scope, key),
            fingerprint.to_owned(),
            response.to_owned(),
        );
        self.db
            .blocking(move |db| {
                let tx = db.begin_write().map_err(err)?;
                {
                    let mut t = tx.open_table(IDEMPOTENCY).map_err(err)?;
                    let ours = t
                        .get(k.as_str())
                        .map_err(err)?
                        .is_some_and(|v| v.value().0 == fp);
                    if ours {
                        t.insert(
                            k.as_str(),
                            (fp.as_str(), response.as_str(), true, expiry(ttl)),
                        )
                        .map_err(err)?;
                    }
                }
                tx.commit().map_err(err)
            })
            .await
    }

    pub(super) async fn abandon(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
    ) -> StoreResult<()> {
        let (k, fp) = (row_key(scope, key), fingerprint.to_owned());
        self.db
            .blocking(move |db| {
                let tx = db.begin_write().map_err(err)?;
                {
                    let mut t = tx.open_table(IDEMPOTENCY).map_err(err)?;
                    let ours = t
                        .get(k.as_str())
                        .map_err(err)?
                        .is_some_and(|v| v.value().0 == fp && !v.value().2);
                    if ours {
                        t.remove(k.as_str()).map_err(err)?;
                    }
                }
                tx.commit().map_err(err)
            })
            .await
    }
}
