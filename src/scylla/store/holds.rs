//! Holds (reservations) on the scylla store (`migrations/0008_holds.cql`): a row per hold, a
//! partition each; ending one is `UPDATE ... IF state = 'open'` (Paxos at SERIAL), so of
//! racing ends one wins, whichever regions they are made in: any instance of any region may
//! settle, release or expire any hold. In one data centre SERIAL costs what LOCAL_SERIAL does;
//! across several, an end waits on a quorum of every region's replicas, and while the regions
//! are cut apart no end can be made (the checks go on; see docs/reservations.md). Every read
//! and end of a hold is at the serial level, never mixed with LOCAL_SERIAL on one row.
//! `hold_expiry` lists the open holds by the minute they expire; the sweep reads the minutes
//! from where it last found nothing left, up to now.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use futures::stream::{self, StreamExt};

use super::connection::Cql;
use super::errors::{internal, map_exec, Op};
use super::statements::{
    DeleteHoldExpiryValues, DueHoldRow, DueHoldsValues, EndHoldValues, GetHoldValues, HoldRow,
    PutHoldExpiryValues, PutHoldValues,
};
use crate::domain::HoldState;
use crate::store::hold::{Charge, Ended, Hold, HOLD_RETENTION_MS};
use crate::store::{StoreError, StoreResult};

const MINUTE_MS: i64 = 60_000;
/// Minutes of the index read at once.
const READ_AHEAD: usize = 16;
/// Expiries (conditional writes) one sweep has in flight at once.
const EXPIRE_AT_ONCE: usize = 32;
/// Before the first sweep.
const NO_CURSOR: i64 = i64::MIN;

/// The holds part of the store.
pub(super) struct Holds {
    cql: Arc<Cql>,
    /// The first minute the next sweep reads: every one before it held no open hold.
    cursor: AtomicI64,
    unsure: Unsure,
}

/// Ends this instance made whose outcome it could not learn: the conditional write's answer
/// was lost and the read after it failed too. The end may have won; if it did, nobody else
/// will claim it, and what the hold held of in-flight limits would never come back. The next
/// end of the same hold (the sweep's, which finds it still listed; or a retried settle) finds
/// the row ended exactly as this end asked, at its instant, and claims it then.
struct Unsure {
    /// By hold id: the state, cost and instant the end asked for.
    ends: std::sync::Mutex<std::collections::HashMap<String, AskedEnd>>,
}

type AskedEnd = (HoldState, Option<u64>, i64);

impl Unsure {
    /// At most this many remembered: beyond, while the store keeps failing, new ones are not.
    const MAX: usize = 100_000;

