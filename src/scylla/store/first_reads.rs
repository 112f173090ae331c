//! First reads that arrive together go together: while one read of clients' counters is under
//! way, the reads of other clients that arrive wait, and go as one read when it is done.
//!
//! A client's first check reads its counters before its decision (`limiter::miss`). At 10^5
//! active clients nearly every check is some client's first, and one request per read made the
//! node's request rate, not quotad, the limit. Here a read that finds none under way starts at
//! once (no wait is added when reads are few); the ones that arrive meanwhile are answered by
//! the next read, which [`super::counters`] sends as a request per tenant and replica for up to
//! 100 clients. At most one such read is under way at a time; it runs in a task of its own,
//! so that a caller that gives up (its deadline) leaves the others' answers to come.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::counters::Counters;
use crate::store::{BucketTotal, CounterRange, StoreError, StoreResult};

/// What a read answers: per range, its buckets.
type Answer = StoreResult<Vec<Vec<BucketTotal>>>;

struct Waiting {
    ranges: Vec<CounterRange>,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiting>,
    /// A read is under way (its task takes what waits when it is done).
    running: bool,
}

/// The reads waiting for the one under way.
pub(super) struct FirstReads {
    counters: Arc<Counters>,
    queue: Mutex<Queue>,
}

/// The same error for each caller of a shared read.
fn copy(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        StoreError::Uncertain(m) => StoreError::Uncertain(m.clone()),
        StoreError::Internal(m) => StoreError::Internal(m.clone()),
    }
}

impl FirstReads {
    pub(super) fn new(counters: Arc<Counters>) -> Arc<Self> {
        Arc::new(FirstReads {
            counters,
            queue: Mutex::default(),
        })
    }

    /// Reads `ranges` with whatever other reads wait beside them.
    pub(super) async fn read(self: &Arc<Self>, ranges: &[CounterRange]) -> Answer {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.waiting.push(Waiting {
                ranges: ranges.to_vec(),
                answer: tx,
            });
            !std::mem::replace(&mut q.running, true)
        };
        if start {
            tokio::spawn(self.clone().run());
        }
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the shared read was dropped".into(),
            ))
        })
    }

    /// Reads what waits, again and again, until nothing does.
    async fn run(self: Arc<Self>) {
        loop {
            let batch = {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if q.waiting.is_empty() {
                    q.running = false;
                    return;
                }
                std::mem::take(&mut q.waiting)
            };
            let mut all = Vec::with_capacity(batch.iter().map(|w| w.ranges.len()).sum());
            for w in &batch {
                all.extend(w.ranges.iter().cloned());
            }
            // Each caller's answer, from the back (no copies): its ranges, or the error of
            // the part of the read that failed one of them.
            let read = self.counters.read(&all, None, None).await;
            let mut totals = read.totals;
            for w in batch.into_iter().rev() {
                let mine = totals.split_off(totals.len() - w.ranges.len());
                let answer = mine.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| {
                    read.error.as_ref().map_or_else(
                        || StoreError::Unavailable("a part of the read failed".into()),
                        copy,
                    )
                });
                let _ = w.answer.send(answer);
            }
        }
    }
}
