//! `quotad migrate`: creates the keyspace and applies `migrations/*.cql` in order.
//!
//! The files are compiled into the binary ([`MIGRATION_FILES`]), so the binary that serves is
//! the binary that knows the schema it needs. Each applied file is recorded in
//! `schema_migrations` (version, name, sha256 of the file's bytes, applied_at); a later run
//! applies only what is missing and refuses to run when a recorded file has changed since, or
//! when the keyspace holds a version this binary does not know (a newer binary migrated it).
//!
//! Conventions of the files (checked by the tests below):
//! - named `NNNN_name.cql` (at least four digits, lowercase name), applied by version;
//! - tables only, never a keyspace name, so `cqlsh -k <ks> -f <file>` applies one by hand;
//! - every statement `IF NOT EXISTS`: a file is recorded only after all its statements ran, so a
//!   run cut off half-way re-runs the whole file next time, and that must be harmless.
//!
//! The keyspace statement is the only CQL built from configuration: the keyspace name is
//! validated ([`validate_keyspace`]) and the replication map is parsed and re-rendered
//! ([`render_replication`]) so neither can carry anything but a name and a map.
//!
//! Run one migrator at a time: schema changes from two clients at once can leave the cluster
//! in schema disagreement. The compose file runs it once, before the instances start.

use std::io::Write;

use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError};
use scylla::value::CqlTimestamp;
use sha2::{Digest, Sha256};

use crate::store::scylla::ScyllaOptions;

/// Every migration file, in the binary. A test asserts this list is exactly `migrations/*.cql`.
pub const MIGRATION_FILES: &[(&str, &str)] = &[
    (
        "0001_counters.cql",
        include_str!("../migrations/0001_counters.cql"),
    ),
    (
        "0002_policies.cql",
        include_str!("../migrations/0002_policies.cql"),
    ),
];

/// The keyspace statement for people who create the keyspace by hand; the tests check that
/// [`create_keyspace_cql`] renders the same statement for the default options.
pub const KEYSPACE_FILE: &str = include_str!("../cql/keyspace.cql");

/// The bookkeeping table, created by the migrator itself (it must exist before any file runs).
pub const SCHEMA_MIGRATIONS_CQL: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (\
     version int PRIMARY KEY, name text, checksum text, applied_at timestamp)";
const SELECT_APPLIED_CQL: &str = "SELECT version, name, checksum FROM schema_migrations";
/// A lightweight transaction, so two migrators that raced both learn which record won.
const RECORD_CQL: &str = "INSERT INTO schema_migrations (version, name, checksum, applied_at) \
     VALUES (?, ?, ?, ?) IF NOT EXISTS";
const KEYSPACE_EXISTS_CQL: &str =
    "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?";
const TABLE_EXISTS_CQL: &str =
    "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ? AND table_name = ?";
/// ScyllaDB has this table, Apache Cassandra does not.
const SCYLLA_PROBE_CQL: &str = "SELECT * FROM system.versions LIMIT 1";

/// One migration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migration {
    pub version: u32,
    /// The part of the file name after `NNNN_`, without `.cql`.
    pub name: String,
    pub file: &'static str,
    pub text: &'static str,
    /// sha256 of the file's bytes, lowercase hex.
    pub checksum: String,
}

/// A row of `schema_migrations`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedMigration {
    pub version: u32,
    pub name: String,
    pub checksum: String,
}

/// Which server answers; decides whether the keyspace gets the `tablets` option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    Scylla,
    Cassandra,
}

