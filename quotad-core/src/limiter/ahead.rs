//! A batch's next checks, brought into the cache before they are decided.
//!
//! A check in memory waits on a chain of cache misses, one after the other: its client's node
//! in the shard's table, the node's states (on the heap for two limits or more), each state's
//! buckets. Each takes a load from memory (or from the other core) before the next can start,
//! and on the batch path, where no HTTP work sits between two checks, those waits were most of
//! `Limiter::locked`'s time (docs/performance.md, "The VM's memory-speed bands").
//!
//! A batch knows its next checks, so their misses can overlap: level by level over several
//! checks, each level asked for (a prefetch, which waits for nothing) for all of them before
//! the next level reads what the previous one brought. Each level reads the table under the
//! shard's lock, taken with `try_lock`: a shard another thread holds is skipped, never waited
//! for, so this never blocks and changes no state; a check skipped is only not helped.

use super::state::Shard;
use super::Limiter;

/// How many checks are brought in at once: enough for their misses to overlap, few enough
/// that what the first brought is still in the cache when the last is decided.
pub const AHEAD: usize = 16;

impl Limiter {
    /// Brings the client entries of up to [`AHEAD`] checks, `(tenant, client)`, into the
    /// cache. Their tenants' entries are left alone: every check of a tenant reads its entry,
    /// which is in the cache already.
    pub fn bring_in<'a>(&self, checks: impl Iterator<Item = (&'a str, &'a str)>) {
        let mut keys = [None; AHEAD];
        for (k, (tenant, client)) in keys.iter_mut().zip(checks) {
            *k = Some(self.key_ref(tenant, client));
        }
        let keys = keys.iter().map_while(|k| k.as_ref());
        let each = |f: &dyn Fn(&Shard, &super::key::EntryRef<'_>)| {
            for r in keys.clone() {
                if let Ok(g) = self.shard_of(*r).try_lock() {
                    f(&g, r);
                }
            }
        };
        each(&|g, r| g.prefetch_node(r));
        each(&|g, r| {
            if let Some(e) = g.get(r) {
                e.prefetch_states()
            }
        });
        each(&|g, r| {
            if let Some(e) = g.get(r) {
                e.prefetch_buckets()
            }
        });
    }
}
