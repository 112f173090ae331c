//! The operator files under deploy/ name only metrics quotad really exports: every `quotad_*`
//! series the Grafana dashboard queries and the Prometheus alerts watch exists on a running
//! quotad. (`promtool check rules` validates the alerts' syntax in .ci/run.)

use std::collections::BTreeSet;

use serde_json::json;

use crate::helpers::*;

/// The `quotad_*` metric families a file names (histogram series by their family's name).
fn metrics_named_in(path: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("quotad_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_lowercase() || bytes[end] == b'_') {
            end += 1;
        }
        let name = &text[start..end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| f.ends_with("_seconds")))
            .unwrap_or(name);
        out.insert(family.to_owned());
        i = end;
    }
    out
}

#[tokio::test]
async fn every_metric_the_dashboard_and_the_alerts_use_is_exported() {
    let dashboard = metrics_named_in("deploy/grafana/quotad.json");
    let alerts = metrics_named_in("deploy/prometheus/alerts.yml");
    assert!(
        dashboard.len() >= 10 && alerts.len() >= 8,
        "{dashboard:?} {alerts:?}"
    );

    let app = spawn_app().await;
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [{"id": "m", "max": 5, "window": "1m"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    app.check_json("acme", "k").await;
    // Store operations are exported from the first sync round on.
    let mut exported = BTreeSet::new();
    for _ in 0..100 {
        let text = app.metrics_text().await;
        exported = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .map(str::to_owned)
            .collect();
        if exported.contains("quotad_store_operations_total") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The regions' series exist once a fleet in several data centres has seen a region: here,
    // the metrics of such a fleet's instance.
    let regional = quotad::metrics::Metrics::new(false);
    regional.fleet().region("us", 2, Some((120, true)));
    for l in regional.render().lines() {
        if let Some(name) = l.strip_prefix("# TYPE quotad_region_") {
            exported.insert(format!("quotad_region_{}", name.split(' ').next().unwrap()));
        }
    }
    for (file, names) in [("the dashboard", &dashboard), ("the alerts", &alerts)] {
        let missing: Vec<&String> = names.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{file} uses metrics quotad does not export: {missing:?}"
        );
    }
}
