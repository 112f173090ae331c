//! The console's accessibility, in a real headless Chromium: axe-core (vendored from npm into
//! `console/vendor/`, never served) runs on every page, 1280 and 800 pixels wide, and must find
//! no serious or critical violation of WCAG 2.1 A and AA; at 800 pixels no page scrolls
//! sideways. `#[ignore]`d, as `console.rs`'s browser test is, and failed where Chromium is missing.

use serde_json::{json, Value};

use crate::console::Browser;
use crate::helpers::*;

const AXE: &str = include_str!("../../console/vendor/axe.min.js");

/// Runs axe on the page as it is; returns its serious and critical violations, one line each.
async fn violations(b: &Browser) -> Vec<String> {
    if b.script("return typeof axe").await != json!("object") {
        b.script(&format!("{AXE}\n;return 1;")).await;
    }
    let found = b
        .script_async(
            "
                const done = arguments[arguments.length - 1];
                axe.run(document, {runOnly: {type: 'tag',
                        values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}})
                  .then(r => done(r.violations
                    .filter(v => v.impact === 'serious' || v.impact === 'critical')
                    .map(v => v.impact + ' ' + v.id + ': ' + v.help + ' at '
                         + v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', '))))
                  .catch(e => done(['axe failed: ' + e]));",
        )
        .await;
    match found {
        Ok(Value::Array(v)) => v
            .iter()
            .map(|s| s.as_str().unwrap_or("?").to_owned())
            .collect(),
        Ok(other) => vec![format!("axe did not answer: {other}")],
        Err(e) => vec![format!("axe did not answer: {e}")],
    }
}

/// Whether the page is wider than the window (it scrolls sideways).
async fn scrolls_sideways(b: &Browser) -> bool {
    b.script(
        "return document.documentElement.scrollWidth > document.documentElement.clientWidth + 1",
    )
    .await
        == json!(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver: cargo test --test api console -- --ignored (as .ci/run does)"]
async fn every_console_page_passes_axe_at_1280_and_800_pixels() {
    let app = spawn_app().await;
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [
                {"id": "per-minute", "max": 5, "window": "1m"},
                {"id": "exports", "max": 2, "window": "1h", "scope": "tenant", "resource": "POST /exports"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    for _ in 0..6 {
        app.check_json("acme", "k1").await;
    }
    app.history_reaches("acme", "k1", 5, 1).await;
    let b = Browser::start().await;
    // Each page, and what shows it has loaded.
    let pages = [
        ("/console/#/signin", "#signin"),
        ("/console/#/tenants", "#tenants tr"),
        ("/console/#/tenants/acme", "#nearest tr"),
        ("/console/#/tenants/acme/clients/k1", "#usage tr"),
        ("/console/#/audit", "#audit-entries tr"),
    ];
    let mut found = Vec::new();
    for width in [1280, 800] {
        b.resize(width, 1000).await;
        for (i, (path, ready)) in pages.iter().enumerate() {
            if i == 1 && width == 1280 {
                // Signed in once, after the sign-in page was looked at.
                b.type_into("#token", ADMIN).await;
                b.click("#signin-submit").await;
            }
            b.go(&app.url(path)).await;
            b.wait(ready).await;
            for v in violations(&b).await {
                found.push(format!("{path} at {width} px: {v}"));
            }
            if scrolls_sideways(&b).await {
                found.push(format!("{path} at {width} px scrolls sideways"));
            }
            if width == 800 {
                let name = format!("a11y-800-{}", path.rsplit('/').next().unwrap_or("page"));
                b.screenshot(&name).await;
            }
        }
    }
    b.quit().await;
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Navigation a support desk leans on: pages of tenants both ways, each tenant's refusals of
/// the day in the list, many overrides folded away, the busiest clients, and a title a page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver: cargo test --test api console -- --ignored (as .ci/run does)"]
async fn the_console_pages_both_ways_and_folds_what_is_long() {
    let app = spawn_app().await;
    let limits = json!({"limits": [{"id": "daily", "max": 2, "period": "day"}]});
    // 55 tenants: the list shows 50 a page.
    for i in 0..55 {
        let r = app.put_quota(&format!("t{i:02}"), limits.clone()).await;
        assert_eq!(r.status(), 201);
    }
    for _ in 0..3 {
        app.check_json("t00", "k1").await;
    }
    app.history_reaches("t00", "k1", 2, 1).await;
    for i in 0..12 {
        let path = format!("/v1/quotas/t00/clients/c{i:02}");
        let r = app
            .http
            .put(app.url(&path))
            .bearer_auth(ADMIN)
            .json(&limits)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let b = Browser::start().await;
    b.go(&app.url("/console/")).await;
    b.type_into("#token", ADMIN).await;
    b.click("#signin-submit").await;
    let today = b
        .wait_text("#tenants tr[data-tenant='t00'] .today", "refused")
        .await;
    assert_eq!(today, "2 admitted, 1 refused");
    let title = b.script("return document.title").await;
    assert_eq!(title, json!("Tenants · quotad console"));
    b.click("#next").await;
    b.wait_text("#tenants", "t54").await;
    assert!(!b.text("#tenants").await.contains("t00"));
    b.click("#previous").await;
    b.wait_text("#tenants", "t00").await;
    assert!(
        b.find("#previous").await.is_none(),
        "the first page has no previous"
    );
    // A tenant with 12 overrides shows 10, and the rest on demand.
    b.go(&app.url("/console/#/tenants/t00")).await;
    b.wait("#overrides tr").await;
    let shown = b
        .script(
            "return [...document.querySelectorAll('#overrides tr')].filter(r => !r.hidden).length",
        )
        .await;
    assert_eq!(shown, json!(10));
    b.click("#all-overrides").await;
    let shown = b
        .script(
            "return [...document.querySelectorAll('#overrides tr')].filter(r => !r.hidden).length",
        )
        .await;
    assert_eq!(shown, json!(12));
    let top = b.wait_text("#top", "k1").await;
    assert!(top.contains("k1 2 2 1"), "{top}");
    assert_eq!(
        b.script("return document.title").await,
        json!("Tenant t00 · quotad console")
    );
    b.quit().await;
}
