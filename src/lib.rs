//! quotad: a multi-tenant quota and rate-limit service.
//!
//! The binary (`src/main.rs`) only sets up the process and calls `cli`; everything lives here
//! so tests and benchmarks drive the same code. The decision and the count are the core's
//! (`quotad_core`, re-exported under the same names); this crate holds what reaches them, a
//! folder a job:
//!
//! - entry points: `http` (the HTTP API and the console), `grpc` (Envoy's rate limit service),
//!   `cli` (the command line), each reading its protocol and calling `checks`, the one check
//!   service, with the tokens of `auth`; `holds` takes and ends the holds of reserving checks;
//! - `store` (the embedded backend, the store traits re-exported) and `scylla` (the
//!   Cassandra/ScyllaDB backend, the CQL helpers and `quotad migrate`);
//! - `tasks` (sync, retention, fleet membership, hold expiry), started by `startup`, which also builds the
//!   servers (`tls` for their certificates, `traces` for OpenTelemetry);
//! - `config` (the settings), `os` (scheduler and memory tuning).
//!
//! A check travels: `http` or `grpc` -> `checks` -> `policy` (cached policies) -> `limiter`
//! (in-memory decision) -> answer; `tasks::sync` writes admitted hits to the `store` in the
//! background.

pub use quotad_core::{clock, domain, history, keyhash, limiter, metrics, pace, policy};

pub mod auth;
pub mod checks;
pub mod cli;
pub mod config;
pub mod grpc;
pub mod holds;
pub mod http;
pub mod os;
pub mod scylla;
pub mod startup;
pub mod store;
pub mod tasks;
pub mod tls;
pub mod traces;