/// What a run did (or, with `--dry-run`, would do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrateReport {
    pub server: ServerKind,
    pub dry_run: bool,
    pub keyspace_created: bool,
    /// Versions applied by this run (or pending, in a dry run), in order.
    pub applied: Vec<u32>,
    /// Versions that were already recorded.
    pub already_applied: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("invalid migration file {file}: {message}")]
    BadFile { file: String, message: String },
    #[error("cannot connect to the cluster: {0}")]
    Connect(String),
    #[error("{file}: statement {statement} failed: {message}")]
    Statement {
        file: String,
        statement: usize,
        message: String,
    },
    #[error(
        "{file} was applied with checksum {recorded} but the file now has {current}: applied \
         migrations must never change; add a new migration instead"
    )]
    ChecksumMismatch {
        file: String,
        recorded: String,
        current: String,
    },
    #[error(
        "the keyspace has migration {version} ({name}) that this binary does not know: it was \
         migrated by a newer quotad"
    )]
    UnknownApplied { version: u32, name: String },
    #[error("cluster error: {0}")]
    Cql(String),
    #[error("cannot write the report: {0}")]
    Io(#[from] std::io::Error),
}

fn cql_err(e: impl std::fmt::Display) -> MigrateError {
    MigrateError::Cql(e.to_string())
}

/// Splits `NNNN_name.cql` into its version and name.
pub fn parse_file_name(file: &str) -> Result<(u32, &str), String> {
    let stem = file
        .strip_suffix(".cql")
        .ok_or("a migration file name ends in .cql")?;
    let (digits, name) = stem
        .split_once('_')
        .ok_or("a migration file is named NNNN_name.cql")?;
    if digits.len() < 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("a migration file name starts with at least four digits".into());
    }
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err("a migration name is lowercase letters, digits and _".into());
    }
    let version: u32 = digits
        .parse()
        .map_err(|_| "the version number is too large".to_string())?;
    if version == 0 {
        return Err("versions start at 1".into());
    }
    Ok((version, name))
}

/// sha256 of the file's bytes, lowercase hex. Bytes, not statements: any edit counts, even
/// one in a comment, because a file is history and history is not edited.
pub fn checksum(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Parses and orders a set of files; refuses bad names and duplicate versions.
pub fn load(files: &[(&'static str, &'static str)]) -> Result<Vec<Migration>, MigrateError> {
    let mut out = Vec::with_capacity(files.len());
    for &(file, text) in files {
        let (version, name) = parse_file_name(file).map_err(|message| MigrateError::BadFile {
            file: file.to_owned(),
            message,
        })?;
        if split_statements(text).is_empty() {
            return Err(MigrateError::BadFile {
                file: file.to_owned(),
                message: "holds no statement".into(),
            });
        }
        out.push(Migration {
            version,
            name: name.to_owned(),
            file,
            text,
            checksum: checksum(text),
        });
    }
    out.sort_by_key(|m| m.version);
    for pair in out.windows(2) {
        if pair[0].version == pair[1].version {
            return Err(MigrateError::BadFile {
                file: pair[1].file.to_owned(),
                message: format!(
                    "version {} is also used by {}",
                    pair[0].version, pair[0].file
                ),
            });
        }
    }
    Ok(out)
}

/// The migrations compiled into this binary, in order.
pub fn migrations() -> Result<Vec<Migration>, MigrateError> {
    load(MIGRATION_FILES)
}

/// Splits a CQL file into statements: `;` ends one, except inside '...' strings (with ''
/// escapes), "..." identifiers and $$...$$ blocks; `--` and `//` line comments and `/* */`
/// comments are dropped. Statements come back trimmed, without the `;`.
pub fn split_statements(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                cur.push(c);
                while let Some(d) = chars.next() {
                    cur.push(d);
                    if d == c {
                        // A doubled quote is an escaped quote, not the end.
                        if chars.peek() == Some(&c) {
                            cur.push(chars.next().unwrap_or(c));
                        } else {
                            break;
                        }
                    }
                }
            }
            '$' if chars.peek() == Some(&'$') => {
                chars.next();
                cur.push_str("$$");
                let mut prev = '\0';
                for d in chars.by_ref() {
                    cur.push(d);
                    if prev == '$' && d == '$' {
                        break;
                    }
                    prev = d;
                }
            }
            '-' if chars.peek() == Some(&'-') => skip_line(&mut chars),
            '/' if chars.peek() == Some(&'/') => skip_line(&mut chars),
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = '\0';
                for d in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
                cur.push(' ');
            }
            ';' => {
                let s = cur.trim();
                if !s.is_empty() {
                    out.push(s.to_owned());
                }
                cur.clear();
            }
            _ => cur.push(c),
        }
    }
    let s = cur.trim();
    if !s.is_empty() {
        out.push(s.to_owned());
    }
    out
}

