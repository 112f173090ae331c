//! What talking CQL needs, shared by the store and `quotad migrate`: the connection options,
//! the one way a session is built (TLS included), the keyspace-name rule, and reading a lightweight
//! transaction's `[applied]`.
//!
//! A leaf: it imports neither `store` nor `migrate`, so both can import it without a circle.
//! Statements themselves live beside the code that runs them (`scylla::store::statements`, and
//! the migration files `migrate::files` reads). `tls` builds the rustls configuration of
//! `store.tls_*` and explains a refused connection.

mod keyspace;
mod options;
#[cfg(test)]
pub(crate) mod schema_check;
mod session;
mod tls;

pub use keyspace::validate_keyspace;
pub use options::{parse_consistency, ScyllaOptions};
pub(crate) use session::{lwt_applied, session_builder};
pub use tls::{explain_connect_error, StoreTls, TlsFiles};
