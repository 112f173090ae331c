//! The audit log: entries kept, paged newest first, by tenant and over all.

use super::*;

pub(crate) fn audit_entry(at: i64, id: &str, tenant: &str, n: u64) -> AuditEntry {
    AuditEntry {
        at: Utc.timestamp_millis_opt(at).unwrap(),
        id: id.into(),
        actor: format!("token-{}", n % 3),
        role: if n % 2 == 0 { "admin" } else { "tenant_admin" }.into(),
        action: ["quota.put", "quota.delete", "override.put"][(n % 3) as usize].into(),
        tenant: tenant.into(),
        client: (n % 3 == 2).then(|| format!("client-{n}")),
        version_before: (n % 4 != 0).then_some(n),
        version_after: (n % 3 != 1).then_some(n + 1),
        body_before: (n % 4 != 0).then(|| format!("{{\"limits\":[{n}],\"note\":\"it's\"}}")),
        body_after: (n % 3 != 1).then(|| "x".repeat(n as usize * 7)),
        request_id: format!("req-{n}"),
    }
}

/// Every page of a query, following the cursors; checks page sizes on the way: every page
/// but the last is full.
async fn all_pages(
    store: &dyn Store,
    tenant: Option<&str>,
    from: i64,
    to: i64,
    limit: usize,
) -> Vec<AuditEntry> {
    let mut out: Vec<AuditEntry> = Vec::new();
    let mut before: Option<AuditCursor> = None;
    let mut sizes = Vec::new();
    loop {
        let page = store
            .audit_page(&AuditQuery {
                tenant: tenant.map(str::to_owned),
                from,
                to,
                before: before.clone(),
                limit,
            })
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert!(sizes.len() < 10_000, "paging never ends");
        sizes.push(page.len());
        before = Some(page.last().unwrap().cursor());
        out.extend(page);
    }
    if let Some((_, full)) = sizes.split_last() {
        assert!(
            full.iter().all(|n| *n == limit),
            "short page before the end: {sizes:?}"
        );
    }
    out
}

/// Entries of two tenants over five days across a month end, several in one millisecond,
/// paged through one tenant and through all, against the expected order: `at` then `id`,
/// both descending, within `[from, to)`, without repeats or gaps across pages.
pub async fn audit_pages_newest_first(store: &dyn Store) {
    let start = ms("2023-10-29T00:00:00Z");
    let mut rng = Rng(77);
    let mut all = Vec::new();
    let mut t = start;
    for i in 0..40u64 {
        t += 1 + rng.below(3 * HOUR_MS as u64) as i64;
        // Up to three entries in the same millisecond, ids out of insertion order.
        for (j, tag) in ["k", "b", "x"]
            .iter()
            .enumerate()
            .take(1 + rng.below(3) as usize)
        {
            let tenant = if rng.below(2) == 0 { "aud-a" } else { "aud-b" };
            all.push(audit_entry(
                t,
                &format!("{tag}{i:03}"),
                tenant,
                i * 3 + j as u64,
            ));
        }
    }
    let end = t + 1;
    for e in &all {
        store.append_audit(e).await.unwrap();
    }
    let mut newest_first = all.clone();
    newest_first.sort_by_key(|e| std::cmp::Reverse(e.cursor()));
    let expect = |tenant: Option<&str>, from: i64, to: i64| -> Vec<AuditEntry> {
        newest_first
            .iter()
            .filter(|e| tenant.is_none_or(|t| e.tenant == t))
            .filter(|e| (from..to).contains(&e.at.timestamp_millis()))
            .cloned()
            .collect()
    };
    for (tenant, limit) in [
        (Some("aud-a"), 7),
        (Some("aud-b"), 1),
        (None, 5),
        (None, 1_000),
    ] {
        let got = all_pages(store, tenant, start, end, limit).await;
        assert_eq!(got, expect(tenant, start, end), "{tenant:?} by {limit}");
    }
    assert!(all_pages(store, Some("aud-none"), start, end, 10)
        .await
        .is_empty());
    // Bounds on entries that share a millisecond: `from` takes all of its millisecond, `to`
    // none of its.
    let shared: Vec<i64> = all
        .windows(2)
        .filter(|w| w[0].at == w[1].at)
        .map(|w| w[0].at.timestamp_millis())
        .collect();
    assert!(shared.len() >= 2, "the generator makes shared milliseconds");
    let (from, to) = (shared[0], *shared.last().unwrap());
    for (tenant, limit) in [(None, 4), (Some("aud-a"), 2)] {
        let got = all_pages(store, tenant, from, to, limit).await;
        assert_eq!(got, expect(tenant, from, to), "{tenant:?} [{from}, {to})");
        assert!(got.iter().all(|e| e.at.timestamp_millis() != to));
    }
    assert!(all_pages(store, None, to, to, 3).await.is_empty());
    // A cursor at or after `to` bounds nothing more; a cursor before `from` leaves nothing.
    let first = |before: Option<AuditCursor>, limit| AuditQuery {
        tenant: None,
        from: start,
        to: end,
        before,
        limit,
    };
    let later = AuditCursor {
        at_ms: end + 5,
        id: "z".into(),
    };
    assert_eq!(
        store.audit_page(&first(Some(later), 3)).await.unwrap(),
        expect(None, start, end)[..3]
    );
    let earlier = AuditCursor {
        at_ms: start,
        id: "a".into(),
    };
    assert!(store
        .audit_page(&first(Some(earlier), 3))
        .await
        .unwrap()
        .is_empty());
    assert!(store.audit_page(&first(None, 0)).await.unwrap().is_empty());
    // Appending an entry again changes nothing.
    store.append_audit(&all[0]).await.unwrap();
    assert_eq!(
        all_pages(store, None, start, end, 50).await,
        expect(None, start, end)
    );
}