fn skip_line(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    for d in chars.by_ref() {
        if d == '\n' {
            break;
        }
    }
}

/// What must be applied, given what the keyspace records. Refuses changed or unknown history.
pub fn plan<'a>(
    known: &'a [Migration],
    applied: &[AppliedMigration],
) -> Result<Vec<&'a Migration>, MigrateError> {
    for a in applied {
        match known.iter().find(|m| m.version == a.version) {
            None => {
                return Err(MigrateError::UnknownApplied {
                    version: a.version,
                    name: a.name.clone(),
                })
            }
            Some(m) if m.checksum != a.checksum => {
                return Err(MigrateError::ChecksumMismatch {
                    file: m.file.to_owned(),
                    recorded: a.checksum.clone(),
                    current: m.checksum.clone(),
                })
            }
            Some(_) => {}
        }
    }
    Ok(known
        .iter()
        .filter(|m| !applied.iter().any(|a| a.version == m.version))
        .collect())
}

/// A keyspace name quotad accepts: a lowercase unquoted CQL identifier of at most 48
/// characters (Cassandra's limit). Lowercase only, because unquoted names are folded to
/// lowercase by the server and a mixed-case setting would silently name another keyspace.
pub fn validate_keyspace(ks: &str) -> Result<(), String> {
    let ok = (1..=48).contains(&ks.len())
        && ks.as_bytes()[0].is_ascii_lowercase()
        && ks
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "keyspace {ks:?} must be 1 to 48 characters of a-z 0-9 _, starting with a letter"
        ))
    }
}

/// Parses a CQL replication map such as `{'class': 'SimpleStrategy', 'replication_factor': 1}`
/// and renders it canonically. Keys and values are restricted to `A-Z a-z 0-9 . _ -` (values
/// may also be bare integers), so the result can be put into DDL without risk.
pub fn render_replication(s: &str) -> Result<String, String> {
    let bad = |why: &str| format!("replication {s:?}: {why}");
    let inner = s
        .trim()
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(|| bad("must be a map in braces"))?;
    let mut pairs: Vec<(String, String)> = Vec::new();
    for part in inner.split(',') {
        let (k, v) = part
            .split_once(':')
            .ok_or_else(|| bad("entries are 'key': value"))?;
        let key = quoted_word(k.trim()).ok_or_else(|| bad("a key is a quoted name"))?;
        let v = v.trim();
        let value = if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
            v.to_owned()
        } else {
            format!(
                "'{}'",
                quoted_word(v).ok_or_else(|| bad("a value is a quoted name or a number"))?
            )
        };
        if pairs.iter().any(|(k, _)| *k == key) {
            return Err(bad("a key appears twice"));
        }
        pairs.push((key, value));
    }
    if !pairs.iter().any(|(k, _)| k == "class") {
        return Err(bad("'class' is required"));
    }
    let body: Vec<String> = pairs.iter().map(|(k, v)| format!("'{k}': {v}")).collect();
    Ok(format!("{{{}}}", body.join(", ")))
}

fn quoted_word(s: &str) -> Option<String> {
    let w = s.strip_prefix('\'')?.strip_suffix('\'')?;
    let ok = !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    ok.then(|| w.to_owned())
}

/// The keyspace statement. `replication` must come from [`render_replication`] and `ks` must
/// have passed [`validate_keyspace`].
pub fn create_keyspace_cql(ks: &str, replication: &str, server: ServerKind) -> String {
    match server {
        ServerKind::Scylla => format!(
            "CREATE KEYSPACE IF NOT EXISTS {ks}\n    WITH replication = {replication}\n    \
             AND tablets = {{'enabled': false}}"
        ),
        ServerKind::Cassandra => {
            format!("CREATE KEYSPACE IF NOT EXISTS {ks}\n    WITH replication = {replication}")
        }
    }
}

