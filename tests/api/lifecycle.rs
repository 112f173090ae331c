//! Start, stop, restart: counts survive, SIGTERM drains, operations endpoints answer.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn a_restart_on_the_same_data_directory_keeps_every_count() {
    let app = spawn_with(|s| s.sync.interval_ms = quotad::config::DurationMs(60_000)).await;
    app.put_quota(
        "acme",
        json!({"limits": [
            {"id": "daily", "max": 10, "period": "day"},
            {"id": "sliding", "max": 10, "window": "1h"},
            {"id": "shared", "max": 50, "period": "day", "scope": "tenant"}]}),
    )
    .await;
    for _ in 0..7 {
        assert_eq!(app.check_json("acme", "k1").await.0, 200);
    }
    // The sync interval is a minute: only the shutdown drain can have written these.
    let (unsynced, dir) = app.stop().await;
    assert_eq!(unsynced, 0);

    let app = spawn_in(dir, |_| {}).await;
    let u = app.usage("acme", "k1").await;
    let counts: Vec<_> = u["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["count"].clone())
        .collect();
    assert_eq!(counts, [json!(7), json!(7), json!(7)], "{u}");
    for _ in 0..3 {
        assert_eq!(app.check_json("acme", "k1").await.0, 200);
    }
    let (s, b) = app.check_json("acme", "k1").await;
    assert_eq!(s, 429, "{b}");
}

#[tokio::test]
async fn health_readiness_and_metrics_answer() {
    let app = spawn_app().await;
    let r = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // The embedded store is a fleet of one: shard 0, one member, in the answer and the metrics;
    // its clock is the only one, which it cuts buckets on.
    let ready: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        ready,
        json!({"status": "ready", "store": "embedded", "shard": 0, "members": 1,
               "clock": {"source": "local"}})
    );
    assert_eq!(app.metric("quotad_fleet_members").await, 1.0);
    assert_eq!(app.metric("quotad_clock_offset_seconds").await, 0.0);
    assert_eq!(
        app.metric("quotad_clock_offset_uncertainty_seconds").await,
        0.0
    );
    assert_eq!(app.metric("quotad_instance_info{shard=\"0\"}").await, 1.0);
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "d", "max": 1, "period": "day"}]}),
    )
    .await;
    app.check_json("acme", "secret-client").await;
    app.check_json("acme", "secret-client").await;
    // After a sync round: the hits written, the gauges set.
    let text = eventually("a sync round's metrics", || async {
        let text = app.metrics_text().await;
        (text.contains("quotad_sync_pending_hits 0")
            && text.contains("quotad_active_counters 1")
            && text.contains("quotad_store_operations_total{op=\"increment\",outcome=\"ok\"}")
            // A scrape gathers the families one by one, in name order: one that ran while
            // the round's first write was recorded can show its count and not its duration.
            && text.contains("quotad_store_operation_duration_seconds_bucket{op=\"increment\""))
        .then_some(text.clone())
        .ok_or(text)
    })
    .await;
    for name in [
        "quotad_checks_total{decision=\"allowed\"} 1",
        "quotad_checks_total{decision=\"denied\"} 1",
        "quotad_check_duration_seconds_bucket",
        "quotad_store_operations_total{op=\"increment\",outcome=\"ok\"}",
        "quotad_store_operation_duration_seconds_bucket{op=\"increment\"",
        "quotad_sync_pending_hits 0",
        "quotad_active_counters 1",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
    assert!(
        !text.contains("secret-client") && !text.contains("acme"),
        "ids became labels"
    );
}

