//! Holds (reservations): a reserving check's hold taken, and ended once, by a settle, a release
//! or its expiry, whichever instance is asked.
//!
//! The check itself is decided by the check service like any other (its in-flight limits
//! included); once admitted, its hold is written to the store before the answer, with what it
//! charged. Ending it is one conditional write in the store, and only the call that wins it
//! changes the counters (`Hold::end_deltas`), through the limiter. A hold asked about after its
//! time is expired then and there, so no settle lands on a hold the sweeper
//! ([`HoldService::expire_due`], run by `tasks::holds`) would also expire.

mod open;

use std::sync::Arc;

use crate::checks::Check;
use crate::domain::{ClientId, HoldState, Policy, TenantId};
use crate::limiter::{Decision, Limiter};
use crate::metrics::Metrics;
use crate::policy::PolicyCache;
use crate::store::hold::{Ended, Hold};
use crate::store::{DynStore, StoreError};

use open::OpenHolds;
pub use open::{Full, Place};

/// Why a hold could not be ended as asked.
#[derive(Debug)]
pub enum HoldError {
    /// No such hold, or one the caller may not see.
    Unknown,
    /// It ended otherwise before: the hold as it ended.
    Ended(Box<Hold>),
    Store(StoreError),
}

impl From<StoreError> for HoldError {
    fn from(e: StoreError) -> Self {
        HoldError::Store(e)
    }
}

/// Takes, reads and ends holds.
pub struct HoldService {
    limiter: Arc<Limiter>,
    policies: Arc<PolicyCache>,
    store: DynStore,
    metrics: Arc<Metrics>,
    open: OpenHolds,
}

/// A new hold's id: 128 random bits, as 32 hex digits.
fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// A hold id, as the OpenAPI document spells it.
pub const HOLD_ID_PATTERN: &str = "^[0-9a-f]{32}$";

/// Whether `id` is a hold id as [`new_id`] makes them ([`HOLD_ID_PATTERN`]).
pub fn is_hold_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

impl HoldService {
    pub fn new(
        limiter: Arc<Limiter>,
        policies: Arc<PolicyCache>,
        store: DynStore,
        metrics: Arc<Metrics>,
        bounds: (usize, usize),
    ) -> Self {
        HoldService {
            limiter,
            policies,
            store,
            metrics,
            open: OpenHolds::new(bounds.0, bounds.1),
        }
    }

    /// A place for one more open hold of `tenant`, claimed before its check is decided;
    /// [`Full`] when the tenant (`limiter.max_open_holds_per_tenant`) or the process
    /// (`limiter.max_open_holds`) has as many open holds taken here as it may.
    pub fn claim<'a>(&'a self, tenant: &'a str) -> Result<Place<'a>, Full> {
        self.open.claim(tenant, self.now())
    }

    fn now(&self) -> i64 {
        self.limiter.clock().now_ms()
    }

    /// Writes the hold of a reserving check admitted at `now` under `policy`, held for
    /// `hold_ms`. A check admitted in `dry_run` that enforcing would have denied charged
    /// nothing, and its hold charges nothing either. When the store cannot take the hold,
    /// what the check charged is given back and the error returned: no hold, no charge.
    pub async fn take(
        &self,
        place: Place<'_>,
        policy: &Policy,
        check: &Check<'_>,
        decision: &Decision,
        now: i64,
        hold_ms: i64,
    ) -> Result<Hold, StoreError> {
        let input = check.input_reserving();
        let charges = if decision.dry_run_denied {
            Vec::new()
        } else {
            self.limiter.hold_charges(policy, input, now)
        };
        let hold = Hold {
            id: new_id(),
            tenant: check.tenant.to_string(),
            client: check.client.to_string(),
            resource: check.resource.as_deref().map(str::to_owned),
            estimate: check.cost,
            taken_ms: now,
            expires_ms: now + hold_ms,
            charges,
            state: HoldState::Open,
            cost: None,
            ended_ms: None,
        };
        match self.store.put_hold(&hold).await {
            Ok(()) => {
                place.bind(&hold.id, hold.expires_ms);
                self.metrics.holds().taken();
                Ok(hold)
            }
            Err(e) => {
                let undo = hold.end_deltas(HoldState::Released, 0);
                self.limiter.adjust(undo).await;
                self.history_cost(&hold, HoldState::Released, 0);
                Err(e)
            }
        }
    }

    /// The hold `id`, if `may` says the caller may see its tenant's; one past its time is
    /// expired first.
    pub async fn get(&self, id: &str, may: impl Fn(&str) -> bool) -> Result<Hold, HoldError> {
        let hold = self.store.get_hold(id).await?.ok_or(HoldError::Unknown)?;
        if !may(&hold.tenant) {
            return Err(HoldError::Unknown);
        }
        let now = self.now();
        if hold.state == HoldState::Open && now >= hold.expires_ms {
            return Ok(self.expire(&hold.id, now).await?.unwrap_or(hold));
        }
        Ok(hold)
    }

