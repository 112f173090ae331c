//! A reservation [`super::TokenBudgetLayer`] took, and its end: settled or released in a task
//! of its own, so that no response waits for quotad.

use std::time::Duration;

use crate::{Client, Error, Reservation};

/// How many times an end is tried when quotad cannot be reached or is unavailable. Trying
/// again is safe: quotad answers a repeated settle at the same cost, or a repeated release,
/// as it did the first time, and charges nothing twice.
const ATTEMPTS: u32 = 3;

/// A reservation not ended yet. Dropped without [`Hold::settle`] or [`Hold::release`] (the
/// request's future dropped while the upstream worked on it), it is settled at its estimate:
/// the work may have happened.
pub(super) struct Hold {
    client: Client,
    reservation: Reservation,
    ended: bool,
}

impl Hold {
    pub fn new(client: Client, reservation: Reservation) -> Self {
        Hold {
            client,
            reservation,
            ended: false,
        }
    }

    pub fn estimate(&self) -> u64 {
        self.reservation.estimate
    }

    /// Settles at `cost`, in a task of its own.
    pub fn settle(mut self, cost: u64) {
        self.end(Some(cost));
    }

    /// Gives the estimate back, in a task of its own.
    pub fn release(mut self) {
        self.end(None);
    }

    fn end(&mut self, cost: Option<u64>) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let client = self.client.clone();
        let id = self.reservation.id.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(end(client, id, cost));
            }
            Err(_) => tracing::warn!(
                reservation = %id,
                "no tokio runtime to end a quotad reservation in: it stays held until it expires"
            ),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.end(Some(self.reservation.estimate));
    }
}

/// Whether an end that failed so may succeed if tried again.
fn transient(e: &Error) -> bool {
    match e {
        Error::Unreachable(_) => true,
        Error::Refused { status, .. } => status.is_server_error(),
    }
}

/// Settles reservation `id` at `cost` (None: releases it), trying again a few times when quotad
/// is out of reach; a failure is logged.
async fn end(client: Client, id: String, cost: Option<u64>) {
    for attempt in 1..=ATTEMPTS {
        let ended = match cost {
            Some(c) => client.settle(&id, c).await,
            None => client.release(&id).await,
        };
        match ended {
            Ok(e) => {
                if !e.over_limit.is_empty() {
                    tracing::debug!(reservation = %id, over_limit = ?e.over_limit,
                        "a settle above its estimate took the client past these limits");
                }
                return;
            }
            Err(e) if attempt < ATTEMPTS && transient(&e) => {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
            Err(e) => {
                let how = match cost {
                    Some(c) => format!("settled at {c}"),
                    None => "released".to_owned(),
                };
                // Still open, it expires at its time, keeping its estimate.
                tracing::warn!(reservation = %id, error = %e,
                    "a quotad reservation could not be {how}");
                return;
            }
        }
    }
}
