//! quotad: a multi-tenant quota and rate-limit service.
//!
//! The binary (`src/main.rs`) only sets up the process and calls `cli`; everything lives here
//! so tests and benchmarks drive the same code. A check travels: `api` or `grpc` (read at the edge, the
//! token checked by `auth`) -> `checks` (the one check service) -> `policy` (cached policies)
//! -> `limiter` (in-memory decision) -> answer; `sync` writes admitted hits to the `store` in
//! the background. `tls` serves quotad's own ports over TLS; `cql` holds what the scylla store
//! and `migrate` share, TLS to the nodes included.

pub use quotad_core::{clock, domain, history, keyhash, limiter, metrics, pace, policy};

pub mod api;
pub mod auth;
pub mod checks;
pub mod cli;
pub mod config;
pub mod cql;
pub mod fleet;
pub mod grpc;
pub mod migrate;
pub mod retention;
#[cfg(test)]
mod scenarios;
pub mod sched;
pub mod startup;
pub mod store;
pub mod sync;
pub mod tls;
pub mod traces;
