//! Wall-clock time for bucket boundaries (UTC, so every instance cuts buckets alike), behind a
//! trait so tests and simulations can drive time by hand; and the fleet's time
//! ([`FleetClock`]), the clock a fleet shares, so that instances whose own clocks disagree
//! still cut the same buckets.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

pub trait Clock: Send + Sync + 'static {
    /// Unix time in milliseconds.
    fn now_ms(&self) -> i64;

    /// The fleet's clock behind this one, when it is one ([`FleetClock`]): what reads the
    /// store's clock into it, and `/readyz`, reach it so.
    fn fleet(&self) -> Option<&FleetClock> {
        None
    }
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        // std's clock read directly: chrono's `Utc::now` also builds a calendar date, which
        // every check would pay for nothing.
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            Err(e) => i64::try_from(e.duration().as_nanos().div_ceil(1_000_000))
                .map_or(i64::MIN, |ms| -ms),
        }
    }
}

/// A clock that moves only when told to (tests, simulations).
#[derive(Debug, Default, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(start_ms: i64) -> Self {
        Self(Arc::new(AtomicI64::new(start_ms)))
    }
    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A clock that never jumps: ms since an arbitrary start (the process's).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock(std::time::Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        Self(std::time::Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> i64 {
        i64::try_from(self.0.elapsed().as_millis()).unwrap_or(i64::MAX)
    }
}

/// How far a monotonic clock may drift from true time, at most, per ms that passes: 100 ppm,
/// ten times what a crystal oscillator is specified for.
const DRIFT_PER_MS: f64 = 1e-4;

/// What an instance knows of its clock against the fleet's (`/readyz`, the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockState {
    /// No other clock to agree with: one process (the embedded store).
    Alone,
    /// The shared clock has not been read yet: the local wall clock stands in.
    Unknown,
    /// The fleet's time is the shared clock's, read `offset_ms` ahead of the local wall clock
    /// (negative: behind), within `uncertainty_ms`.
    Measured { offset_ms: i64, uncertainty_ms: i64 },
}

