//! Keys: how a counter is named in memory and in the store.
//!
//! In memory an entry (`state::Entry`) is keyed by (tenant, subject), the subject being a
//! client or `*` for the tenant's shared limits. The hash of those two strings is computed once
//! per check and carried in the key, so one hash picks both the shard and the map slot, and a
//! lookup borrows the request's strings ([`EntryRef`]) instead of allocating an owned key
//! ([`EntryKey`], made only when an entry is inserted).
//!
//! In the store a counter is (tenant, subject, limit, grain), and a read covers the buckets its
//! window needs plus a little ahead, for instances whose clocks run fast.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, Equivalent};

use super::window;
use crate::domain::{ClientId, Limit, LimitKind, Scope, TenantId, TENANT_SUBJECT};
use crate::store::{CounterKey, CounterRange};

/// The owned key of an entry, with the hash of its strings computed once: a check hashes each
/// key once, for the shard and for the map.
/// `repr(C)`: the hash first, where a probe's compare reads it (see `state::Node`).
#[derive(Clone, PartialEq, Eq, Debug)]
#[repr(C)]
pub(super) struct EntryKey {
    pub(super) hash: u64,
    /// One allocation for all of a tenant's entries (see `Table::admit_client`).
    pub(super) tenant: Arc<str>,
    pub(super) subject: Subject,
}

/// Longest subject held inside the key.
const SUBJECT_INLINE: usize = 22;

/// An entry's subject: held inside the key when it is at most [`SUBJECT_INLINE`] bytes (most
/// client ids, and `*`), shared otherwise. Inline, a check's key compare reads no memory beyond
/// the entry's own: a shared id was one more cache miss a check at 10^4 clients and more, and
/// one more allocation an entry (`docs/performance.md`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub(super) enum Subject {
    Inline {
        len: u8,
        bytes: [u8; SUBJECT_INLINE],
    },
    Shared(Arc<str>),
}

impl Subject {
    /// `s`, inline when it fits; `shared` gives it otherwise.
    fn new(s: &str, shared: impl FnOnce() -> Arc<str>) -> Self {
        if s.len() <= SUBJECT_INLINE {
            let mut bytes = [0u8; SUBJECT_INLINE];
            bytes[..s.len()].copy_from_slice(s.as_bytes());
            Subject::Inline {
                len: s.len() as u8,
                bytes,
            }
        } else {
            Subject::Shared(shared())
        }
    }

    /// The subject a limit counts under ([`subject_of`]), for a new entry of `client`.
    pub(super) fn of(l: &Limit, client: &ClientId) -> Self {
        Subject::new(subject_of(l, client.as_str()), || owned_subject(l, client))
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            Subject::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Subject::Shared(s) => s.as_bytes(),
        }
    }

    pub(super) fn as_str(&self) -> &str {
        match self {
            // Copied from a `str` whole (`Subject::new`): always UTF-8.
            Subject::Inline { .. } => std::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            Subject::Shared(s) => s,
        }
    }

    /// The subject as the store's keys and the usage history hold it: an allocation when it is
    /// inline (the sync task's, once an entry a round, never a check's).
    pub(super) fn to_arc(&self) -> Arc<str> {
        match self {
            Subject::Inline { .. } => Arc::from(self.as_str()),
            Subject::Shared(s) => s.clone(),
        }
    }
}

impl Hash for EntryKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.hash)
    }
}

/// A borrowed key, so lookups on the check path do not allocate.
#[derive(Clone, Copy)]
pub(super) struct EntryRef<'a> {
    pub(super) hash: u64,
    pub(super) tenant: &'a str,
    pub(super) subject: &'a str,
}

impl<'a> EntryRef<'a> {
    pub(super) fn new(hasher: &DefaultHashBuilder, tenant: &'a str, subject: &'a str) -> Self {
        EntryRef {
            hash: hasher.hash_one((tenant, subject)),
            tenant,
            subject,
        }
    }
}

impl Hash for EntryRef<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.hash)
    }
}

impl Equivalent<EntryKey> for EntryRef<'_> {
    fn equivalent(&self, k: &EntryKey) -> bool {
        // The hash first: a differing key is told apart without reading its strings.
        k.hash == self.hash
            && *k.tenant == *self.tenant
            && k.subject.as_bytes() == self.subject.as_bytes()
    }
}

/// How far ahead of this instance's clock another instance's clock may run and still have its
/// buckets counted here.
pub const CLOCK_SKEW_MS: i64 = 60_000;

