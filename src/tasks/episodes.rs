//! Episodes of store trouble in the sync rounds' writes, logged as one line when one begins
//! and one when it ends, rather than a line a round.

use crate::store::StoreError;

/// What one round's writes could not do.
#[derive(Debug, Default)]
pub(super) struct Trouble {
    /// Hits of increments the store never sent (given back to pending).
    pub(super) unsent: u64,
    /// Hits of increments sent with an outcome nobody knows (settled later, `doubts`).
    pub(super) doubtful: u64,
    /// The first error.
    pub(super) first: Option<String>,
}

/// Episodes of store trouble in the rounds' writes: one log line when one begins (with its
/// first error) and one when a round writes everything again (how long it lasted, and what it
/// gave back and left in doubt), rather than a line a round. The lock is never held across an
/// `.await`.
#[derive(Debug, Default)]
pub(super) struct Episodes(std::sync::Mutex<Option<Episode>>);

#[derive(Debug)]
struct Episode {
    since: std::time::Instant,
    rounds: u64,
    unsent: u64,
    doubtful: u64,
}

impl Episodes {
    pub(super) fn round(&self, degraded: bool, t: &Trouble, refused: Option<&StoreError>) {
        let mut cur = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match (cur.as_mut(), degraded) {
            (None, false) => {}
            (None, true) => {
                let error = refused.map(ToString::to_string).or_else(|| t.first.clone());
                tracing::warn!(
                    error = error.as_deref().unwrap_or(""),
                    refused_whole = refused.is_some(),
                    unsent_hits = t.unsent,
                    doubtful_hits = t.doubtful,
                    "sync: the store refuses some writes; unsent hits stay pending and are \
                     sent again, hits in doubt are settled by reading them back (one line until it ends)"
                );
                *cur = Some(Episode {
                    since: std::time::Instant::now(),
                    rounds: 1,
                    unsent: t.unsent,
                    doubtful: t.doubtful,
                });
            }
            (Some(e), true) => {
                e.rounds += 1;
                e.unsent += t.unsent;
                e.doubtful += t.doubtful;
            }
            (Some(e), false) => {
                tracing::info!(
                    secs = e.since.elapsed().as_secs_f64(),
                    rounds = e.rounds,
                    unsent_hits_sent_again = e.unsent,
                    doubtful_hits = e.doubtful,
                    "sync: the store takes every write again"
                );
                *cur = None;
            }
        }
    }
}
