//! A shorter time slice for the threads that answer requests (`server.worker_slice_us`).
//!
//! Linux's fair scheduler (EEVDF, from 6.6) gives each runnable thread a virtual deadline one
//! time slice ahead, and a thread that wakes with an earlier deadline than the one running
//! takes the core from it. Since 6.12 a thread may ask for a slice of its own (`sched_setattr`
//! with `sched_runtime`, 0.1 to 100 ms; the default grows with the cores, 1.4 ms on two). An
//! HTTP worker asks for a short one: when a request arrives while the sync task, the store's
//! writer or another process has had the core for a while, the worker gets it at once instead
//! of at the end of that thread's slice. Its weight, and so its share of the CPU, is unchanged:
//! nothing is starved, the worker only runs sooner, in shorter turns.
//!
//! On two cores shared with the load generator, quotad's p99.9 at half its maximum rate was
//! 1.87 ms (median 1.76) with a 0.1 ms slice against 2.13 ms (2.06) without, and its p99 at
//! full load 2.34 against 2.78 ms (8 runs each, in ABBA order; `docs/performance.md`, "a
//! shorter slice for the workers").
//!
//! Where the kernel does not take it (older kernels, other systems, a policy other than the
//! normal or batch one, set by the operator with `chrt`), the worker keeps the kernel's
//! slice and the service runs all the same; the start-up log says which.

use std::time::Duration;

/// What asking for a slice came to on the calling thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slice {
    /// The kernel took it.
    Set,
    /// The thread runs under another scheduling policy (real-time, idle): left as it is.
    OtherPolicy,
    /// This kernel has no per-thread slice (before Linux 6.12) or refused it.
    Unsupported,
}

/// The shortest and longest slice the kernel accepts.
pub const MIN: Duration = Duration::from_micros(100);
pub const MAX: Duration = Duration::from_millis(100);

/// Asks the kernel to give the calling thread time slices of `slice` (clamped to
/// [`MIN`]..=[`MAX`]), keeping its policy and nice value.
#[cfg(target_os = "linux")]
pub fn shorten(slice: Duration) -> Slice {
    let ns = slice.clamp(MIN, MAX).as_nanos() as u64;
    let Some(mut attr) = get() else {
        return Slice::Unsupported;
    };
    if !matches!(
        attr.sched_policy as i32,
        libc::SCHED_OTHER | libc::SCHED_BATCH
    ) {
        return Slice::OtherPolicy;
    }
    attr.size = std::mem::size_of::<libc::sched_attr>() as u32;
    attr.sched_flags = 0;
    attr.sched_runtime = ns;
    attr.sched_deadline = 0;
    attr.sched_period = 0;
    // SAFETY: sched_setattr(2) on the calling thread (pid 0) reads `attr`, a whole
    // `sched_attr` whose `size` says how much of it there is; it writes nothing of ours.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const _, 0) };
    if r != 0 {
        return Slice::Unsupported;
    }
    // A kernel before 6.12 takes `sched_runtime` of a fair thread without a word and ignores
    // it; one that uses it reports it back.
    match get() {
        Some(a) if a.sched_runtime == ns => Slice::Set,
        _ => Slice::Unsupported,
    }
}

#[cfg(not(target_os = "linux"))]
pub fn shorten(_slice: Duration) -> Slice {
    Slice::Unsupported
}

/// The calling thread's scheduling attributes.
#[cfg(target_os = "linux")]
fn get() -> Option<libc::sched_attr> {
    let size = std::mem::size_of::<libc::sched_attr>() as u32;
    // SAFETY: all-zero bytes are a valid `sched_attr` (plain integers).
    let mut attr: libc::sched_attr = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getattr(2) on the calling thread writes at most `size` bytes into `attr`,
    // which has that many.
    let r = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &mut attr as *mut _, size, 0) };
    (r == 0).then_some(attr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's slice as the kernel reports it (None where it reports none).
    #[cfg(target_os = "linux")]
    fn current() -> Option<Duration> {
        get()
            .map(|a| Duration::from_nanos(a.sched_runtime))
            .filter(|d| !d.is_zero())
    }

    #[cfg(not(target_os = "linux"))]
    fn current() -> Option<Duration> {
        None
    }

    /// On its own thread, so the test runner's threads keep their slice.
    fn on_a_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().unwrap()
    }

    #[test]
    fn a_slice_the_kernel_takes_is_the_one_it_reports_and_the_nice_value_stays() {
        let (got, slice, nice_before, nice_after) = on_a_thread(|| {
            // SAFETY: getpriority/setpriority on the calling thread (0 = this one, which
            // is a thread id on Linux) with plain integers.
            let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 3) };
            let before = nice();
            let got = shorten(Duration::from_micros(250));
            (got, current(), before, nice())
        });
        assert_eq!(nice_before, nice_after, "the nice value changed");
        match got {
            Slice::Set => assert_eq!(slice, Some(Duration::from_micros(250))),
            // A kernel before 6.12 (or not Linux): nothing changed, and it says so.
            Slice::Unsupported => assert_ne!(slice, Some(Duration::from_micros(250))),
            Slice::OtherPolicy => panic!("a test thread runs under the normal policy"),
        }
    }

    #[test]
    fn a_slice_out_of_the_kernels_range_is_clamped_into_it() {
        let (short, long) = on_a_thread(|| {
            let a = (shorten(Duration::from_micros(1)), current());
            let b = (shorten(Duration::from_secs(5)), current());
            (a, b)
        });
        if short.0 == Slice::Set {
            assert_eq!(short.1, Some(MIN));
        }
        if long.0 == Slice::Set {
            assert_eq!(long.1, Some(MAX));
        }
    }
}
