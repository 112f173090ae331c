use super::*;
use crate::store::embedded::encode;
use crate::store::history::{counts, HOUR_MS};
use redb::ReadableTableMetadata;

#[test]
fn binary_counts_read_back_as_written_and_reject_damage() {
    let mut buf = Vec::new();
    for c in [
        Counts::default(),
        counts(40, 45, 0, &[]),
        counts(u64::MAX, 1 << 63, 127, &[("per-second", 128), ("", 0)]),
        counts(1, 2, 3, &[("ü:limit~1", u64::MAX)]),
    ] {
        encode_counts(&c, &mut buf);
        assert_ne!(buf[0], b'{', "a binary row must not look like JSON");
        assert_eq!(decode_counts(&buf).unwrap(), c);
        // Cut short anywhere, or with a byte more, the row is refused, not misread.
        for cut in 0..buf.len() {
            assert!(decode_counts(&buf[..cut]).is_err(), "{c:?} cut at {cut}");
        }
        let mut longer = buf.clone();
        longer.push(0);
        assert!(decode_counts(&longer).is_err());
    }
    assert_eq!(
        decode_counts(br#"{"admitted":3,"cost":4,"denied":1,"denied_by":{"x":1}}"#).unwrap(),
        counts(3, 4, 1, &[("x", 1)])
    );
    assert!(decode_counts(&[2, 0, 0, 0, 0]).is_err());
    // A varint of more than 64 bits, by its length or by its tenth byte, is refused; one
    // of 64 reads whole.
    let zeros = [0u8; 3];
    for (tenth, ok) in [(0x01, true), (0x02, false), (0x81, false)] {
        let mut row = vec![1u8];
        row.extend([0xff; 9]);
        row.push(tenth);
        row.extend(if tenth == 0x81 {
            &[0x01][..]
        } else {
            &zeros[..]
        });
        assert_eq!(decode_counts(&row).is_ok(), ok, "tenth byte {tenth:#x}");
        if ok {
            assert_eq!(decode_counts(&row).unwrap().admitted, u64::MAX);
        }
    }
}

/// A store an earlier release wrote holds JSON rows and a day point per client: it reads
/// the same, takes new usage on top, and its janitor deletes the old rows too.
#[test]
fn history_an_earlier_release_wrote_reads_and_adds_up() {
    let day = 1_795_392_000_000; // 2026-11-23T00:00:00Z
    let (h1, h2) = (day + HOUR_MS, day + 2 * HOUR_MS);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::new(redb::Database::create(dir.path().join("t.redb")).unwrap());
    let tx = db.begin_write().unwrap();
    create_tables(&tx).unwrap();
    tx.commit().unwrap();
    let store = History::new(db);
    {
        // As the earlier release wrote a round of client c in hour h1.
        let old = counts(5, 6, 2, &[("per-minute", 2)]);
        let plain = counts(5, 6, 2, &[]);
        let tx = store.db.begin_write().unwrap();
        {
            let mut usage = tx.open_table(USAGE).unwrap();
            for (subject, step, start) in [
                ("c", Step::Hour, h1),
                ("c", Step::Day, day),
                (TENANT_SUBJECT, Step::Hour, h1),
                (TENANT_SUBJECT, Step::Day, day),
            ] {
                let k = point_key("t", subject, step, start);
                usage
                    .insert(k.as_slice(), encode(&old).unwrap().as_slice())
                    .unwrap();
            }
            let mut index = day_prefix("t", day);
            index.extend_from_slice(b"c");
            tx.open_table(USAGE_CLIENTS)
                .unwrap()
                .insert(index.as_slice(), encode(&plain).unwrap().as_slice())
                .unwrap();
            tx.open_table(USAGE_DAYS)
                .unwrap()
                .insert(day_row(day, "t").as_slice(), ())
                .unwrap();
        }
        tx.commit().unwrap();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let delta = |hour, c| UsageDelta {
        tenant: "t".into(),
        client: "c".into(),
        hour,
        counts: c,
        cost_returned: 0,
    };
    rt.block_on(store.add(&[
        delta(h1, counts(1, 1, 1, &[("per-minute", 1)])),
        delta(h2, counts(10, 20, 0, &[])),
    ]))
    .unwrap();
    let points = |client, step| {
        rt.block_on(store.points("t", client, step, day, day + DAY_MS))
            .unwrap()
    };
    let at = |start, counts| UsagePoint { start, counts };
    assert_eq!(
        points(Some("c"), Step::Hour),
        vec![
            at(h1, counts(6, 7, 3, &[("per-minute", 3)])),
            at(h2, counts(10, 20, 0, &[]))
        ]
    );
    let whole_day = vec![at(day, counts(16, 27, 3, &[("per-minute", 3)]))];
    assert_eq!(points(Some("c"), Step::Day), whole_day);
    assert_eq!(points(None, Step::Day), whole_day);
    // A range that holds no day start has no day point, though it holds hours.
    assert!(rt
        .block_on(store.points("t", Some("c"), Step::Day, day + 1, day + DAY_MS))
        .unwrap()
        .is_empty());
    let seen = rt
        .block_on(store.clients_seen("t", day, day + DAY_MS))
        .unwrap();
    assert_eq!((seen.len(), seen[0].admitted, seen[0].denied), (1, 16, 3));
    // The rows added to are binary now; the old client day point is as it was.
    {
        let tx = store.db.begin_read().unwrap();
        let usage = tx.open_table(USAGE).unwrap();
        let first = |k: Vec<u8>| usage.get(k.as_slice()).unwrap().unwrap().value()[0];
        assert_eq!(first(point_key("t", "c", Step::Hour, h1)), COUNTS_V1);
        assert_eq!(first(point_key("t", "c", Step::Day, day)), b'{');
    }
    // The janitor deletes the day whole, the earlier release's rows included.
    let removed = rt
        .block_on(store.delete_before(day + 2 * DAY_MS, 100))
        .unwrap();
    assert_eq!(
        removed, 7,
        "3 client points, 3 tenant points, an index line"
    );
    let tx = store.db.begin_read().unwrap();
    assert_eq!(tx.open_table(USAGE).unwrap().len().unwrap(), 0);
    assert_eq!(tx.open_table(USAGE_CLIENTS).unwrap().len().unwrap(), 0);
}
