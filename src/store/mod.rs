//! The store's backends, over the traits and types of `quotad_core::store` (re-exported here,
//! so that `crate::store::X` names either): `embedded` (redb, one process), `scylla`
//! (Cassandra/ScyllaDB counter tables, many instances), and `faulty` (a store that fails on
//! cue, for the tests of outages).

pub use quotad_core::store::*;

pub mod embedded;
#[cfg(any(test, feature = "test-support"))]
pub mod faulty;
pub mod scylla;
