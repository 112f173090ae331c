//! Everything that speaks CQL to Cassandra/ScyllaDB: `store` (the store backend, counter tables
//! sharded per instance), `cql` (the connection options, the one way a session is built, TLS to
//! the nodes), and `migrate` (`quotad migrate`: the keyspace and the migration files).

pub mod cql;
pub mod migrate;
pub mod store;
