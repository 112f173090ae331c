//! The store's traits and types (`quotad_core::store`, re-exported here, so that
//! `crate::store::X` names them), the embedded backend (redb, one process) and `faulty` (a store
//! that fails on cue, for the tests of outages). The Cassandra/ScyllaDB backend is
//! `crate::scylla::store`, with the rest of the CQL code.

pub use quotad_core::store::*;

pub mod embedded;
#[cfg(any(test, feature = "test-support"))]
pub mod faulty;