/// Whether an error from CREATE KEYSPACE says the server does not know the `tablets` option
/// (ScyllaDB before 6.0 has no tablets at all; such a keyspace is fine for counters).
fn is_unknown_tablets_option(e: &ExecutionError) -> bool {
    match e {
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(
            DbError::SyntaxError | DbError::Invalid | DbError::ConfigError,
            msg,
        )) => msg.to_ascii_lowercase().contains("tablets"),
        _ => false,
    }
}

/// Asks the server what it is: ScyllaDB nodes announce their shard layout to the driver and
/// have a `system.versions` table; Cassandra has neither.
pub async fn detect_server(session: &Session) -> Result<ServerKind, MigrateError> {
    let state = session.get_cluster_state();
    if state.get_nodes_info().iter().any(|n| n.sharder().is_some()) {
        return Ok(ServerKind::Scylla);
    }
    match session.query_unpaged(SCYLLA_PROBE_CQL, ()).await {
        Ok(_) => Ok(ServerKind::Scylla),
        Err(ExecutionError::LastAttemptError(RequestAttemptError::DbError(
            DbError::Invalid,
            _,
        ))) => Ok(ServerKind::Cassandra),
        Err(e) => Err(cql_err(e)),
    }
}

async fn exists(session: &Session, cql: &str, values: &[&str]) -> Result<bool, MigrateError> {
    let rows = session
        .query_unpaged(cql, values)
        .await
        .map_err(cql_err)?
        .into_rows_result()
        .map_err(cql_err)?;
    Ok(rows.rows_num() > 0)
}

async fn read_applied(session: &Session) -> Result<Vec<AppliedMigration>, MigrateError> {
    let rows = session
        .query_unpaged(SELECT_APPLIED_CQL, ())
        .await
        .map_err(cql_err)?
        .into_rows_result()
        .map_err(cql_err)?;
    let mut out = Vec::new();
    for row in rows.rows::<(i32, String, String)>().map_err(cql_err)? {
        let (version, name, checksum) = row.map_err(cql_err)?;
        let version = u32::try_from(version)
            .map_err(|_| MigrateError::Cql(format!("schema_migrations holds version {version}")))?;
        out.push(AppliedMigration {
            version,
            name,
            checksum,
        });
    }
    out.sort_by_key(|a| a.version);
    Ok(out)
}

/// Connects without a keyspace (it may not exist yet), with the store's contact points,
/// credentials and a generous timeout: schema changes wait for the cluster to agree.
async fn connect(opts: &ScyllaOptions) -> Result<Session, MigrateError> {
    let mut b = SessionBuilder::new()
        .known_nodes(&opts.nodes)
        .connection_timeout(opts.connect_timeout);
    if let (Some(u), Some(p)) = (&opts.username, &opts.password) {
        b = b.user(u, p);
    }
    b.build()
        .await
        .map_err(|e| MigrateError::Connect(e.to_string()))
}