/// The newest bucket start a read covers: the current bucket, or a slightly later one written
/// by an instance whose clock runs ahead. Reads stay bounded (the scylla store refuses ranges
/// over many partitions).
pub(super) fn newest_readable(kind: LimitKind, now: i64) -> i64 {
    kind.grain().bucket_start(now + CLOCK_SKEW_MS)
}

/// The subject a limit counts under: the client, or the tenant's shared `*`.
pub(super) fn subject_of<'a>(l: &Limit, client: &'a str) -> &'a str {
    match l.scope {
        Scope::Client => client,
        Scope::Tenant => TENANT_SUBJECT,
    }
}

/// [`subject_of`], owned: for the store's keys.
fn owned_subject(l: &Limit, client: &ClientId) -> Arc<str> {
    match l.scope {
        Scope::Client => client.as_arc().clone(),
        Scope::Tenant => Arc::from(TENANT_SUBJECT),
    }
}

/// The store's key of the counter of `l` for `client`.
pub(super) fn counter_key(tenant: &TenantId, client: &ClientId, l: &Limit) -> CounterKey {
    CounterKey {
        tenant: tenant.as_arc().clone(),
        subject: owned_subject(l, client),
        limit: l.id.as_arc().clone(),
        grain: l.kind.grain(),
    }
}

/// The store range a decision on `l` needs at `now`.
pub(super) fn range_of(tenant: &TenantId, client: &ClientId, l: &Limit, now: i64) -> CounterRange {
    CounterRange {
        key: counter_key(tenant, client, l),
        from: window::oldest_needed(l.kind, now),
        to: newest_readable(l.kind, now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Policy, PolicyDoc};

    fn limits() -> Policy {
        let doc: PolicyDoc = serde_json::from_value(serde_json::json!({"limits": [
            {"id": "c", "max": 10, "window": "1s"},
            {"id": "t", "max": 10, "window": "1s", "scope": "tenant"}]}))
        .unwrap();
        Policy::from_doc(&doc, false).unwrap()
    }

    /// The key stays 48 bytes: an inline subject costs 8 bytes more than a pointer to a shared
    /// one, and saves that one's allocation.
    #[test]
    fn a_subject_is_three_words() {
        assert_eq!(std::mem::size_of::<Subject>(), 24);
    }

    #[test]
    fn ids_that_fit_are_inline_and_longer_ones_shared() {
        let p = limits();
        let (client, tenant) = (&p.limits[0], &p.limits[1]);
        for n in [1, 21, 22, 23, 64, 128] {
            let id = ClientId::parse(&"x".repeat(n)).unwrap();
            let s = Subject::of(client, &id);
            assert_eq!(
                matches!(s, Subject::Inline { .. }),
                n <= SUBJECT_INLINE,
                "{n}"
            );
            if let Subject::Shared(a) = &s {
                assert!(
                    Arc::ptr_eq(a, id.as_arc()),
                    "the client's own id, not a copy"
                );
            }
            assert_eq!(s.as_str(), id.as_str());
            assert_eq!(s.as_bytes(), id.as_str().as_bytes());
            assert_eq!(&*s.to_arc(), id.as_str());
            assert_eq!(Subject::of(tenant, &id).as_str(), TENANT_SUBJECT);
        }
    }

    #[test]
    fn a_borrowed_key_finds_only_its_own_entry() {
        let p = limits();
        let hasher = DefaultHashBuilder::default();
        let tenant: Arc<str> = Arc::from("acme");
        let key = |c: &str| EntryKey {
            hash: EntryRef::new(&hasher, "acme", c).hash,
            tenant: tenant.clone(),
            subject: Subject::of(&p.limits[0], &ClientId::parse(c).unwrap()),
        };
        let long = "y".repeat(40);
        for c in ["k", "k1", long.as_str()] {
            let k = key(c);
            assert!(EntryRef::new(&hasher, "acme", c).equivalent(&k));
            // Same hash forced, other subject: still told apart by the bytes.
            for other in ["k", "k1", "k\0", long.as_str(), &long[..39]] {
                let r = EntryRef {
                    hash: k.hash,
                    tenant: "acme",
                    subject: other,
                };
                assert_eq!(r.equivalent(&k), other == c, "{other:?} against {c:?}");
            }
            let t = EntryRef {
                hash: k.hash,
                tenant: "acme2",
                subject: c,
            };
            assert!(!t.equivalent(&k));
        }
    }
}
