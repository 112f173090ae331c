//! The holds this instance took and has not seen end, bounded per tenant and in all
//! (`limiter.max_open_holds_per_tenant`, `limiter.max_open_holds`).
//!
//! A place is claimed before the reserving check is decided, so a flood of reservations is
//! refused before it charges anything or writes to the store; the claim becomes the hold's
//! entry once the hold is written, and is given back if the check is denied or the hold not
//! kept. An entry leaves when this instance ends the hold or when the hold's time is over,
//! whichever comes first: a hold settled on another instance of a fleet keeps its place here
//! until it would have expired. Each instance bounds the holds it took, so a fleet of N holds
//! at most N times the bound.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// Which bound a claim met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The tenant's own bound.
    Tenant(usize),
    /// The bound on every tenant's holds together.
    Process(usize),
}

/// A place claimed for one hold; given back when dropped unless [`Place::bind`] made it the
/// hold's entry.
pub struct Place<'a> {
    open: &'a OpenHolds,
    tenant: &'a str,
    bound: bool,
}

impl Place<'_> {
    /// The hold `id`, open until `expires_ms`, was written: it keeps this place.
    pub fn bind(mut self, id: &str, expires_ms: i64) {
        self.bound = true;
        self.open.bind(self.tenant, id, expires_ms);
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if !self.bound {
            self.open.unclaim(self.tenant);
        }
    }
}

/// The open holds of each tenant taken here, by end of life, and the claims in between.
pub struct OpenHolds {
    per_tenant: usize,
    total_max: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    tenants: HashMap<String, Tenant>,
    total: usize,
}

#[derive(Default)]
struct Tenant {
    /// (expires at, id) of each hold written.
    holds: BTreeSet<(i64, u128)>,
    /// Places claimed by checks still being decided or written.
    claimed: usize,
}

impl Tenant {
    fn len(&self) -> usize {
        self.holds.len() + self.claimed
    }

    /// Drops the holds whose time is over at `now`; how many.
    fn prune(&mut self, now: i64) -> usize {
        let before = self.holds.len();
        while let Some(&(expires, _)) = self.holds.first() {
            if expires > now {
                break;
            }
            self.holds.pop_first();
        }
        before - self.holds.len()
    }
}

/// A hold id as a number (ids are 32 hex digits); an id of another shape is never tracked.
fn key(id: &str) -> Option<u128> {
    u128::from_str_radix(id, 16).ok()
}

impl OpenHolds {
    pub fn new(per_tenant: usize, total_max: usize) -> Self {
        OpenHolds {
            per_tenant,
            total_max,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims a place for one more hold of `tenant` at `now`, or says which bound is full.
    pub fn claim<'a>(&'a self, tenant: &'a str, now: i64) -> Result<Place<'a>, Full> {
        self.count_in(tenant, now)?;
        Ok(Place {
            open: self,
            tenant,
            bound: false,
        })
    }

    fn count_in(&self, tenant: &str, now: i64) -> Result<(), Full> {
        let mut g = self.lock();
        let inner = &mut *g;
        if let Some(t) = inner.tenants.get_mut(tenant) {
            inner.total -= t.prune(now);
        }
        if inner.total >= self.total_max {
            inner.prune_all(now);
            if inner.total >= self.total_max {
                return Err(Full::Process(self.total_max));
            }
        }
        let t = inner.tenants.entry(tenant.to_owned()).or_default();
        if t.len() >= self.per_tenant {
            return Err(Full::Tenant(self.per_tenant));
        }
        t.claimed += 1;
        inner.total += 1;
        Ok(())
    }

    /// Gives back a place claimed for a hold that was not taken.
    fn unclaim(&self, tenant: &str) {
        let mut g = self.lock();
        let inner = &mut *g;
        if let Some(t) = inner.tenants.get_mut(tenant) {
            if t.claimed > 0 {
                t.claimed -= 1;
                inner.total -= 1;
            }
            if t.len() == 0 {
                inner.tenants.remove(tenant);
            }
        }
    }

    /// Turns a claimed place into the entry of the hold written, open until `expires_ms`.
    fn bind(&self, tenant: &str, id: &str, expires_ms: i64) {
        let mut g = self.lock();
        let inner = &mut *g;
        let Some(t) = inner.tenants.get_mut(tenant) else {
            return;
        };
        if t.claimed == 0 {
            return;
        }
        t.claimed -= 1;
        match key(id) {
            Some(k) if t.holds.insert((expires_ms, k)) => {}
            _ => inner.total -= 1,
        }
    }

    /// The hold `id` of `tenant`, open until `expires_ms`, ended: its place is free.
    pub fn ended(&self, tenant: &str, id: &str, expires_ms: i64) {
        let Some(k) = key(id) else { return };
        let mut g = self.lock();
        let inner = &mut *g;
        let Some(t) = inner.tenants.get_mut(tenant) else {
            return;
        };
        if t.holds.remove(&(expires_ms, k)) {
            inner.total -= 1;
        }
        if t.len() == 0 {
            inner.tenants.remove(tenant);
        }
    }

    /// How many places `tenant` holds at `now` (holds open and claims).
    #[cfg(test)]
    pub fn of(&self, tenant: &str, now: i64) -> usize {
        let mut g = self.lock();
        let inner = &mut *g;
        match inner.tenants.get_mut(tenant) {
            Some(t) => {
                inner.total -= t.prune(now);
                t.len()
            }
            None => 0,
        }
    }
}

impl Inner {
    /// Drops every tenant's holds whose time is over, and tenants left with none.
    fn prune_all(&mut self, now: i64) {
        let mut freed = 0;
        self.tenants.retain(|_, t| {
            freed += t.prune(now);
            t.len() > 0
        });
        self.total -= freed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "00000000000000000000000000000001";
    const B: &str = "00000000000000000000000000000002";

    #[test]
    fn a_tenant_past_its_bound_is_refused_and_others_are_not() {
        let open = OpenHolds::new(2, 10);
        for id in [A, B] {
            open.claim("t", 0).unwrap().bind(id, 1_000);
        }
        assert_eq!(open.claim("t", 0).err(), Some(Full::Tenant(2)));
        assert!(open.claim("u", 0).is_ok());
        open.ended("t", A, 1_000);
        assert!(open.claim("t", 0).is_ok());
    }

    #[test]
    fn holds_leave_at_their_expiry_and_claims_given_back_count_nothing() {
        let open = OpenHolds::new(1, 10);
        open.claim("t", 0).unwrap().bind(A, 1_000);
        assert_eq!(open.claim("t", 999).err(), Some(Full::Tenant(1)));
        let place = open.claim("t", 1_000).unwrap();
        assert_eq!(open.of("t", 1_000), 1);
        drop(place);
        assert_eq!(open.of("t", 1_000), 0);
    }

    #[test]
    fn the_process_bound_counts_every_tenant_and_frees_expired_ones() {
        let open = OpenHolds::new(10, 2);
        open.claim("t", 0).unwrap().bind(A, 500);
        let _u = open.claim("u", 0).unwrap();
        assert_eq!(open.claim("v", 0).err(), Some(Full::Process(2)));
        let _v = open.claim("v", 500).unwrap();
        assert_eq!(open.claim("w", 500).err(), Some(Full::Process(2)));
    }
}