    /// Settles the hold at `cost` (`Some`) or releases it (`None`). Asked again with the same
    /// end, it answers the hold as that end left it; an end of another kind is
    /// [`HoldError::Ended`].
    pub async fn end(
        &self,
        id: &str,
        cost: Option<u64>,
        may: impl Fn(&str) -> bool,
    ) -> Result<Hold, HoldError> {
        let hold = self.get(id, may).await?;
        let state = if cost.is_some() {
            HoldState::Settled
        } else {
            HoldState::Released
        };
        let same = |h: &Hold| h.state == state && h.cost == cost;
        if hold.state != HoldState::Open {
            return if same(&hold) {
                Ok(hold)
            } else {
                Err(HoldError::Ended(Box::new(hold)))
            };
        }
        match self.store.end_hold(id, state, cost, self.now()).await? {
            Ended::Now(h) => {
                self.ended(&h).await;
                Ok(h)
            }
            Ended::Before(h) if same(&h) => Ok(h),
            Ended::Before(h) => Err(HoldError::Ended(Box::new(h))),
            Ended::Unknown => Err(HoldError::Unknown),
        }
    }

    /// Expires one hold if it is still open; the hold as it is now when this call ended it.
    async fn expire(&self, id: &str, now: i64) -> Result<Option<Hold>, StoreError> {
        match self
            .store
            .end_hold(id, HoldState::Expired, None, now)
            .await?
        {
            Ended::Now(h) => {
                self.ended(&h).await;
                Ok(Some(h))
            }
            Ended::Before(h) => Ok(Some(h)),
            Ended::Unknown => Ok(None),
        }
    }

    /// What a hold's end changes, applied by the call that ended it, and counted.
    async fn ended(&self, h: &Hold) {
        self.open.ended(&h.tenant, &h.id, h.expires_ms);
        let cost = h.cost.unwrap_or(h.estimate);
        self.limiter.adjust(h.end_deltas(h.state, cost)).await;
        self.history_cost(h, h.state, cost);
        let m = self.metrics.holds();
        match h.state {
            HoldState::Settled => m.settled(h.estimate, cost),
            HoldState::Released => m.released(),
            HoldState::Expired => m.expired(),
            HoldState::Open => {}
        }
    }

    /// Has the usage history count what ending `h` as `state` at `cost` changed of the cost
    /// its check counted (the estimate): history counts settled cost, and nothing of a
    /// released hold.
    fn history_cost(&self, h: &Hold, state: HoldState, cost: u64) {
        let delta = match state {
            HoldState::Settled => i128::from(cost) - i128::from(h.estimate),
            HoldState::Released => -i128::from(h.estimate),
            HoldState::Expired | HoldState::Open => 0,
        };
        let delta = delta.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        self.limiter
            .history_cost(&h.tenant, &h.client, h.taken_ms, delta);
    }

    /// Expires up to `limit` holds whose time is over, in one step of the store; returns how
    /// many this call found. What the expiries give back of in-flight limits goes to the
    /// store as one write.
    pub async fn expire_due(&self, limit: usize) -> Result<usize, StoreError> {
        let now = self.now();
        let due = self.store.expired_holds(now, limit).await?;
        if due.is_empty() {
            return Ok(0);
        }
        let ids: Vec<String> = due.iter().map(|h| h.id.clone()).collect();
        let ended = self.store.expire_holds(&ids, now).await?;
        let mut deltas = Vec::new();
        for h in &ended {
            self.open.ended(&h.tenant, &h.id, h.expires_ms);
            deltas.extend(h.end_deltas(h.state, h.cost.unwrap_or(h.estimate)));
            self.metrics.holds().expired();
        }
        self.limiter.adjust(deltas).await;
        Ok(due.len())
    }

    /// The limits a hold charged that its client's counts now take past `max` (after a
    /// settle above the estimate), as this instance reads them; none when they cannot be read.
    pub async fn over_limit(&self, h: &Hold) -> Vec<String> {
        let (Ok(tenant), Ok(client)) = (TenantId::parse(&h.tenant), ClientId::parse(&h.client))
        else {
            return Vec::new();
        };
        let Some(policy) = self.policies.resolve(&h.tenant, &h.client) else {
            return Vec::new();
        };
        let Ok(usage) = self
            .limiter
            .usage_of_every_limit(&policy, &tenant, &client)
            .await
        else {
            return Vec::new();
        };
        usage
            .into_iter()
            .filter(|u| u.count > u.limit)
            .filter(|u| h.charges.iter().any(|c| c.limit == u.limit_id.as_str()))
            .map(|u| u.limit_id.to_string())
            .collect()
    }
}
