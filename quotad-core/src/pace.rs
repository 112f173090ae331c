//! Background work in short slices, so that it never holds a core for long.
//!
//! A sync round's passes over the limiter's entries and the embedded store's batch writes are
//! tens of milliseconds of CPU each round. Run in one stretch, such a burst keeps the request
//! threads waiting for a core, which shows in the tail latency; cut into short slices with a
//! short sleep after each, it does not (measured in docs/benchmarking.md, "The shape of a
//! round"). A lower priority for the burst does not help: it is the sleep, which leaves the
//! core idle for a moment, that lets the scheduler hand it to a waiting thread.
//!
//! Work that runs shorter than a slice never sleeps, so a single check's store call is not
//! slowed. Call [`Pacer::step`] between two steps of the work, never holding one of the
//! limiter's locks (the embedded store's writer may be held: a strict check waits behind a
//! sync write either way). The limiter's passes run on a runtime thread, which a pause blocks
//! for a moment; without slices, the pass itself would hold it for its whole length.

use std::time::{Duration, Instant};

/// The longest stretch of background work between two pauses.
pub const SLICE: Duration = Duration::from_micros(500);
/// How long a pause sleeps (the kernel adds its timer slack, 50 µs by default).
pub const PAUSE: Duration = Duration::from_micros(50);

/// Measures one piece of background work and pauses it every [`SLICE`].
#[derive(Debug)]
pub struct Pacer {
    since: Instant,
    /// The clock is read every this many steps (steps of a tight loop cost less than a read).
    every: u32,
    steps: u32,
}

impl Default for Pacer {
    fn default() -> Self {
        Self::new()
    }
}

impl Pacer {
    /// A pacer that reads the clock at every step.
    pub fn new() -> Self {
        Self::every(1)
    }

    /// A pacer that reads the clock every `steps` steps, for steps of well under a microsecond.
    pub fn every(steps: u32) -> Self {
        Self {
            since: Instant::now(),
            every: steps.max(1),
            steps: 0,
        }
    }

    /// Sleeps for [`PAUSE`] if the work has run for [`SLICE`] since the last pause (or since
    /// the pacer was made); says whether it did.
    pub fn step(&mut self) -> bool {
        self.steps += 1;
        if self.steps < self.every {
            return false;
        }
        self.steps = 0;
        if self.since.elapsed() < SLICE {
            return false;
        }
        std::thread::sleep(PAUSE);
        self.since = Instant::now();
        true
    }
}

/// Drops `items` in slices: a round's deltas hold three shared strings each, and 10^4
/// clients' worth let go of at once is a millisecond or more in one stretch.
pub fn drop_paced<T>(mut items: Vec<T>) {
    // A step is 256 items: the clock is read at each.
    let mut pace = Pacer::new();
    while !items.is_empty() {
        let keep = items.len().saturating_sub(256);
        items.truncate(keep);
        pace.step();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_longer_than_a_slice_pauses_and_starts_a_new_slice() {
        let mut p = Pacer::new();
        std::thread::sleep(SLICE);
        let at = Instant::now();
        assert!(p.step());
        assert!(at.elapsed() >= PAUSE);
        // The slice starts again after the pause.
        assert!(p.since >= at + PAUSE);
    }

    #[test]
    fn a_pacer_of_every_n_steps_reads_the_clock_at_the_nth() {
        let mut p = Pacer::every(3);
        std::thread::sleep(SLICE);
        assert!(!p.step());
        assert!(!p.step());
        assert!(p.step());
    }

    #[test]
    fn a_paced_drop_drops_every_item_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static DROPPED: AtomicUsize = AtomicUsize::new(0);
        struct Counted;
        impl Drop for Counted {
            fn drop(&mut self) {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop_paced((0..1_000).map(|_| Counted).collect());
        assert_eq!(DROPPED.load(Ordering::Relaxed), 1_000);
        drop_paced(Vec::<Counted>::new());
        assert_eq!(DROPPED.load(Ordering::Relaxed), 1_000);
    }
}
