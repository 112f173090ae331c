//! The embedded store: redb, in one file under `store.path`.
//!
//! Why redb: pure Rust (nothing to install, quick to build), ACID with copy-on-write B-trees
//! (crash-safe: a commit is all or nothing, and `Durability::Immediate` fsyncs it), ordered keys
//! for range reads of a counter's buckets, and one writer at a time, which makes strict-mode
//! "increment then read" a single serialisable step. It holds one process; a fleet uses the
//! scylla store.
//!
//! [`EmbeddedStore`] is a facade over parts, each a type that owns its tables ([`facade`]: the
//! seven store traits, each method handed to one part); [`db`] is the database handle they share.
//!
//! Layout:
//! - `counter_rows` / `counter_expiry`: a row per counter holding its live buckets, and the
//!   index the janitor deletes unused rows by ([`rows`]). Ids cannot contain \0, and
//!   integers in keys are big-endian with the sign bit flipped, so byte order is numeric order.
//! - `counter_journal`: sync rounds' increments not yet added to the rows, a record a round,
//!   folded into them every few rounds; reads add them ([`journal`], [`increments`]). The
//!   [`counters`] part owns the journal in memory, and every counter call goes through it.
//! - `tenant_policies` / `client_policies` (tenant \0 client): JSON of the record; `meta`: the
//!   policies generation ([`policies`]).
//! - `members` / `shards_used`: leases on write shards ([`lease`]). One process writes this
//!   store, so it is always a fleet of one; the leases still work, for the contract suite and
//!   so that a second process on the same directory is refused by redb's lock, not by luck.
//! - `usage`, `usage_clients`, `usage_days`: usage history ([`history`]); `audit`: the audit
//!   log ([`audit`]); `idempotency`: idempotency keys ([`idempotency`]).
//! - `holds`, `hold_expiry`, `hold_forget`: reservations, and the indexes they expire and are
//!   forgotten by ([`holds`]).
//! - Stores of earlier releases are brought to this layout when opened ([`legacy`]).

mod audit;
mod counters;
mod db;
mod facade;
mod history;
mod holds;
mod idempotency;
mod increments;
mod journal;
mod lease;
mod legacy;
mod policies;
mod rows;

use crate::store::{StoreError, StoreResult};

pub use facade::EmbeddedStore;

/// The file inside `store.path`.
pub const DB_FILE: &str = "quotad.redb";

fn err<E: Into<redb::Error>>(e: E) -> StoreError {
    match e.into() {
        redb::Error::Io(io) => StoreError::Unavailable(io.to_string()),
        other => StoreError::Internal(other.to_string()),
    }
}

/// Orders signed integers as bytes.
fn enc_i64(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1 << 63)).to_be_bytes()
}

fn dec_i64(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    (u64::from_be_bytes(a) ^ (1 << 63)) as i64
}

/// A JSON row (audit entries; usage rows of earlier releases).
fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> StoreResult<T> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Internal(format!("corrupt row: {e}")))
}

fn encode<T: serde::Serialize>(v: &T) -> StoreResult<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| StoreError::Internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_encoding_sorts_like_the_integers() {
        let vals = [i64::MIN, -5, -1, 0, 1, 7, 1 << 40, i64::MAX];
        for w in vals.windows(2) {
            assert!(enc_i64(w[0]) < enc_i64(w[1]));
            assert_eq!(dec_i64(&enc_i64(w[0])), w[0]);
        }
    }
}
