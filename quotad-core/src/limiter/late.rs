//! Strict calls that answer after their deadline: a call that misses it is not dropped but
//! goes on in a task of its own ([`LateAnswers::follow`]), and its answer, when it comes, is
//! learned from at the next strict check or sync round ([`LateAnswers::learn`]). Until then
//! its hit counts as taken: pending if the failure rule admitted it, in the last totals if it
//! denied it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use super::table::Table;
use super::window;
use super::writes::Writing;
use crate::metrics::Metrics;
use crate::store::{BucketTotal, CounterRange, Delta, DynCounterStore, StoreError};

/// A strict call that answered after its deadline: its totals (which hold its hit), and what
/// the failure rule did with the hit meanwhile. A denied hit was taken back from the store by
/// the task that waited.
#[derive(Debug, Default)]
pub(super) struct Late {
    pub(super) deltas: Vec<Delta>,
    pub(super) ranges: Vec<CounterRange>,
    /// None: the call failed, nothing written.
    pub(super) totals: Option<Vec<Vec<BucketTotal>>>,
    /// The failure rule admitted the hit: it is pending in memory, and the store has it now.
    pub(super) admitted: bool,
    /// Pending hits the call carried, to be pending again as it wrote nothing.
    pub(super) unwritten: Vec<Delta>,
}

/// Late answers not learned yet. At most [`MAX_LATE`] wait; beyond, an answer is not learned
/// (its hit stays counted twice where it was admitted: the count errs high).
#[derive(Debug, Default)]
pub(super) struct LateAnswers(Arc<Mutex<Vec<Late>>>);
const MAX_LATE: usize = 100_000;

/// A strict store call, owned so that it can outlive its check.
pub(super) type Counting =
    Pin<Box<dyn Future<Output = Result<Vec<Vec<BucketTotal>>, StoreError>> + Send>>;

impl LateAnswers {
    /// Lets a strict call that missed its deadline finish in a task of its own (its carried
    /// hits' write under way until then). If it counted the hit, a hit the failure rule denied
    /// is taken back; either way its outcome waits here to be learned from.
    pub(super) fn follow(
        &self,
        call: Counting,
        mut late: Late,
        writing: Option<Writing>,
        store: DynCounterStore,
        metrics: Arc<Metrics>,
    ) {
        let queue = self.0.clone();
        tokio::spawn(async move {
            match call.await {
                Ok(totals) => {
                    if !late.admitted {
                        undo(&store, &metrics, late.deltas.clone()).await;
                    }
                    late.totals = Some(totals);
                    late.unwritten.clear();
                }
                // Its outcome stays unknown: what it carried counts as written, as a sync
                // write's does.
                Err(StoreError::Uncertain(_)) => return,
                Err(_) => {}
            }
            drop(writing);
            let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.len() < MAX_LATE {
                q.push(late);
            }
        });
    }

    /// Learns the answers that came after their deadline, into the table's states.
    pub(super) fn learn(&self, table: &Table) {
        let late = {
            let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if q.is_empty() {
                return;
            }
            std::mem::take(&mut *q)
        };
        for a in late {
            table.unwritten(&a.unwritten);
            let Some(totals) = a.totals else {
                continue;
            };
            if a.admitted {
                // The store counted the hit the failure rule admitted: no longer this
                // instance's to write. (Written already, it is counted twice: errs high.)
                for d in &a.deltas {
                    table.with_state(&d.key, |s| {
                        if let Some(b) = s.buckets.iter_mut().find(|b| b.start == d.start) {
                            b.pending -= (d.delta.max(0) as u64).min(b.pending);
                        }
                    });
                }
            }
            for (r, t) in a.ranges.iter().zip(&totals) {
                table.with_state(&r.key, |s| {
                    for bt in t {
                        let b = window::bucket_at(&mut s.buckets, bt.start);
                        b.stored = b.stored.max(bt.total);
                    }
                    // A late count may hold hits taken back since (this one's, racing
                    // checks'): read the counter again at the next round rather than refuse
                    // from it until an idle reread, seconds later.
                    s.pressing = true;
                });
            }
        }
    }
}

/// How long a compensation that the store refused (nothing written) is tried again.
const COMPENSATE_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// Takes hits back out of the store (a denied strict hit). A compensation the store refused
/// with nothing written is sent again in a task of its own, with back-off, until it lands (for
/// up to [`COMPENSATE_FOR`]): a node down must not leave denied hits counted. One whose outcome
/// is unknown is not resent, and the hit may stay counted: the count errs high (towards
/// denial); `quotad_strict_compensation_failures_total` counts those.
pub(super) async fn undo(store: &DynCounterStore, metrics: &Arc<Metrics>, deltas: Vec<Delta>) {
    if deltas.is_empty() {
        return;
    }
    let undo: Vec<Delta> = deltas
        .into_iter()
        .map(|mut d| {
            d.delta = -d.delta;
            d
        })
        .collect();
    match store.increment(&undo).await {
        Ok(()) => {}
        Err(StoreError::Unavailable(_)) => {
            let (store, metrics) = (store.clone(), metrics.clone());
            tokio::spawn(async move { compensate(&store, &metrics, &undo).await });
        }
        Err(e) => {
            metrics.compensation_failed();
            tracing::warn!(error = %e, "strict mode: compensating a denied hit failed");
        }
    }
}

/// Sends a refused compensation again until it lands, is in doubt, or [`COMPENSATE_FOR`] ends.
async fn compensate(store: &DynCounterStore, metrics: &Metrics, undo: &[Delta]) {
    let until = tokio::time::Instant::now() + COMPENSATE_FOR;
    let mut wait = std::time::Duration::from_millis(100);
    loop {
        tokio::time::sleep(wait).await;
        match store.increment(undo).await {
            Ok(()) => return,
            Err(StoreError::Unavailable(_)) if tokio::time::Instant::now() < until => {
                wait = (wait * 2).min(std::time::Duration::from_secs(5));
            }
            Err(e) => {
                metrics.compensation_failed();
                tracing::warn!(error = %e, "strict mode: compensating a denied hit failed");
                return;
            }
        }
    }
}
