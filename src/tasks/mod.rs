//! The background tasks of `quotad serve`: `sync` (admitted hits and usage history to the
//! store, counts back, every `sync.interval_ms`), `retention` (old usage history and audit
//! entries out), `fleet` (this instance's shard lease, the fleet's size, regions) and `holds`
//! (reservations nobody ended, expired), `clock` (the fleet's time, from the store's clock);
//! `history_writer` writes the usage history for `sync`, beside its rounds; `doubts` settles
//! `sync`'s writes of unknown outcome.

pub mod clock;
pub mod doubts;
mod episodes;
pub mod fleet;
pub mod history_writer;
pub mod holds;
pub mod retention;
mod settle;
pub mod sync;
