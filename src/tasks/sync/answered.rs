//! Which sync rounds wrote every hit they took with an answer: from them, before when every
//! hit this instance admitted is in the store ([`Limiter::note_written`]), which the fleet
//! task reports to the others. While the report stays old (writes in doubt, refused, or left
//! for the next round), the others take no bucket after it as settled in their shares.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::limiter::Limiter;

/// The tick of the first of the last rounds in a row whose writes were all answered.
#[derive(Debug)]
pub(super) struct Answered {
    /// Fleet-clock ms; `i64::MAX` after a round that was not answered whole.
    since: AtomicI64,
}

impl Default for Answered {
    fn default() -> Self {
        Answered {
            since: AtomicI64::new(i64::MAX),
        }
    }
}

impl Answered {
    /// A round at `tick` wrote every hit it took with an answer (`answered`: none given back,
    /// none in doubt, nothing refused), or not. A round of `all` took every pending hit; any
    /// other only those of the counters due, so only rounds in a row for as long as a counter
    /// may wait show everything before them written.
    pub(super) fn round(&self, limiter: &Limiter, tick: i64, all: bool, answered: bool) {
        if !answered {
            self.since.store(i64::MAX, Ordering::Relaxed);
            return;
        }
        let kept = self.since.load(Ordering::Relaxed);
        if kept == i64::MAX {
            self.since.store(tick, Ordering::Relaxed);
        }
        let since = if all { None } else { Some(kept.min(tick)) };
        limiter.note_written(since, tick);
    }
}
