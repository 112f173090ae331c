//! The open-files limit (`RLIMIT_NOFILE`), raised at the start of `quotad serve` from its soft
//! value to its hard one where the soft one is lower. Every connection is a file: with the
//! usual soft limit of 1,024, about a thousand connections that never finish (counted before
//! their deadlines close them) left no descriptor for `/healthz`, the store or the log
//! ("Too many open files"). The hard limit is what the operator (systemd's `LimitNOFILE`,
//! Kubernetes' runtime) allows the process; quotad takes all of it, and the start-up log says
//! what it has, so `server.max_connections` can be set below it.

/// The limit before and after [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Files {
    pub before: u64,
    pub now: u64,
}

/// Raises the soft limit to the hard one; where that fails (or there is no such limit), keeps
/// what there is. Call once, at start.
pub fn raise() -> Option<Files> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a pointer to a live one.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur >= lim.rlim_max {
        return Some(Files {
            before,
            now: before,
        });
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: setrlimit reads one rlimit through a pointer to a live one.
    let now = if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        lim.rlim_max
    } else {
        before
    };
    Some(Files { before, now })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let files = super::raise().expect("Linux has RLIMIT_NOFILE");
        assert!(files.now >= files.before);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in `raise`.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        assert_eq!(files.now, lim.rlim_cur);
    }
}