/// Creates the keyspace if missing and applies the pending migrations; with `dry_run`, only
/// says what it would do and writes nothing. Progress goes to `out`, one line per step.
pub async fn run(
    opts: &ScyllaOptions,
    dry_run: bool,
    out: &mut impl Write,
) -> Result<MigrateReport, MigrateError> {
    validate_keyspace(&opts.keyspace).map_err(MigrateError::Config)?;
    let replication = render_replication(&opts.replication).map_err(MigrateError::Config)?;
    if opts.nodes.is_empty() {
        return Err(MigrateError::Config(
            "no contact points (store.nodes)".into(),
        ));
    }
    let known = migrations()?;
    let ks = opts.keyspace.as_str();

    let session = connect(opts).await?;
    let server = detect_server(&session).await?;
    writeln!(
        out,
        "server: {}",
        match server {
            ServerKind::Scylla => "ScyllaDB",
            ServerKind::Cassandra => "Apache Cassandra",
        }
    )?;
    let mut report = MigrateReport {
        server,
        dry_run,
        keyspace_created: false,
        applied: Vec::new(),
        already_applied: Vec::new(),
    };

    let ks_exists = exists(&session, KEYSPACE_EXISTS_CQL, &[ks]).await?;
    if !ks_exists {
        let cql = create_keyspace_cql(ks, &replication, server);
        if dry_run {
            writeln!(out, "would create keyspace {ks}:\n{cql};")?;
        } else {
            writeln!(out, "creating keyspace {ks} with replication {replication}")?;
            match session.query_unpaged(cql.as_str(), ()).await {
                Ok(_) => {}
                Err(e) if server == ServerKind::Scylla && is_unknown_tablets_option(&e) => {
                    writeln!(
                        out,
                        "this ScyllaDB has no tablets; creating without the option"
                    )?;
                    let cql = create_keyspace_cql(ks, &replication, ServerKind::Cassandra);
                    session
                        .query_unpaged(cql.as_str(), ())
                        .await
                        .map_err(cql_err)?;
                }
                Err(e) => return Err(cql_err(e)),
            }
        }
        report.keyspace_created = true;
    } else {
        writeln!(out, "keyspace {ks} exists")?;
    }

    let table_exists =
        ks_exists && exists(&session, TABLE_EXISTS_CQL, &[ks, "schema_migrations"]).await?;
    if ks_exists || !dry_run {
        session
            .use_keyspace(ks, false)
            .await
            .map_err(|e| MigrateError::Cql(e.to_string()))?;
    }
    let applied = if table_exists {
        read_applied(&session).await?
    } else {
        if !dry_run {
            session
                .query_unpaged(SCHEMA_MIGRATIONS_CQL, ())
                .await
                .map_err(cql_err)?;
        }
        Vec::new()
    };
    let pending = plan(&known, &applied)?;
    report.already_applied = applied.iter().map(|a| a.version).collect();
    for a in &applied {
        writeln!(out, "applied already: {:04}_{}", a.version, a.name)?;
    }
    if pending.is_empty() {
        writeln!(out, "nothing to apply: the schema is up to date")?;
    }

    for m in pending {
        let statements = split_statements(m.text);
        if dry_run {
            writeln!(
                out,
                "would apply {} (sha256 {}), {} statement(s):",
                m.file,
                m.checksum,
                statements.len()
            )?;
            for s in &statements {
                writeln!(out, "{s};")?;
            }
            report.applied.push(m.version);
            continue;
        }
        writeln!(out, "applying {} (sha256 {})", m.file, m.checksum)?;
        for (i, s) in statements.iter().enumerate() {
            // DDL: the driver waits for schema agreement after each one before returning.
            session
                .query_unpaged(s.as_str(), ())
                .await
                .map_err(|e| MigrateError::Statement {
                    file: m.file.to_owned(),
                    statement: i + 1,
                    message: e.to_string(),
                })?;
        }
        record(&session, m).await?;
        report.applied.push(m.version);
    }
    Ok(report)
}

async fn record(session: &Session, m: &Migration) -> Result<(), MigrateError> {
    let now = CqlTimestamp(chrono::Utc::now().timestamp_millis());
    let version = i32::try_from(m.version)
        .map_err(|_| MigrateError::Config(format!("version {} too large", m.version)))?;
    let res = session
        .query_unpaged(
            RECORD_CQL,
            (version, m.name.as_str(), m.checksum.as_str(), now),
        )
        .await
        .map_err(cql_err)?
        .into_rows_result()
        .map_err(cql_err)?;
    if !lwt_applied(&res)? {
        // Another migrator recorded this version meanwhile: fine if it was the same file.
        let recorded = read_applied(session).await?;
        if let Some(r) = recorded.iter().find(|a| a.version == m.version) {
            if r.checksum != m.checksum {
                return Err(MigrateError::ChecksumMismatch {
                    file: m.file.to_owned(),
                    recorded: r.checksum.clone(),
                    current: m.checksum.clone(),
                });
            }
        }
    }
    Ok(())
}

