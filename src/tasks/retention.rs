//! Retention of the usage history and the audit log: every `sync.janitor_interval_ms`, delete
//! what is older than `history.retention` and `audit.retention`. The stores delete whole
//! periods (days on the embedded store, a partition per month on the scylla store), found
//! through their indexes, never by a scan. Every instance of a fleet sweeps; deleting what
//! another already deleted is harmless.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::store::DynStore;

#[derive(Clone, Debug)]
pub struct RetentionConfig {
    pub history: Duration,
    pub audit: Duration,
    pub interval: Duration,
    /// Most deletions of one sweep, per kind.
    pub budget: usize,
    /// Deadline of one store call.
    pub timeout: Duration,
}

pub struct Retention {
    store: DynStore,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    cfg: RetentionConfig,
}

impl Retention {
    pub fn new(
        store: DynStore,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        cfg: RetentionConfig,
    ) -> Self {
        Self {
            store,
            clock,
            metrics,
            cfg,
        }
    }

    /// One sweep: history, then audit, each older than its retention. Returns how many
    /// deletions each made (0 for one that failed, which is logged and counted).
    pub async fn sweep(&self) -> (u64, u64) {
        let now = self.clock.now_ms();
        let cut =
            |d: Duration| now.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let history = self
            .timed(
                "delete_history",
                self.store
                    .delete_history_before(cut(self.cfg.history), self.cfg.budget),
            )
            .await;
        let audit = self
            .timed(
                "delete_audit",
                self.store
                    .delete_audit_before(cut(self.cfg.audit), self.cfg.budget),
            )
            .await;
        (history, audit)
    }

    async fn timed(
        &self,
        op: &str,
        call: impl std::future::Future<Output = crate::store::StoreResult<u64>>,
    ) -> u64 {
        let started = std::time::Instant::now();
        let res = tokio::time::timeout(self.cfg.timeout, call).await;
        let secs = started.elapsed().as_secs_f64();
        match res {
            Ok(Ok(n)) => {
                self.metrics.store_op(op, "ok", secs);
                if n > 0 {
                    tracing::info!(deleted = n, op, "retention: deleted old records");
                }
                n
            }
            Ok(Err(e)) => {
                self.metrics.store_op(op, "error", secs);
                tracing::warn!(error = %e, op, "retention sweep failed; retried next interval");
                0
            }
            Err(_) => {
                self.metrics.store_op(op, "timeout", secs);
                tracing::warn!(op, "retention sweep timed out; retried next interval");
                0
            }
        }
    }

    /// Sweeps every interval until `shutdown` turns true.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.interval) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            self.sweep().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::audit::{AuditEntry, AuditQuery};
    use crate::store::embedded::EmbeddedStore;
    use crate::store::history::{Counts, Step, UsageDelta, DAY_MS};

    const DAY0: i64 = 1_795_392_000_000; // 2026-11-23T00:00:00Z

    fn entry(at: i64) -> AuditEntry {
        AuditEntry {
            at: chrono::DateTime::from_timestamp_millis(at).unwrap(),
            id: format!("{at:016x}"),
            actor: "ops".into(),
            role: "admin".into(),
            action: "quota.put".into(),
            tenant: "acme".into(),
            client: None,
            version_before: None,
            version_after: Some(1),
            body_before: None,
            body_after: Some("{}".into()),
            request_id: "r".into(),
        }
    }

    #[tokio::test]
    async fn a_sweep_deletes_exactly_what_is_older_than_each_retention() {
        let dir = tempfile::tempdir().unwrap();
        let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
        // History and audit on day 0, 10 and 20.
        for d in [0, 10, 20] {
            let counts = Counts {
                admitted: 1,
                cost: 1,
                ..Counts::default()
            };
            let delta = UsageDelta {
                tenant: "acme".into(),
                client: "k".into(),
                hour: DAY0 + d * DAY_MS,
                counts,
                cost_returned: 0,
            };
            store.add_usage(&[delta]).await.unwrap();
            store.append_audit(&entry(DAY0 + d * DAY_MS)).await.unwrap();
        }
        let clock = ManualClock::new(DAY0 + 25 * DAY_MS);
        let r = Retention::new(
            store.clone(),
            Arc::new(clock),
            Arc::new(Metrics::new(false)),
            RetentionConfig {
                history: Duration::from_millis(12 * DAY_MS as u64), // keeps day 20
                audit: Duration::from_millis(20 * DAY_MS as u64),   // keeps days 10 and 20
                interval: Duration::from_secs(60),
                budget: 1000,
                timeout: Duration::from_secs(5),
            },
        );
        let (h, a) = r.sweep().await;
        assert!(h > 0 && a > 0, "{h} {a}");
        let days: Vec<i64> = store
            .usage_points("acme", Some("k"), Step::Day, DAY0, DAY0 + 30 * DAY_MS)
            .await
            .unwrap()
            .iter()
            .map(|p| (p.start - DAY0) / DAY_MS)
            .collect();
        assert_eq!(days, [20]);
        let q = AuditQuery {
            tenant: None,
            from: 0,
            to: DAY0 + 30 * DAY_MS,
            before: None,
            limit: 10,
        };
        let left: Vec<i64> = store
            .audit_page(&q)
            .await
            .unwrap()
            .iter()
            .map(|e| (e.at.timestamp_millis() - DAY0) / DAY_MS)
            .collect();
        assert_eq!(left, [20, 10]);
    }
}
