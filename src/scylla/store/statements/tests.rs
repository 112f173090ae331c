//! The table of statements checked against the migrations' schema, without a server.

use super::*;
use crate::scylla::cql::schema_check::{check, names, parse_tables, SchemaTable};
use crate::scylla::migrate;

fn schema() -> Vec<SchemaTable> {
    let statements: Vec<String> = migrate::migrations()
        .unwrap()
        .iter()
        .flat_map(|m| migrate::split_statements(m.text))
        .collect();
    parse_tables(&statements)
}

#[test]
fn the_schema_parser_reads_the_migrations() {
    let tables = schema();
    let counters = tables.iter().find(|t| t.name == "counters").unwrap();
    assert_eq!(
        counters.partition_key,
        ["tenant", "subject", "limit_id", "grain", "epoch", "shard"]
    );
    assert_eq!(counters.clustering, ["bucket_start"]);
    let clients = tables.iter().find(|t| t.name == "client_counters").unwrap();
    assert_eq!(clients.partition_key, ["tenant", "subject"]);
    assert_eq!(
        clients.clustering,
        ["bucket_start", "limit_id", "grain", "shard"]
    );
    assert_eq!(clients.column_type("hits"), Some("counter"));
    assert_eq!(counters.column_type("hits"), Some("counter"));
    let gen = tables
        .iter()
        .find(|t| t.name == "policy_generation")
        .unwrap();
    assert_eq!(gen.partition_key, ["id"]);
    let pol = tables.iter().find(|t| t.name == "policies").unwrap();
    assert_eq!(pol.partition_key, ["part"]);
    assert_eq!(pol.clustering, ["kind", "tenant", "client"]);
    let hist = tables.iter().find(|t| t.name == "usage_history").unwrap();
    assert_eq!(hist.partition_key, ["tenant", "subject", "month"]);
    assert_eq!(hist.clustering, ["step", "start", "field"]);
    let audit = tables.iter().find(|t| t.name == "audit_log").unwrap();
    assert_eq!(audit.partition_key, ["scope", "month"]);
    assert_eq!(audit.clustering, ["at", "id"]);
    assert_eq!(audit.column_type("at"), Some("timestamp"));
}

#[test]
fn no_column_or_table_is_a_reserved_cql_word() {
    // ScyllaDB's and Cassandra's reserved keywords (a column named `limit` would fail).
    const RESERVED: &[&str] = &[
        "add",
        "allow",
        "alter",
        "and",
        "apply",
        "asc",
        "authorize",
        "batch",
        "begin",
        "by",
        "columnfamily",
        "create",
        "default",
        "delete",
        "desc",
        "describe",
        "drop",
        "entries",
        "execute",
        "for",
        "from",
        "full",
        "grant",
        "if",
        "in",
        "index",
        "infinity",
        "insert",
        "into",
        "is",
        "keyspace",
        "keyspaces",
        "limit",
        "materialized",
        "mbean",
        "mbeans",
        "modify",
        "nan",
        "norecursive",
        "not",
        "null",
        "of",
        "on",
        "or",
        "order",
        "primary",
        "rename",
        "replace",
        "revoke",
        "schema",
        "select",
        "set",
        "table",
        "to",
        "token",
        "truncate",
        "unlogged",
        "unset",
        "update",
        "use",
        "using",
        "view",
        "where",
        "with",
    ];
    for t in schema() {
        assert!(!RESERVED.contains(&t.name.as_str()), "table {}", t.name);
        for (c, _) in &t.columns {
            assert!(!RESERVED.contains(&c.as_str()), "{}.{c}", t.name);
        }
    }
}

#[test]
fn every_statement_matches_the_schema_and_the_bound_types() {
    let tables = schema();
    for Entry {
        name,
        cql,
        binds,
        row,
    } in catalog()
    {
        if let Err(e) = check(&tables, cql, &binds, row.as_deref()) {
            panic!("{name}: {e}\n{cql}");
        }
    }
}

#[test]
fn the_checker_catches_wrong_statements() {
    let tables = schema();
    let inc = names::<IncrementValues<'static>>();
    // A missing partition-key column (no routing, and the server refuses it).
    let no_subject = INCREMENT_CQL.replace(" AND subject = ?", "");
    let mut short = inc.clone();
    short.remove(2);
    let e = check(&tables, &no_subject, &short, None).unwrap_err();
    assert!(e.contains("partition-key column subject"), "{e}");
    // A misspelt column.
    let typo = INCREMENT_CQL.replace("limit_id", "limitid");
    let e = check(&tables, &typo, &inc, None).unwrap_err();
    assert!(e.contains("no column limitid"), "{e}");
    // Binding an i64 where the schema has a smallint.
    let mut wrong = inc.clone();
    wrong[6] = "bigint";
    let e = check(&tables, INCREMENT_CQL, &wrong, None).unwrap_err();
    assert!(e.contains("markers bind"), "{e}");
    // Counter tables refuse TTLs and INSERT.
    let ttl = INCREMENT_CQL.replace("SET", "USING TTL 60 SET");
    assert!(check(&tables, &ttl, &inc, None).is_err());
    // A multi-column slice binds its columns in order.
    let cursor = names::<ReadAuditBeforeValues<'static>>();
    check(
        &tables,
        READ_AUDIT_BEFORE_CQL,
        &cursor,
        Some(&names::<AuditRow>()),
    )
    .unwrap();
    let swapped = READ_AUDIT_BEFORE_CQL.replace("(at, id) < (?, ?)", "(id, at) < (?, ?)");
    let e = check(&tables, &swapped, &cursor, Some(&names::<AuditRow>())).unwrap_err();
    assert!(e.contains("markers bind"), "{e}");
    // A row type that does not match the selection.
    assert!(check(
        &tables,
        LEGACY_READ_BUCKETS_CQL,
        &names::<ReadBucketsValues<'static>>(),
        Some(&["bigint", "bigint"])
    )
    .is_err());
}

#[test]
fn the_table_names_each_statement_once() {
    let mut seen: Vec<&str> = catalog().iter().map(|e| e.name).collect();
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n);
}