/// The `[applied]` column of a lightweight transaction's answer.
fn lwt_applied(
    rows: &scylla::response::query_result::QueryRowsResult,
) -> Result<bool, MigrateError> {
    let row = rows.first_row::<scylla::value::Row>().map_err(cql_err)?;
    match row.columns.first() {
        Some(Some(scylla::value::CqlValue::Boolean(b))) => Ok(*b),
        _ => Err(MigrateError::Cql(
            "a conditional write answered without [applied]".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_give_version_and_name() {
        assert_eq!(parse_file_name("0001_counters.cql"), Ok((1, "counters")));
        assert_eq!(parse_file_name("0120_add_x_2.cql"), Ok((120, "add_x_2")));
        for bad in [
            "001_short.cql",
            "0001_counters.sql",
            "0001counters.cql",
            "0001_.cql",
            "0001_Upper.cql",
            "0000_zero.cql",
            "abcd_x.cql",
            "99999999999_big.cql",
        ] {
            assert!(parse_file_name(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn load_orders_by_version_and_refuses_duplicates() {
        let files: &[(&str, &str)] = &[
            (
                "0010_b.cql",
                "CREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY);",
            ),
            (
                "0002_a.cql",
                "CREATE TABLE IF NOT EXISTS a (k int PRIMARY KEY);",
            ),
        ];
        let m = load(files).unwrap();
        assert_eq!(m.iter().map(|m| m.version).collect::<Vec<_>>(), vec![2, 10]);
        let dup: &[(&str, &str)] = &[("0002_a.cql", "SELECT 1"), ("0002_b.cql", "SELECT 1")];
        match load(dup) {
            Err(MigrateError::BadFile { file, .. }) => assert_eq!(file, "0002_b.cql"),
            other => panic!("{other:?}"),
        }
        let empty: &[(&str, &str)] = &[("0001_a.cql", "-- nothing\n")];
        assert!(load(empty).is_err());
    }

    #[test]
    fn checksum_is_sha256_of_the_bytes() {
        assert_eq!(
            checksum(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_ne!(checksum("a;"), checksum("a; "));
    }

    #[test]
    fn statements_split_outside_strings_and_comments() {
        let text = "-- header; not a statement\n\
            CREATE TABLE a (k text PRIMARY KEY) WITH comment = 'x;y''z';\n\
            /* block; */ INSERT INTO a (k) VALUES ('a--b');  // tail; comment\n\
            SELECT \"we;ird\" FROM a; ;\n\
            CREATE FUNCTION f() RETURNS NULL ON NULL INPUT RETURNS int LANGUAGE java AS $$ return 1; $$\n";
        let s = split_statements(text);
        assert_eq!(
            s,
            vec![
                "CREATE TABLE a (k text PRIMARY KEY) WITH comment = 'x;y''z'",
                "INSERT INTO a (k) VALUES ('a--b')",
                "SELECT \"we;ird\" FROM a",
                "CREATE FUNCTION f() RETURNS NULL ON NULL INPUT RETURNS int LANGUAGE java AS $$ return 1; $$",
            ]
        );
    }

    fn applied(m: &Migration) -> AppliedMigration {
        AppliedMigration {
            version: m.version,
            name: m.name.clone(),
            checksum: m.checksum.clone(),
        }
    }

    #[test]
    fn plan_applies_only_what_is_missing() {
        let known = migrations().unwrap();
        assert_eq!(plan(&known, &[]).unwrap().len(), known.len());
        let first = [applied(&known[0])];
        let pending = plan(&known, &first).unwrap();
        assert_eq!(
            pending.iter().map(|m| m.version).collect::<Vec<_>>(),
            known[1..].iter().map(|m| m.version).collect::<Vec<_>>()
        );
        let all: Vec<_> = known.iter().map(applied).collect();
        assert!(plan(&known, &all).unwrap().is_empty());
    }

    #[test]
    fn plan_refuses_a_changed_file_naming_it() {
        let known = migrations().unwrap();
        let mut a = applied(&known[0]);
        a.checksum = checksum("something else");
        let err = plan(&known, &[a]).unwrap_err();
        assert!(
            matches!(&err, MigrateError::ChecksumMismatch { file, .. } if file == known[0].file)
        );
        assert!(err.to_string().contains(known[0].file), "{err}");
    }

    #[test]
    fn plan_refuses_versions_from_a_newer_binary() {
        let known = migrations().unwrap();
        let newer = AppliedMigration {
            version: 9999,
            name: "future".into(),
            checksum: checksum("x"),
        };
        assert!(matches!(
            plan(&known, &[newer]),
            Err(MigrateError::UnknownApplied { version: 9999, .. })
        ));
    }

    #[test]
    fn the_embedded_list_is_exactly_the_migrations_directory() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".cql"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> =
            MIGRATION_FILES.iter().map(|(f, _)| f.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded, "add new files to MIGRATION_FILES");
        for (f, text) in MIGRATION_FILES {
            let disk = std::fs::read_to_string(format!("{dir}/{f}")).unwrap();
            assert_eq!(&disk, text);
        }
        migrations().unwrap();
    }

    #[test]
    fn shipped_migrations_are_rerunnable_and_keyspace_free() {
        for m in migrations().unwrap() {
            for s in split_statements(m.text) {
                let upper = s.to_ascii_uppercase();
                assert!(
                    upper.starts_with("CREATE ") && upper.contains(" IF NOT EXISTS "),
                    "{}: not an idempotent CREATE: {s}",
                    m.file
                );
                let head: String = upper.split('(').next().unwrap_or("").to_owned();
                assert!(!head.contains('.'), "{}: names a keyspace: {s}", m.file);
                assert!(!upper.contains("KEYSPACE"), "{}: {s}", m.file);
            }
        }
    }

    #[test]
    fn bookkeeping_statements_match_their_table() {
        use crate::store::scylla::schema_check::{check, names, parse_tables};
        let tables = parse_tables(&split_statements(SCHEMA_MIGRATIONS_CQL));
        check(
            &tables,
            RECORD_CQL,
            &names::<(i32, &str, &str, CqlTimestamp)>(),
            None,
        )
        .unwrap();
        check(
            &tables,
            SELECT_APPLIED_CQL.trim_end(),
            &[],
            Some(&names::<(i32, String, String)>()),
        )
        .unwrap();
    }

    #[test]
    fn keyspace_names_are_plain_lowercase_identifiers() {
        assert!(validate_keyspace("quota").is_ok());
        assert!(validate_keyspace("quota_test_123").is_ok());
        assert!(validate_keyspace(&"a".repeat(48)).is_ok());
        for bad in [
            "",
            "Quota",
            "1quota",
            "quota-x",
            "q;drop",
            "q.x",
            &"a".repeat(49),
        ] {
            assert!(validate_keyspace(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn replication_is_parsed_and_rendered_canonically() {
        assert_eq!(
            render_replication("{ 'class' : 'SimpleStrategy','replication_factor':1 }").unwrap(),
            "{'class': 'SimpleStrategy', 'replication_factor': 1}"
        );
        assert_eq!(
            render_replication("{'class': 'NetworkTopologyStrategy', 'dc-1': '3', 'dc2': 2}")
                .unwrap(),
            "{'class': 'NetworkTopologyStrategy', 'dc-1': '3', 'dc2': 2}"
        );
        for bad in [
            "",
            "'class': 'SimpleStrategy'",
            "{'replication_factor': 1}",
            "{'class': 'SimpleStrategy'}; DROP KEYSPACE quota",
            "{'class': 'Simple'' OR 1=1'}",
            "{'class': SimpleStrategy}",
            "{'class': 'a', 'class': 'b'}",
            "{'class': 'a b'}",
        ] {
            assert!(render_replication(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_keyspace_file_matches_what_migrate_creates_by_default() {
        let opts = ScyllaOptions::default();
        let rendered = create_keyspace_cql(
            &opts.keyspace,
            &render_replication(&opts.replication).unwrap(),
            ServerKind::Scylla,
        );
        let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let file = split_statements(KEYSPACE_FILE);
        assert_eq!(file.len(), 1);
        assert_eq!(norm(&file[0]), norm(&rendered));
        let cassandra = create_keyspace_cql("quota", "{'class': 'x'}", ServerKind::Cassandra);
        assert!(!cassandra.contains("tablets"));
    }
}
