//! The background tasks of `quotad serve`: `sync` (admitted hits and usage history to the
//! store, counts back, every `sync.interval_ms`), `retention` (old usage history and audit
//! entries out), and `fleet` (this instance's shard lease, the fleet's size, regions).

pub mod fleet;
pub mod retention;
pub mod sync;
