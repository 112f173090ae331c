//! quotad's core: what decides a check and keeps its count, with no HTTP, gRPC, OpenAPI or
//! store backend in its dependencies, so that the compiler keeps the centre small.
//!
//! - `domain`: ids, limits, policies and their documents, resources, costs;
//! - `limiter`: the in-memory pre-check and the decision, over the store traits;
//! - `history`: the usage-history recorder the limiter tallies into;
//! - `policy`: the policy cache and its refresher;
//! - `store`: the traits a backend implements, and their types (the backends are the server's);
//! - `metrics`: the Prometheus registry every part reports to;
//! - `clock`, `keyhash` (one hash for every key map), `pace` (background work in short slices).
//!
//! The server crate (`quotad`) holds the entry points (HTTP, gRPC, the command line), the store
//! backends and the background tasks, and re-exports these modules under the same names.

pub mod clock;
pub mod domain;
pub mod history;
pub mod keyhash;
pub mod limiter;
pub mod metrics;
pub mod pace;
pub mod policy;
pub mod store;