/// The fleet's time: the clock every instance shares (the store's), followed between reads
/// by this process's monotonic clock; the local wall clock only until the first read.
///
/// A reading asked at monotonic `sent` and answered at `received` says the shared clock showed
/// `shared` somewhere in between: the fleet's time is taken as `shared` at the midpoint,
/// within half the round trip (and the shared clock's millisecond). Between readings the
/// monotonic clock carries it, so a step of the local wall clock (NTP, a VM resumed, a
/// wrongly set clock) changes nothing; a reading replaces the last one only when it is at
/// least as certain as the last one has become with the monotonic clock's possible drift.
pub struct FleetClock {
    wall: Arc<dyn Clock>,
    mono: Arc<dyn Clock>,
    /// Fleet time less monotonic time, once read; `i64::MIN` until then.
    delta: AtomicI64,
    /// The last reading's uncertainty (ms), and the monotonic instant it was taken at.
    uncertainty: AtomicI64,
    read_at: AtomicI64,
    /// The store has no clock of its own to share ([`ClockState::Alone`]).
    alone: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for FleetClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetClock")
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl FleetClock {
    pub fn new(wall: Arc<dyn Clock>, mono: Arc<dyn Clock>) -> Self {
        Self {
            wall,
            mono,
            delta: AtomicI64::new(i64::MIN),
            uncertainty: AtomicI64::new(i64::MAX),
            read_at: AtomicI64::new(0),
            alone: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The system's wall clock and this process's monotonic clock.
    pub fn system() -> Self {
        Self::new(Arc::new(SystemClock), Arc::new(MonotonicClock::default()))
    }

    /// The monotonic clock readings are timed with.
    pub fn monotonic_ms(&self) -> i64 {
        self.mono.now_ms()
    }

    /// The store has no clock to share: this process's is the fleet's.
    pub fn set_alone(&self) {
        self.alone.store(true, Ordering::Relaxed);
    }

    /// A reading of the shared clock (see the type's comment); says whether it was kept.
    pub fn observe(&self, sent: i64, received: i64, shared_ms: i64) -> bool {
        let half = (received - sent).max(0) / 2;
        // The shared clock's millisecond: it showed `shared_ms` for up to a millisecond.
        let uncertainty = half + 1;
        let delta = shared_ms - (sent + half);
        if uncertainty > self.effective_uncertainty(received) {
            return false;
        }
        self.uncertainty.store(uncertainty, Ordering::Relaxed);
        self.read_at.store(received, Ordering::Relaxed);
        self.delta.store(delta, Ordering::Release);
        true
    }

    /// The last reading's uncertainty grown by the drift since (`i64::MAX` before any).
    fn effective_uncertainty(&self, mono_now: i64) -> i64 {
        let u = self.uncertainty.load(Ordering::Relaxed);
        if u == i64::MAX {
            return u;
        }
        let since = (mono_now - self.read_at.load(Ordering::Relaxed)).max(0);
        u.saturating_add((since as f64 * DRIFT_PER_MS).ceil() as i64)
    }

    /// What this instance knows of its clock against the fleet's now.
    pub fn state(&self) -> ClockState {
        if self.alone.load(Ordering::Relaxed) {
            return ClockState::Alone;
        }
        let delta = self.delta.load(Ordering::Acquire);
        if delta == i64::MIN {
            return ClockState::Unknown;
        }
        let mono = self.mono.now_ms();
        ClockState::Measured {
            offset_ms: mono + delta - self.wall.now_ms(),
            uncertainty_ms: self.effective_uncertainty(mono),
        }
    }
}

impl Clock for FleetClock {
    #[inline]
    fn now_ms(&self) -> i64 {
        match self.delta.load(Ordering::Acquire) {
            i64::MIN => self.wall.now_ms(),
            delta => self.mono.now_ms() + delta,
        }
    }

    fn fleet(&self) -> Option<&FleetClock> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clocks(wall_ms: i64, mono_ms: i64) -> (ManualClock, ManualClock, FleetClock) {
        let (wall, mono) = (ManualClock::new(wall_ms), ManualClock::new(mono_ms));
        let c = FleetClock::new(Arc::new(wall.clone()), Arc::new(mono.clone()));
        (wall, mono, c)
    }

    #[test]
    fn the_fleet_time_is_the_shared_clock_carried_by_the_monotonic_one() {
        // The local wall clock is 1 s ahead of the shared one.
        let (wall, mono, c) = clocks(101_000, 5_000);
        assert_eq!(
            c.now_ms(),
            101_000,
            "the wall clock until the first reading"
        );
        assert_eq!(c.state(), ClockState::Unknown);
        // Asked at mono 5_000, answered at 5_010, the shared clock said 100_005.
        mono.set(5_010);
        wall.set(101_010);
        assert!(c.observe(5_000, 5_010, 100_005));
        assert_eq!(c.now_ms(), 100_010);
        assert_eq!(
            c.state(),
            ClockState::Measured {
                offset_ms: -1_000,
                uncertainty_ms: 6
            }
        );
        // The wall clock steps back 30 s: the fleet's time goes on.
        mono.set(6_010);
        wall.set(72_010);
        assert_eq!(c.now_ms(), 101_010);
        // A less certain reading is not kept; a more certain one is.
        assert!(!c.observe(6_010, 6_110, 101_100));
        assert!(c.observe(6_010, 6_012, 101_012));
        assert_eq!(c.now_ms(), 101_011);
    }

    #[test]
    fn a_reading_grows_less_certain_with_time() {
        let (_, mono, c) = clocks(0, 0);
        assert!(c.observe(0, 2, 1_000));
        mono.set(100_000);
        // 100 s later, 100 ppm: 10 ms more; a reading 5 ms uncertain replaces it.
        assert!(matches!(
            c.state(),
            ClockState::Measured {
                uncertainty_ms: 12,
                ..
            }
        ));
        assert!(c.observe(100_000, 100_008, 101_004));
        c.set_alone();
        assert_eq!(c.state(), ClockState::Alone);
    }
}
