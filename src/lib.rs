//! quotad: a multi-tenant quota and rate-limit service.
//!
//! The binary (`src/main.rs`) only parses the command line; everything lives here so tests and
//! benchmarks drive the same code.

pub mod domain;
pub mod limiter;
pub mod migrate;
pub mod store;
