//! The one way quotad opens a session, and reads what a lightweight transaction answered.
//!
//! The store and the migrator share the contact points, connect timeout and credentials of
//! [`ScyllaOptions`]; each adds what only it needs (the store: keyspace, consistency, request
//! timeout and datacenter preference; the migrator: nothing, because the keyspace may not
//! exist yet).

use scylla::client::session_builder::SessionBuilder;
use scylla::response::query_result::QueryRowsResult;
use scylla::value::{CqlValue, Row};

use super::ScyllaOptions;

/// A session builder with the contact points, connect timeout, credentials (password
/// authentication, when both user and password are set) and TLS (when configured).
pub(crate) fn session_builder(opts: &ScyllaOptions) -> SessionBuilder {
    let mut b = SessionBuilder::new()
        .known_nodes(&opts.nodes)
        .connection_timeout(opts.connect_timeout);
    if let (Some(u), Some(p)) = (&opts.username, &opts.password) {
        b = b.user(u, p);
    }
    if let Some(tls) = &opts.tls {
        b = b.tls_context(Some(tls.config.clone()));
    }
    b
}

/// The `[applied]` column of a lightweight transaction's answer (first column, boolean).
pub(crate) fn lwt_applied(rows: &QueryRowsResult) -> Result<bool, String> {
    let row = rows.first_row::<Row>().map_err(|e| e.to_string())?;
    match row.columns.first() {
        Some(Some(CqlValue::Boolean(b))) => Ok(*b),
        _ => Err("a conditional write answered without [applied]".into()),
    }
}