    fn new() -> Unsure {
        Unsure {
            ends: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    fn remember(&self, id: &str, state: HoldState, cost: Option<u64>, at_ms: i64) {
        let mut ends = self
            .ends
            .lock()
            .expect("never poisoned: no panics while held");
        if ends.len() < Self::MAX {
            ends.insert(id.to_owned(), (state, cost, at_ms));
        }
    }

    /// Whether `ended` (a hold found ended) is one of these ends, which won after all; the end
    /// is forgotten either way.
    fn won(&self, ended: &Hold) -> bool {
        let mine = self
            .ends
            .lock()
            .expect("never poisoned: no panics while held")
            .remove(&ended.id);
        mine.is_some_and(|(state, cost, at)| {
            ended.state == state && ended.cost == cost && ended.ended_ms == Some(at)
        })
    }
}

/// A row's TTL: until a day past the hold's expiry, at least a second.
fn ttl_secs(expires_ms: i64, now_ms: i64) -> i32 {
    let ms = (expires_ms + HOLD_RETENTION_MS - now_ms).max(1_000);
    i32::try_from(ms / 1_000).unwrap_or(i32::MAX)
}

fn hold_of(id: &str, row: HoldRow) -> StoreResult<Hold> {
    let (tenant, client, resource, estimate, taken_ms, expires_ms, charges, state, cost, ended) =
        row;
    let charges: Vec<Charge> = serde_json::from_str(&charges)
        .map_err(|e| StoreError::Internal(format!("corrupt hold {id}: {e}")))?;
    let state = HoldState::from_name(&state)
        .ok_or_else(|| StoreError::Internal(format!("corrupt hold {id}: state {state}")))?;
    Ok(Hold {
        id: id.to_owned(),
        tenant,
        client,
        resource,
        estimate: estimate.max(0) as u64,
        taken_ms,
        expires_ms,
        charges,
        state,
        cost: cost.map(|c| c.max(0) as u64),
        ended_ms: ended,
    })
}

impl Holds {
    pub(super) fn new(cql: Arc<Cql>) -> Self {
        Holds {
            cql,
            cursor: AtomicI64::new(NO_CURSOR),
            unsure: Unsure::new(),
        }
    }

    pub(super) async fn put(&self, h: &Hold) -> StoreResult<()> {
        let now = chrono::Utc::now().timestamp_millis();
        let ttl = ttl_secs(h.expires_ms, now);
        let charges = serde_json::to_string(&h.charges)
            .map_err(|e| StoreError::Internal(format!("encoding a hold: {e}")))?;
        let est = h.estimate.min(i64::MAX as u64) as i64;
        let values: PutHoldValues<'_> = (
            &h.id,
            &h.tenant,
            &h.client,
            h.resource.as_deref(),
            est,
            h.taken_ms,
            h.expires_ms,
            &charges,
            h.state.as_str(),
            ttl,
        );
        let st = &self.cql.st;
        self.cql
            .session
            .execute_unpaged(&st.put_hold, values)
            .await
            .map_err(|e| map_exec(e, Op::Write))?;
        let values: PutHoldExpiryValues<'_> =
            (h.expires_ms.div_euclid(MINUTE_MS), h.expires_ms, &h.id, ttl);
        self.cql
            .session
            .execute_unpaged(&st.put_hold_expiry, values)
            .await
            .map_err(|e| map_exec(e, Op::Write))?;
        Ok(())
    }

    pub(super) async fn get(&self, id: &str) -> StoreResult<Option<Hold>> {
        let values: GetHoldValues<'_> = (id,);
        let res = self
            .cql
            .session
            .execute_unpaged(&self.cql.st.get_hold, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        rows.maybe_first_row::<HoldRow>()
            .map_err(internal)?
            .map(|r| hold_of(id, r))
            .transpose()
    }

    pub(super) async fn end(
        &self,
        id: &str,
        state: HoldState,
        cost: Option<u64>,
        now_ms: i64,
    ) -> StoreResult<Ended> {
        let Some(h) = self.get(id).await? else {
            return Ok(Ended::Unknown);
        };
        if h.state != HoldState::Open {
            if self.unsure.won(&h) {
                self.unlist(&h).await;
                return Ok(Ended::Now(h));
            }
            return Ok(Ended::Before(h));
        }
        let values: EndHoldValues<'_> = (
            ttl_secs(h.expires_ms, now_ms),
            state.as_str(),
            cost.map(|c| c.min(i64::MAX as u64) as i64),
            now_ms,
            id,
        );
        let outcome = self.cql.lwt(&self.cql.st.end_hold, values).await;
        // Read at the serial level: the end Paxos decided, whatever this call was told.
        let after = match (outcome, self.get(id).await) {
            (_, Ok(None)) => return Ok(Ended::Unknown),
            (Ok(false), Ok(Some(after))) => return Ok(Ended::Before(after)),
            (Ok(true), Ok(Some(after))) => after,
            // The end's outcome is unknown (a timeout, contention between regions): it won if
            // the hold ended exactly as it asked, at its instant. Another end like it in the
            // same millisecond, its outcome unknown too, would also count itself the winner.
            (Err(e), Ok(Some(after))) => {
                let mine =
                    after.state == state && after.cost == cost && after.ended_ms == Some(now_ms);
                match after.state {
                    HoldState::Open => return Err(e),
                    _ if !mine => return Ok(Ended::Before(after)),
                    _ => after,
                }
            }
            (Err(e), Err(_)) => {
                self.unsure.remember(id, state, cost, now_ms);
                return Err(e);
            }
            (Ok(false), Err(e)) => return Err(e),
            // It won: the hold is as this end wrote it.
            (Ok(true), Err(_)) => Hold {
                state,
                cost,
                ended_ms: Some(now_ms),
                ..h.clone()
            },
        };
        self.unlist(&h).await;
        Ok(Ended::Now(after))
    }

    /// Takes an ended hold off the expiry index. The index only lists open holds; a row left
    /// behind (this delete failed) is skipped by the sweep, which finds the hold ended.
    async fn unlist(&self, h: &Hold) {
        let values: DeleteHoldExpiryValues<'_> =
            (h.expires_ms.div_euclid(MINUTE_MS), h.expires_ms, &h.id);
        let _ = self
            .cql
            .session
            .execute_unpaged(&self.cql.st.delete_hold_expiry, values)
            .await;
    }

    /// The ids the index lists for `minute`, due before `now_ms`, at most `limit`.
    async fn due_in(&self, minute: i64, now_ms: i64, limit: i32) -> StoreResult<Vec<String>> {
        let values: DueHoldsValues = (minute, now_ms, limit);
        let res = self
            .cql
            .session
            .execute_unpaged(&self.cql.st.due_holds, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let ids: Vec<DueHoldRow> = rows
            .rows::<DueHoldRow>()
            .map_err(internal)?
            .collect::<Result<_, _>>()
            .map_err(internal)?;
        Ok(ids.into_iter().map(|(id,)| id).collect())
    }

    /// Expires those of `ids` still open: [`EXPIRE_AT_ONCE`] conditional writes in flight.
    pub(super) async fn expire(&self, ids: &[String], now_ms: i64) -> StoreResult<Vec<Hold>> {
        let mut rest = ids.iter();
        let mut ends = futures::stream::FuturesUnordered::new();
        let mut ended = Vec::new();
        let mut failed = None;
        loop {
            while ends.len() < EXPIRE_AT_ONCE {
                let Some(id) = rest.next() else { break };
                ends.push(self.end(id, HoldState::Expired, None, now_ms));
            }
            match ends.next().await {
                Some(Ok(Ended::Now(h))) => ended.push(h),
                Some(Ok(_)) => {}
                Some(Err(e)) => failed = Some(e),
                None => break,
            }
        }
        // Those ended are answered even when another failed: their counters must come back;
        // the failed ones are still open and found again by the next sweep.
        match failed {
            Some(e) if ended.is_empty() => Err(e),
            _ => Ok(ended),
        }
    }

    /// Open holds past their time: the minutes from the cursor to now, read
    /// [`READ_AHEAD`] at a time. The cursor moves past the minutes before now that held
    /// nothing open, so a sweep reads one or two minutes; the first reaches back a day.
    pub(super) async fn expired(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<Hold>> {
        let current = now_ms.div_euclid(MINUTE_MS);
        let mut from = self.cursor.load(Ordering::Relaxed);
        if from == NO_CURSOR {
            from = current - HOLD_RETENTION_MS / MINUTE_MS;
        }
        let cap = i32::try_from(limit).unwrap_or(i32::MAX);
        let mut minutes = stream::iter(from..=current)
            .map(|m| async move { self.due_in(m, now_ms, cap).await.map(|ids| (m, ids)) })
            .buffered(READ_AHEAD);
        let mut out = Vec::new();
        let mut clear_until = from;
        let mut clear = true;
        while let Some(found) = minutes.next().await {
            let (minute, ids) = found?;
            let mut open = 0;
            for id in ids {
                if out.len() >= limit {
                    break;
                }
                // An ended hold whose index row was left behind has nothing to expire.
                if let Some(h) = self.get(&id).await?.filter(|h| h.state == HoldState::Open) {
                    out.push(h);
                    open += 1;
                }
            }
            clear &= open == 0 && minute < current;
            if clear {
                clear_until = minute + 1;
            }
            if out.len() >= limit {
                break;
            }
        }
        self.cursor.store(clear_until, Ordering::Relaxed);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(state: HoldState, cost: Option<u64>, at: i64) -> Hold {
        Hold {
            id: "h1".into(),
            tenant: "acme".into(),
            client: "k".into(),
            resource: None,
            estimate: 1,
            taken_ms: 0,
            expires_ms: 1_000,
            charges: Vec::new(),
            state,
            cost,
            ended_ms: Some(at),
        }
    }

    #[test]
    fn an_end_of_unknown_outcome_is_claimed_once_and_only_as_it_was_asked() {
        let u = Unsure::new();
        assert!(
            !u.won(&ended(HoldState::Expired, None, 5)),
            "nothing remembered"
        );
        u.remember("h1", HoldState::Expired, None, 5);
        assert!(
            !u.won(&ended(HoldState::Expired, None, 6)),
            "another end, at another instant, won"
        );
        assert!(
            !u.won(&ended(HoldState::Expired, None, 5)),
            "forgotten once looked at"
        );
        u.remember("h1", HoldState::Settled, Some(3), 7);
        assert!(
            !u.won(&ended(HoldState::Settled, Some(4), 7)),
            "another cost"
        );
        u.remember("h1", HoldState::Settled, Some(3), 7);
        assert!(u.won(&ended(HoldState::Settled, Some(3), 7)));
        assert!(
            !u.won(&ended(HoldState::Settled, Some(3), 7)),
            "claimed once"
        );
    }
}
