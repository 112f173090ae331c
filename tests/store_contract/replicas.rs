//! A replica lost mid-round: a store on a cluster of three replicas writes rounds of
//! increments for many clients, as a sync task does, while one node is killed (and started
//! again) or paused. Scylla only, and on the nodes' machine: the node is
//! `QUOTAD_TEST_SCYLLA_VICTIM_PID`, `QUOTAD_TEST_SCYLLA_RESTART` the command that starts it
//! again after a kill and returns once it answers, and the keyspace is made with
//! `QUOTAD_TEST_SCYLLA_REPLICATION` (three replicas).
//!
//! What must hold: increments the store says it never sent are sent again (as the sync task
//! does), and once the node is back, every client's stored count is at least what landed and
//! at most that plus what was in doubt (nothing acknowledged lost, nothing counted twice); and
//! no more is in doubt than the updates the lost node could have led (Cassandra leads each
//! counter update on a random live replica) and one round in flight.

use super::stalls::{pid_from, signal};
use super::*;

const VICTIM_ENV: &str = "QUOTAD_TEST_SCYLLA_VICTIM_PID";
const RESTART_ENV: &str = "QUOTAD_TEST_SCYLLA_RESTART";
const CLIENTS: usize = 600;
const ROUNDS: usize = 60;
/// Rounds (of about 250 ms) the node is paused for.
const PAUSE_ROUNDS: usize = 20;

/// How the node is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// SIGKILL, then started again after the rounds.
    Kill,
    /// SIGSTOP for [`PAUSE_ROUNDS`] rounds, then SIGCONT.
    Pause,
}

fn victim() -> String {
    pid_from(VICTIM_ENV, "one node of a three-replica cluster")
}

fn restart() {
    let cmd = std::env::var(RESTART_ENV).unwrap_or_default();
    assert!(
        !cmd.is_empty(),
        "{RESTART_ENV} is not set: the command that starts the node again"
    );
    let ok = std::process::Command::new("sh")
        .args(["-c", &cmd])
        .status()
        .unwrap()
        .success();
    assert!(ok, "{cmd} failed");
}

fn key(i: usize) -> CounterKey {
    CounterKey {
        tenant: "replicas".into(),
        subject: format!("c{i}").into(),
        limit: "h".into(),
        grain: Grain::Fixed(3_600_000),
    }
}

pub async fn increments_outlive_a_replica_lost_mid_round(opts: &ScyllaOptions, loss: Loss) {
    let store = ScyllaStore::connect(opts.clone()).await.unwrap();
    join(&store, "replicas").await;
    let start = Grain::Fixed(3_600_000).bucket_start(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64,
    );
    let mut landed = vec![0i64; CLIENTS];
    let mut doubtful = vec![0i64; CLIENTS];
    let mut waiting = vec![0i64; CLIENTS];
    let pid = victim();
    for round in 0..ROUNDS {
        if round == ROUNDS / 4 {
            signal(&pid, if loss == Loss::Kill { "-KILL" } else { "-STOP" });
        }
        if loss == Loss::Pause && round == ROUNDS / 4 + PAUSE_ROUNDS {
            signal(&pid, "-CONT");
        }
        let deltas: Vec<Delta> = (0..CLIENTS)
            .map(|i| Delta {
                key: key(i),
                start,
                delta: 1 + waiting[i],
            })
            .collect();
        let parts = store.increment_parts(&deltas, None).await;
        let mut out = vec![0u8; CLIENTS];
        for &i in &parts.unsent {
            out[i] = 1;
        }
        for &i in &parts.doubtful {
            out[i] = 2;
        }
        for (i, d) in deltas.iter().enumerate() {
            match out[i] {
                0 => {
                    landed[i] += d.delta;
                    waiting[i] = 0;
                }
                1 => waiting[i] = d.delta,
                _ => {
                    doubtful[i] += d.delta;
                    waiting[i] = 0;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if loss == Loss::Kill {
        restart();
    }
    // What still waited is sent now that every node answers.
    let rest: Vec<Delta> = (0..CLIENTS)
        .filter(|&i| waiting[i] > 0)
        .map(|i| Delta {
            key: key(i),
            start,
            delta: waiting[i],
        })
        .collect();
    store.increment(&rest).await.unwrap();
    for i in 0..CLIENTS {
        landed[i] += waiting[i];
    }
    let ranges: Vec<CounterRange> = (0..CLIENTS)
        .map(|i| CounterRange {
            key: key(i),
            from: start,
            to: start,
        })
        .collect();
    let totals = store.read(&ranges).await.unwrap();
    let sent = (ROUNDS * CLIENTS) as i64;
    let in_doubt: i64 = doubtful.iter().sum();
    for (i, t) in totals.iter().enumerate() {
        let stored: i64 = t.iter().map(|b| b.total).sum();
        assert!(
            stored >= landed[i] && stored <= landed[i] + doubtful[i],
            "client {i}: stored {stored}, landed {}, in doubt {}",
            landed[i],
            doubtful[i]
        );
    }
    // Cassandra leads each counter update on a random replica its failure detector thinks
    // alive: while the node is lost (and not yet convicted), a third of the updates may be led
    // by it and come back in doubt, and one round may be in flight to it. More than that says
    // whole calls were left in doubt for one node.
    let lost_rounds = match loss {
        Loss::Kill => ROUNDS - ROUNDS / 4,
        Loss::Pause => PAUSE_ROUNDS,
    };
    let most = (CLIENTS * lost_rounds / 3 + CLIENTS) as i64;
    eprintln!("{in_doubt} of {sent} increments in doubt (at most {most})");
    assert!(
        in_doubt <= most,
        "{in_doubt} of {sent} increments in doubt: more than one node of three could lead"
    );
}
