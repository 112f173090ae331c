//! Reservations: a check that holds its estimate (`"reserve": true`), then settled at the real
//! cost or released (quotad's `docs/reservations.md`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Check, Client, Error};

/// quotad's answer to a reserving check: the decision, as [`crate::Answer`] has it, and the
/// reservation it took when admitted.
#[derive(Clone, Debug)]
pub struct Reserved {
    /// 200 admitted (the reservation taken), 429 denied (nothing held, nothing charged).
    pub status: http::StatusCode,
    /// The rate headers quotad sent, as in [`crate::Answer::headers`].
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The decision as JSON, `reservation` included.
    pub body: serde_json::Value,
    /// What to settle or release: present when admitted (a `dry_run` policy admits too).
    pub reservation: Option<Reservation>,
}

impl Reserved {
    pub fn allowed(&self) -> bool {
        self.status == http::StatusCode::OK
    }
}

/// A reservation just taken: its estimate stays charged until it is settled at the real cost,
/// released, or expires at `expires_at` (keeping the estimate).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Reservation {
    /// 32 lowercase hex digits.
    pub id: String,
    /// The cost held: the check's `cost`.
    pub estimate: u64,
    /// RFC 3339, UTC.
    pub expires_at: String,
}

impl Reservation {
    /// [`Client::settle`] of this reservation.
    pub async fn settle(&self, client: &Client, cost: u64) -> Result<Ended, Error> {
        client.settle(&self.id, cost).await
    }

    /// [`Client::release`] of this reservation.
    pub async fn release(&self, client: &Client) -> Result<Ended, Error> {
        client.release(&self.id).await
    }
}

/// Where a reservation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReservationState {
    /// Held: its estimate charged, its in-flight slots taken.
    Open,
    /// Ended at the real cost.
    Settled,
    /// Ended with nothing charged: the work never happened.
    Released,
    /// Nobody ended it in time: the estimate stays charged.
    Expired,
}

/// A reservation as quotad answers a settle, a release or a read of it (`state` is then
/// [`ReservationState::Open`] until it ends).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Ended {
    pub id: String,
    pub tenant: String,
    pub client: String,
    pub resource: Option<String>,
    pub state: ReservationState,
    pub estimate: u64,
    /// The real cost, once settled.
    pub cost: Option<u64>,
    /// RFC 3339, UTC, as every time below.
    pub taken_at: String,
    pub expires_at: String,
    pub ended_at: Option<String>,
    /// On a settle above the estimate: the limits the client's counts now exceed (the cost is
    /// charged past `max` all the same, and checks meeting them are refused until they fall).
    /// Empty otherwise.
    #[serde(default)]
    pub over_limit: Vec<String>,
}

/// A reserving check, as `POST /v1/check` takes it.
#[derive(Serialize)]
struct Reserving<'a> {
    #[serde(flatten)]
    check: &'a Check,
    reserve: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    hold: Option<String>,
}

/// A path segment with every byte but ASCII letters and digits percent-encoded, so that an id
/// is always one segment (quotad answers 400 to one that is not a reservation id).
fn segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Client {
    /// `POST /v1/check` with `"reserve": true`: the check's `cost` (1 when absent) is held as
    /// an estimate. `hold` is how long before the reservation expires (1s to 1h; None: the
    /// policy's, else 5 minutes). 200 and 429 are answers; anything else is an error (503 when
    /// quotad admitted the check but its store could not keep the reservation: nothing was
    /// charged).
    pub async fn reserve(&self, check: &Check, hold: Option<Duration>) -> Result<Reserved, Error> {
        let body = Reserving {
            check,
            reserve: true,
            hold: hold.map(|h| format!("{}ms", h.as_millis())),
        };
        let res = self
            .send(self.request(reqwest::Method::POST, "/v1/check").json(&body))
            .await?;
        let (status, headers, body) = Self::decision(res).await?;
        let reservation = match body.get("reservation") {
            Some(r) if status == http::StatusCode::OK => Some(
                serde_json::from_value(r.clone())
                    .map_err(|e| Error::Unreachable(format!("a reservation unread: {e}")))?,
            ),
            _ => None,
        };
        Ok(Reserved {
            status,
            headers,
            body,
            reservation,
        })
    }

    /// `POST /v1/reservations/{id}/settle`: charges `cost` (0 to 1 000 000 000) instead of the
    /// estimate. Settling again at the same cost answers the same; any other end of an ended
    /// reservation is [`Error::Refused`] with 409. Safe to try again after an
    /// [`Error::Unreachable`]: a settle that did land answers the same the second time.
    pub async fn settle(&self, id: &str, cost: u64) -> Result<Ended, Error> {
        #[derive(Serialize)]
        struct Settle {
            cost: u64,
        }
        let path = format!("/v1/reservations/{}/settle", segment(id));
        let res = self
            .send(
                self.request(reqwest::Method::POST, &path)
                    .json(&Settle { cost }),
            )
            .await?;
        Self::json(res).await
    }

    /// `POST /v1/reservations/{id}/release`: gives the whole estimate back (the work never
    /// happened). Releasing again answers the same; a settled or expired reservation is
    /// [`Error::Refused`] with 409.
    pub async fn release(&self, id: &str) -> Result<Ended, Error> {
        let path = format!("/v1/reservations/{}/release", segment(id));
        let res = self
            .send(self.request(reqwest::Method::POST, &path))
            .await?;
        Self::json(res).await
    }

    /// `GET /v1/reservations/{id}`: the reservation and how it ended, if it did.
    pub async fn reservation(&self, id: &str) -> Result<Ended, Error> {
        let path = format!("/v1/reservations/{}", segment(id));
        let res = self.send(self.request(reqwest::Method::GET, &path)).await?;
        Self::json(res).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_always_one_path_segment() {
        assert_eq!(segment("8f1c0c5e"), "8f1c0c5e");
        assert_eq!(segment("../quotas/acme"), "%2E%2E%2Fquotas%2Facme");
    }

    #[test]
    fn a_reserving_check_is_the_check_with_reserve_and_its_hold() {
        let check = Check::new("acme", "k").cost(800);
        let body = Reserving {
            check: &check,
            reserve: true,
            hold: Some(format!("{}ms", Duration::from_secs(120).as_millis())),
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"tenant": "acme", "client": "k", "cost": 800,
                "reserve": true, "hold": "120000ms"})
        );
    }
}
