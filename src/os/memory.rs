//! How the `quotad serve` process asks the kernel and the allocator for memory, set once at
//! start. Both settings keep page faults off the request path's cores.
//!
//! - **Transparent huge pages off for this process** (`prctl(PR_SET_THP_DISABLE)`, as Redis
//!   does). mimalloc asks for huge pages on its arenas, and the kernel then zeroes 2 MiB at a
//!   time on a first touch, and may compact memory to find them: page faults on the request
//!   path's cores, which showed in the p99.9 at half the maximum rate (measured with and
//!   without, in docs/performance.md, "Settings that matter"). Other processes keep the
//!   machine's setting.
//! - **mimalloc returns freed memory to the OS after 10 s instead of 1 s.** The sync round and
//!   the usage history's write free megabytes each time and take them again at the next
//!   round or write; purged after 1 s, that memory was faulted in again at each history write.
//!   10 s still hands back what a burst left. A `MIMALLOC_PURGE_DELAY` set in the environment
//!   is kept.
//!
//! Neither is needed for correctness: where one cannot be set, the service runs all the same,
//! and its `memory settings` line at start says which were set.

/// mimalloc's `mi_option_purge_delay`: its index in mimalloc 3's `mi_option_e`, which
/// `libmimalloc-sys` (0.1.49) does not name.
#[cfg(feature = "mimalloc")]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// mimalloc 3's default purge delay (ms): the option at that index must hold it before it is
/// changed, so a mimalloc that numbers its options otherwise is left alone.
#[cfg(feature = "mimalloc")]
const MI_DEFAULT_PURGE_DELAY_MS: std::ffi::c_long = 1_000;
/// How long freed memory stays with the allocator before it goes back to the OS.
pub const PURGE_DELAY_MS: i64 = 10_000;

/// What [`tune`] managed to set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuned {
    pub huge_pages_off: bool,
    pub purge_delay_set: bool,
}

/// Sets both, for the whole process. Call once, early in `serve`.
pub fn tune() -> Tuned {
    Tuned {
        huge_pages_off: huge_pages_off(),
        purge_delay_set: purge_delay(),
    }
}

#[cfg(target_os = "linux")]
fn huge_pages_off() -> bool {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory of ours; it sets
    // a flag of this process that the kernel reads at page faults.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn huge_pages_off() -> bool {
    false
}

#[cfg(feature = "mimalloc")]
fn purge_delay() -> bool {
    use libmimalloc_sys::{mi_option_get, mi_option_set};
    // SAFETY: mimalloc's options are atomics meant to be read and set at any time; the index
    // is within its options whatever their order.
    unsafe {
        let now = mi_option_get(MI_OPTION_PURGE_DELAY);
        if now != MI_DEFAULT_PURGE_DELAY_MS {
            return false;
        }
        mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS as std::ffi::c_long);
        mi_option_get(MI_OPTION_PURGE_DELAY) == PURGE_DELAY_MS as std::ffi::c_long
    }
}

#[cfg(not(feature = "mimalloc"))]
fn purge_delay() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both settings take on Linux with mimalloc (the release build), and the purge delay's
    /// index still names the purge delay in the mimalloc this builds with: were it another
    /// option, its value would not be mimalloc's default purge delay and nothing would be set.
    #[test]
    fn both_settings_take() {
        let t = tune();
        assert_eq!(t.huge_pages_off, cfg!(target_os = "linux"));
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(t.purge_delay_set, cfg!(feature = "mimalloc"));
        }
        #[cfg(target_os = "linux")]
        {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            if let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
                assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
            }
        }
    }
}
