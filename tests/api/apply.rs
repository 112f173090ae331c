//! Policies as files: `quotad apply` and `quotad export`, run as the real binary on an embedded
//! store, then read back by a server on the same store.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use serde_json::json;

use crate::helpers::*;

const FILE: &str = "\
tenants:
  acme:
    limits:
      - {id: per-second, max: 3, window: 1s}
      - {id: monthly, max: 1000, period: month}
    clients:
      vip:
        limits:
          - {id: per-second, max: 50, window: 1s}
  globex:
    mode: dry_run
    limits:
      - {id: daily, max: 5000, period: day}
      - {id: api, burst: 50, rate: 10}
";

fn quotad(store: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_quotad"))
        .args(args)
        .env("QUOTAD__STORE__PATH", store)
        .env("QUOTAD__LOG__LEVEL", "warn")
        .env("USER", "ci-bot")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test]
async fn a_file_applied_twice_changes_nothing_the_second_time_and_a_dry_run_shows_an_edit() {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let store = dir.path().join("store");
    let file = dir.path().join("quotas.yaml");
    std::fs::write(&file, FILE).unwrap();
    let f = file.to_str().unwrap();

    let first = quotad(&store, &["apply", "-f", f], None);
    assert!(first.status.success(), "{first:?}");
    let out = text(&first);
    for line in [
        "acme: policy added",
        "acme/vip: override added",
        "globex: policy added",
        "3 change(s) applied",
    ] {
        assert!(out.contains(line), "{line} in:\n{out}");
    }
    let second = quotad(&store, &["apply", "-f", f], None);
    assert!(second.status.success());
    assert_eq!(text(&second), "no changes\n");

    // An edited file: the dry run shows the diff per tenant and changes nothing.
    let edited = FILE
        .replace("max: 3, window: 1s", "max: 5, window: 1s")
        .replace("      - {id: monthly, max: 1000, period: month}\n", "")
        .replace("max: 5000", "max: 6000");
    std::fs::write(&file, &edited).unwrap();
    let dry = quotad(&store, &["apply", "-f", f, "--dry-run"], None);
    assert!(dry.status.success());
    let out = text(&dry);
    let want = "acme: policy changed\n  \
        ~ limits[per-second]: {\"id\":\"per-second\",\"max\":3,\"window\":\"1s\",\"scope\":\"client\"} \
        -> {\"id\":\"per-second\",\"max\":5,\"window\":\"1s\",\"scope\":\"client\"}\n  \
        - limits[monthly]\n\
        globex: policy changed\n  \
        ~ limits[daily]: {\"id\":\"daily\",\"max\":5000,\"period\":\"day\",\"scope\":\"client\"} \
        -> {\"id\":\"daily\",\"max\":6000,\"period\":\"day\",\"scope\":\"client\"}\n\
        dry run: 2 change(s), nothing applied\n";
    assert_eq!(out, want);
    assert_eq!(
        text(&quotad(&store, &["apply", "-f", f, "--dry-run"], None)),
        want
    );

    // What export writes, apply reads back as no change (YAML and JSON).
    let yaml = text(&quotad(&store, &["export"], None));
    let back = quotad(&store, &["apply", "-f", "-", "--dry-run"], Some(&yaml));
    assert_eq!(text(&back), "no changes\n", "{yaml}");
    let json_file = dir.path().join("all.json");
    std::fs::write(
        &json_file,
        text(&quotad(&store, &["export", "--format", "json"], None)),
    )
    .unwrap();
    let back = quotad(&store, &["apply", "-f", json_file.to_str().unwrap()], None);
    assert_eq!(text(&back), "no changes\n");

    // --prune removes what the file no longer names.
    std::fs::write(
        &file,
        "tenants:\n  acme:\n    limits: [{id: per-second, max: 3, window: 1s}]\n",
    )
    .unwrap();
    let pruned = quotad(&store, &["apply", "-f", f, "--prune"], None);
    let out = text(&pruned);
    assert!(
        out.contains("acme/vip: override removed") && out.contains("globex: policy removed"),
        "{out}"
    );

    // A server on the store enforces what was applied, and the audit log names the operator.
    let app = spawn_in(dir.clone(), |s| s.store.path = store.clone()).await;
    let r = app.admin_get("/v1/quotas/acme").await;
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (v["version"].as_u64(), v["limits"].as_array().map(Vec::len)),
        (Some(2), Some(1)),
        "{v}"
    );
    assert_eq!(app.admin_get("/v1/quotas/globex").await.status(), 404);
    let audit = app.get_json("/v1/audit?tenant=acme").await;
    let first = &audit["entries"][0];
    assert_eq!(
        (first["actor"].as_str(), first["role"].as_str()),
        (Some("cli:ci-bot"), Some("operator")),
        "{audit}"
    );
    let statuses: Vec<u16> = {
        let mut s = Vec::new();
        for _ in 0..4 {
            s.push(
                app.check(json!({"tenant": "acme", "client": "k"}))
                    .await
                    .status()
                    .as_u16(),
            );
        }
        s
    };
    assert_eq!(statuses, [200, 200, 200, 429]);
    app.stop().await;
}

#[test]
fn errors_name_the_file_the_tenant_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    for (body, want) in [
        (
            "tenants:\n  acme:\n    limits: [{id: x, max: 0, window: 1s}]\n",
            "q.yaml: tenants.acme.limits[0].max:",
        ),
        (
            "tenants:\n  acme:\n    limits: [{id: x, max: 1, windw: 1s}]\n",
            "q.yaml: tenants.acme.limits[0]: unknown field `windw`",
        ),
        (
            "tenants:\n  acme:\n    clients:\n      vip:\n        limits: [{id: x, max: 1, window: 1s, scope: tenant}]\n",
            "q.yaml: tenants.acme.clients.vip.limits[0].scope:",
        ),
        ("tenants:\n  'a b':\n    limits: []\n", "q.yaml: tenants.a b:"),
    ] {
        let f = dir.path().join("q.yaml");
        std::fs::write(&f, body).unwrap();
        let o = quotad(&store, &["apply", "-f", f.to_str().unwrap()], None);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{body}: {err}");
        assert!(err.contains(want), "{body}: {err}");
    }
}
