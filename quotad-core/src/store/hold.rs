//! Holds (reservations) in the store: taken by a check, ended once by a settle, a release or
//! their expiry, on any instance.
//!
//! A hold's record says what it charged: each counter, the bucket its time fell in and the
//! amount. Ending it is one conditional write (open to settled, released or expired): of two
//! instances racing to end one hold, exactly one wins, and only the winner changes the
//! counters. Records are kept [`HOLD_RETENTION_MS`] after their expiry, so that a late settle
//! or release is answered with what became of the hold rather than "unknown".

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{CounterKey, Delta, StoreResult};
use crate::domain::{Grain, HoldState};

/// How long a hold's record outlives its expiry.
pub const HOLD_RETENTION_MS: i64 = 86_400_000;

/// One counter a hold charged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    pub limit: String,
    /// The counter's grain code ([`Grain::code`]).
    pub grain: i64,
    /// The client, or `*` for a tenant-scoped limit.
    pub subject: String,
    /// The start of the bucket the hold's time fell in: where its end is charged too.
    pub start: i64,
    /// What the hold took of the counter: its estimate, or one hold of an in-flight limit that
    /// counts holds.
    pub amount: u64,
    /// An in-flight limit's counter: its amount comes back however the hold ends.
    pub in_flight: bool,
}

/// A hold as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub id: String,
    pub tenant: String,
    pub client: String,
    pub resource: Option<String>,
    /// The cost taken when the hold began.
    pub estimate: u64,
    pub taken_ms: i64,
    pub expires_ms: i64,
    pub charges: Vec<Charge>,
    pub state: HoldState,
    /// The real cost, once settled.
    pub cost: Option<u64>,
    pub ended_ms: Option<i64>,
}

/// What a call to end a hold found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// This call ended it: the hold as it is now.
    Now(Hold),
    /// It had ended before (or another call won): the hold as it ended.
    Before(Hold),
    /// No such hold (never taken, or forgotten after [`HOLD_RETENTION_MS`]).
    Unknown,
}

impl Hold {
    /// The counter changes that ending this hold as `state` makes: a settle charges the real
    /// cost less the estimate, a release gives the estimate back, an expiry keeps it; every
    /// end gives an in-flight limit's amount back.
    pub fn end_deltas(&self, state: HoldState, cost: u64) -> Vec<Delta> {
        self.charges
            .iter()
            .filter_map(|c| {
                let delta = if c.in_flight {
                    -(c.amount.min(i64::MAX as u64) as i64)
                } else {
                    match state {
                        HoldState::Settled => (i128::from(cost) - i128::from(c.amount))
                            .clamp(i64::MIN as i128, i64::MAX as i128)
                            as i64,
                        HoldState::Released => -(c.amount.min(i64::MAX as u64) as i64),
                        HoldState::Expired | HoldState::Open => 0,
                    }
                };
                (delta != 0).then(|| Delta {
                    key: CounterKey {
                        tenant: self.tenant.as_str().into(),
                        subject: c.subject.as_str().into(),
                        limit: c.limit.as_str().into(),
                        grain: Grain::from_code(c.grain).unwrap_or(Grain::Fixed(1)),
                    },
                    start: c.start,
                    delta,
                })
            })
            .collect()
    }
}

/// Holds in the store.
#[async_trait]
pub trait HoldStore: Send + Sync + 'static {
    /// Records a hold that was just taken (open).
    async fn put_hold(&self, hold: &Hold) -> StoreResult<()>;

    /// The hold with this id, if the store knows it.
    async fn get_hold(&self, id: &str) -> StoreResult<Option<Hold>>;

    /// Ends the hold as `state` (settled with `cost`, released, or expired) at `now_ms`, if
    /// it is still open: of racing calls, one gets [`Ended::Now`].
    async fn end_hold(
        &self,
        id: &str,
        state: HoldState,
        cost: Option<u64>,
        now_ms: i64,
    ) -> StoreResult<Ended>;

    /// Holds still open whose time ended before `now_ms`, at most `limit`, oldest first.
    async fn expired_holds(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<Hold>>;

    /// Expires the holds `ids` that are still open, at `now_ms`: what [`HoldStore::end_hold`]
    /// does for each, in as few steps as the store can (one transaction, or requests at once).
    /// Answers the holds this call ended; those that had ended before are left out.
    async fn expire_holds(&self, ids: &[String], now_ms: i64) -> StoreResult<Vec<Hold>> {
        let mut ended = Vec::new();
        for id in ids {
            if let Ended::Now(h) = self.end_hold(id, HoldState::Expired, None, now_ms).await? {
                ended.push(h);
            }
        }
        Ok(ended)
    }
}