#[tokio::test]
async fn readyz_is_503_while_the_store_fails() {
    use quotad::store::faulty::{Fault, FaultyStore};
    let dir = tempfile::tempdir().unwrap();
    let inner: quotad::store::DynStore =
        std::sync::Arc::new(quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap());
    let faulty = FaultyStore::new(inner);
    let app = spawn_on_store(faulty.clone(), |_| {}).await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "d", "max": 2, "period": "day"}]}),
    )
    .await;
    faulty.set(Fault::Failing);
    let r = app.http.get(app.url("/readyz")).send().await.unwrap();
    let body = assert_error(r, 503, "unavailable").await;
    // The store's own words ("injected failure" here; hosts and driver errors on a cluster)
    // are for the log, not for an unauthenticated caller.
    assert!(!body.to_string().contains("injected failure"), "{body}");
    // Checks keep answering (the default rule: enforce locally).
    assert_eq!(app.check_json("acme", "k").await.0, 200);
    assert_eq!(app.check_json("acme", "k").await.0, 200);
    assert_eq!(app.check_json("acme", "k").await.0, 429);
    faulty.set(Fault::Healthy);
    assert_eq!(
        app.http
            .get(app.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let (unsynced, _dir) = app.stop().await;
    assert_eq!(unsynced, 0);
}

/// The real binary: serves with nothing set up but a data directory, drains on SIGTERM and
/// exits 0, and a second run sees every count.
#[test]
fn the_binary_drains_on_sigterm_and_a_second_run_sees_the_counts() {
    let dir = tempfile::tempdir().unwrap();
    let run = || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_quotad"))
            .current_dir(dir.path())
            .env("QUOTAD__SERVER__BIND", "127.0.0.1:0")
            .env("QUOTAD__AUTH__ADMIN_TOKEN", ADMIN)
            .env("QUOTAD__SYNC__INTERVAL_MS", "10m")
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        // Read the log on a thread so a silent child fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(i) = line.find("port=") {
                    let p: String = line[i + 5..]
                        .chars()
                        .take_while(|c| c.is_ascii_digit())
                        .collect();
                    let _ = tx.send(p.parse::<u16>().ok());
                }
            }
            let _ = tx.send(None);
        });
        let port = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Some(p)) => p,
            other => {
                let _ = child.kill();
                panic!("quotad did not report its port: {other:?}");
            }
        };
        (child, format!("http://127.0.0.1:{port}"))
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();

    let (mut child, base) = run();
    assert!(
        dir.path().join("data").join("quotad.redb").exists(),
        "store under ./data"
    );
    // The serving process turns transparent huge pages off for itself (src/os/memory.rs); kernels
    // since 6.x say so in /proc/<pid>/status.
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        if let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
            assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
        }
    }
    rt.block_on(async {
        let r = http
            .put(format!("{base}/v1/quotas/acme"))
            .bearer_auth(ADMIN)
            .json(&json!({"limits": [{"id": "d", "max": 5, "period": "day"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        for _ in 0..4 {
            let r = http
                .post(format!("{base}/v1/check"))
                .json(&json!({"tenant": "acme", "client": "k"}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    });
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "exit 0 after draining");

    let (mut child, base) = run();
    rt.block_on(async {
        let check = || {
            http.post(format!("{base}/v1/check"))
                .json(&json!({"tenant": "acme", "client": "k"}))
                .send()
        };
        assert_eq!(check().await.unwrap().status(), 200, "the 5th");
        assert_eq!(
            check().await.unwrap().status(),
            429,
            "4 survived the restart"
        );
    });
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[tokio::test]
async fn a_batch_counts_its_checks_in_the_metrics_as_single_checks_do() {
    let app = spawn_app().await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "d", "max": 2, "period": "day"}]}),
    )
    .await;
    let r = app
        .http
        .post(app.url("/v1/check/batch"))
        .json(&json!({"checks": [
            {"tenant": "acme", "client": "k1"},
            {"tenant": "acme", "client": "k1"},
            {"tenant": "acme", "client": "k1"},
            {"tenant": "nobody", "client": "k1"},
            {"tenant": "acme", "client": "k2"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let b: serde_json::Value = r.json().await.unwrap();
    let allowed: Vec<_> = b["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["allowed"].clone())
        .collect();
    assert_eq!(
        allowed,
        [
            json!(true),
            json!(true),
            json!(false),
            json!(null),
            json!(true)
        ],
        "{b}"
    );
    assert_eq!(b["results"][3]["error"]["code"], "not_found", "{b}");
    // Summed over the batch and added once: 3 allowed, 1 denied, 4 timed; the tenant
    // without a quota decided nothing.
    assert_eq!(
        app.metric("quotad_checks_total{decision=\"allowed\"}")
            .await,
        3.0
    );
    assert_eq!(
        app.metric("quotad_checks_total{decision=\"denied\"}").await,
        1.0
    );
    assert_eq!(app.metric("quotad_check_duration_seconds_count").await, 4.0);
}
