//! What the limiter knows of the fleet, read on the check path without a lock: how many
//! instances hold a lease now (N in the share formula), the shard this one writes, and whether
//! it holds its lease. The fleet task (`fleet`), which claims and renews the lease, writes it;
//! a process alone (the embedded store, tests) keeps [`Membership::alone`].
//!
//! An instance that cannot renew stops admitting from a share it may no longer hold: once its
//! lease may have ended, `holds_lease` turns false, the limiter decides as the policy's
//! `on_store_failure` says, and `/readyz` answers 503 until a lease is held again.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

/// What the process knows of the fleet, read on the check path.
#[derive(Debug)]
pub struct Membership {
    members: AtomicU32,
    /// The shard held, or -1.
    shard: AtomicI32,
    held: AtomicBool,
}

impl Membership {
    /// A process that is the whole fleet (the embedded store, tests): one member, holding.
    pub fn alone() -> Self {
        Self {
            members: AtomicU32::new(1),
            shard: AtomicI32::new(0),
            held: AtomicBool::new(true),
        }
    }

    /// A fleet member that holds nothing yet.
    pub fn joining() -> Self {
        Self {
            members: AtomicU32::new(1),
            shard: AtomicI32::new(-1),
            held: AtomicBool::new(false),
        }
    }

    /// Instances holding a lease now, this one included; at least 1.
    #[inline]
    pub fn members(&self) -> u32 {
        self.members.load(Ordering::Relaxed)
    }

    /// Whether this instance may admit from its share: it holds a lease that has not ended.
    #[inline]
    pub fn holds_lease(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }

    /// The shard this instance writes, while it holds one.
    pub fn shard(&self) -> Option<i16> {
        let s = self.shard.load(Ordering::Relaxed);
        (s >= 0 && self.holds_lease()).then_some(s as i16)
    }

    /// N, as the fleet's roster says (and simulations and tests that move it by hand).
    pub fn set_members(&self, n: u32) {
        self.members.store(n.max(1), Ordering::Relaxed);
    }

    /// Whether the lease is held: the fleet task clears it when the lease may have ended
    /// (and tests take it away by hand).
    pub fn set_held(&self, held: bool) {
        self.held.store(held, Ordering::Relaxed);
    }

    /// A lease on `shard` was claimed or renewed.
    pub fn hold(&self, shard: i16) {
        self.shard.store(shard as i32, Ordering::Relaxed);
        self.held.store(true, Ordering::Relaxed);
    }

    /// No lease is held, nor any shard.
    pub fn release(&self) {
        self.shard.store(-1, Ordering::Relaxed);
        self.held.store(false, Ordering::Relaxed);
    }
}
