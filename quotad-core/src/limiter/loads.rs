//! First reads under way: concurrent first checks of one client share one store read.
//!
//! A check whose client has no state in memory reads it from the store. When many of a new
//! client's checks arrive together (a burst, a client moving to this instance), the first
//! leads the read and the others wait for it, then decide from what it installed; a follower
//! whose leader failed, or read other limits, reads for itself at its next turn. The map holds
//! an entry only while a read is under way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

type Key = (Arc<str>, Arc<str>);

#[derive(Default)]
pub(super) struct Loads {
    under_way: Mutex<HashMap<Key, watch::Receiver<bool>>>,
}

/// Whose turn it is to read.
pub(super) enum Turn<'a> {
    /// Read, and hold this until the read's states are installed.
    Lead(Leading<'a>),
    /// Another check is reading this client: wait for it (`changed`, or the sender dropped).
    Follow(watch::Receiver<bool>),
}

/// The read of a client under way; its end (drop) lets the followers go.
pub(super) struct Leading<'a> {
    loads: &'a Loads,
    key: Key,
    done: watch::Sender<bool>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        self.loads.lock().remove(&self.key);
        let _ = self.done.send(true);
    }
}

impl Loads {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, watch::Receiver<bool>>> {
        // Only map operations run under it: a panic cannot leave it half-changed.
        self.under_way.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leads the read of `(tenant, client)`, or follows the one under way.
    pub(super) fn turn(&self, tenant: &Arc<str>, client: &Arc<str>) -> Turn<'_> {
        let key = (tenant.clone(), client.clone());
        let mut m = self.lock();
        if let Some(rx) = m.get(&key) {
            return Turn::Follow(rx.clone());
        }
        let (done, rx) = watch::channel(false);
        m.insert(key.clone(), rx);
        Turn::Lead(Leading {
            loads: self,
            key,
            done,
        })
    }

    #[cfg(test)]
    pub(super) fn under_way(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_second_reader_of_a_client_follows_the_first() {
        let loads = Loads::default();
        let (t, c, other): (Arc<str>, Arc<str>, Arc<str>) = ("t".into(), "c".into(), "d".into());
        let Turn::Lead(lead) = loads.turn(&t, &c) else {
            panic!("the first reads")
        };
        let Turn::Follow(mut rx) = loads.turn(&t, &c) else {
            panic!("the second follows")
        };
        assert!(
            matches!(loads.turn(&t, &other), Turn::Lead(_)),
            "another client reads"
        );
        assert_eq!(loads.under_way(), 1, "a dropped lead leaves nothing behind");
        let waiting = tokio::spawn(async move { rx.wait_for(|d| *d).await.is_ok() });
        drop(lead);
        assert!(
            waiting.await.unwrap(),
            "the follower wakes when the read is done"
        );
        assert_eq!(loads.under_way(), 0);
        assert!(
            matches!(loads.turn(&t, &c), Turn::Lead(_)),
            "the next read leads again"
        );
    }
}
