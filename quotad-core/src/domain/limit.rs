//! Limits: one bound of a policy, what it counts over, whose count it keeps, and which checks it
//! applies to.

use smol_str::SmolStr;

use super::wire::wire_enum;
use super::{Grain, InFlight, LimitId, Period, ResourceMatch};

/// Largest `max` a limit may have (2^53, so it survives a JSON double round trip).
pub const MAX_LIMIT: u64 = 1 << 53;

/// How a limit counts: a sliding window, a calendar period, or a token bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitKind {
    Sliding {
        window_ms: i64,
        grain_ms: i64,
    },
    Calendar(Period),
    /// A token bucket holding `max` tokens (its burst), refilled with `rate` tokens every
    /// `per_ms`; its hits are counted in buckets of `grain_ms` (see `limiter::tokens`). Both
    /// are at most 31 days, which fits a `u32`: the variant is no wider than the others, and
    /// every counter's state holds a kind.
    Tokens {
        rate: u64,
        per_ms: u32,
        grain_ms: u32,
    },
}

impl LimitKind {
    pub fn grain(self) -> Grain {
        match self {
            LimitKind::Sliding { grain_ms, .. } => Grain::Fixed(grain_ms),
            LimitKind::Tokens { grain_ms, .. } => Grain::Fixed(grain_ms.into()),
            LimitKind::Calendar(p) => p.grain(),
        }
    }

    pub fn is_tokens(self) -> bool {
        matches!(self, LimitKind::Tokens { .. })
    }
}

wire_enum! {
    /// Whose count a limit keeps: each client its own, or one for all of the tenant's clients.
    pub enum Scope {
        Client = "client",
        Tenant = "tenant",
    }
}

/// One limit of a policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    pub id: LimitId,
    /// The id again, as a decision names its binding limit: inline when it is 23 bytes or
    /// shorter, so naming it copies bytes. A clone of `id` writes its reference count, one
    /// count shared by every check of the limit on every worker: at each decision that cache
    /// line moved between cores (measured: 8.7 % of `Limiter::locked` in a batch profile).
    pub answer_id: SmolStr,
    pub max: u64,
    pub kind: LimitKind,
    pub scope: Scope,
    pub resource: Option<ResourceMatch>,
    /// An in-flight limit: what it counts of the holds open at once. None: a rate or a budget.
    pub in_flight: Option<InFlight>,
}

impl Limit {
    pub fn applies_to(&self, resource: Option<&str>) -> bool {
        match &self.resource {
            None => true,
            Some(m) => m.matches(resource),
        }
    }

    /// Whether a check on `resource` meets this limit: an in-flight limit counts holds, so
    /// only a check that takes one (`reserving`) meets it.
    #[inline]
    pub fn applies(&self, resource: Option<&str>, reserving: bool) -> bool {
        (reserving || self.in_flight.is_none()) && self.applies_to(resource)
    }

    /// What a check of `cost` takes of this limit: one hold of an in-flight limit that counts
    /// holds, whatever its cost (a reservation of cost 0 is a hold all the same), the cost
    /// otherwise. Only a reserving check meets an in-flight limit ([`Limit::applies`]).
    #[inline]
    pub fn cost_of(&self, cost: u64) -> u64 {
        match self.in_flight {
            Some(InFlight::Holds) => 1,
            _ => cost,
        }
    }
}
