//! The migrator's own bookkeeping: the `schema_migrations` table, which records each applied
//! file (version, name, sha256 of its bytes, applied_at), and the existence probes of
//! `system_schema`.

use scylla::client::session::Session;
use scylla::value::CqlTimestamp;

use super::plan::AppliedMigration;
use super::{cql_err, MigrateError, Migration};
use crate::scylla::cql::lwt_applied;

/// The bookkeeping table, created by the migrator itself (it must exist before any file runs).
pub const SCHEMA_MIGRATIONS_CQL: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (\
     version int PRIMARY KEY, name text, checksum text, applied_at timestamp)";
const SELECT_APPLIED_CQL: &str = "SELECT version, name, checksum FROM schema_migrations";
/// A lightweight transaction, so two migrators that raced both learn which record won.
const RECORD_CQL: &str = "INSERT INTO schema_migrations (version, name, checksum, applied_at) \
     VALUES (?, ?, ?, ?) IF NOT EXISTS";
pub(super) const KEYSPACE_EXISTS_CQL: &str =
    "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?";
pub(super) const TABLE_EXISTS_CQL: &str =
    "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ? AND table_name = ?";

pub(super) async fn exists(
    session: &Session,
    cql: &str,
    values: &[&str],
) -> Result<bool, MigrateError> {
    let rows = session
        .query_unpaged(cql, values)
        .await
        .map_err(cql_err)?
        .into_rows_result()
        .map_err(cql_err)?;
    Ok(rows.rows_num() > 0)
}

pub(super) async fn read_applied(session: &Session) -> Result<Vec<AppliedMigration>, MigrateError> {
    let rows = session
        .query_unpaged(SELECT_APPLIED_CQL, ())
        .await
        .map_err(cql_err)?
        .into_rows_result()
        .map_err(cql_err)?;
    let mut out = Vec::new();
    for row in rows.rows::<(i32, String, String)>().map_err(cql_err)? {
        let (version, name, checksum) = row.map_err(cql_err)?;
        let version = u32::try_from(version)
            .map_err(|_| MigrateError::Cql(format!("schema_migrations holds version {version}")))?;
        out.push(AppliedMigration {
            version,
            name,
            checksum,
        });
    }
    out.sort_by_key(|a| a.version);
    Ok(out)
}

/// Records an applied file. If another migrator recorded the same version meanwhile, that is
/// fine when it was the same file.
pub(super) async fn record(session: &Session, m: &Migration) -> Result<(), MigrateError> {
    let now = CqlTimestamp(chrono::Utc::now().timestamp_millis());
    let version = i32::try_from(m.version)
        .map_err(|_| MigrateError::Config(format!("version {} too large", m.version)))?;
    let res = session
        .query_unpaged(
            RECORD_CQL,
            (version, m.name.as_str(), m.checksum.as_str(), now),
        )
        .await
        .map_err(cql_err)?
        .into_rows_result()
        .map_err(cql_err)?;
    if !lwt_applied(&res).map_err(MigrateError::Cql)? {
        // Another migrator recorded this version meanwhile: fine if it was the same file.
        let recorded = read_applied(session).await?;
        if let Some(r) = recorded.iter().find(|a| a.version == m.version) {
            if r.checksum != m.checksum {
                return Err(MigrateError::ChecksumMismatch {
                    file: m.file.to_owned(),
                    recorded: r.checksum.clone(),
                    current: m.checksum.clone(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scylla::cql::schema_check::{check, names, parse_tables};
    use crate::scylla::migrate::split_statements;

    #[test]
    fn bookkeeping_statements_match_their_table() {
        let tables = parse_tables(&split_statements(SCHEMA_MIGRATIONS_CQL));
        check(
            &tables,
            RECORD_CQL,
            &names::<(i32, &str, &str, CqlTimestamp)>(),
            None,
        )
        .unwrap();
        check(
            &tables,
            SELECT_APPLIED_CQL.trim_end(),
            &[],
            Some(&names::<(i32, String, String)>()),
        )
        .unwrap();
    }
}
