//! `quotad migrate`: creates the keyspace and applies `migrations/*.cql` in order.
//!
//! The files are compiled into the binary ([`files`]), so the binary that serves is the binary
//! that knows the schema it needs. Each applied file is recorded in `schema_migrations`
//! ([`history`]); a later run applies only what is missing and refuses to run when a recorded
//! file has changed since, or when the keyspace holds a version this binary does not know
//! ([`plan`]). The keyspace statement is the only CQL built from configuration ([`keyspace`]).
//!
//! Run one migrator at a time: schema changes from two clients at once can leave the cluster
//! in schema disagreement. The compose file runs it once, before the instances start.
//!
//! [`run`] is a sequence of named steps: check the options, connect and identify the server,
//! make sure the keyspace exists, read the history, apply what is pending.

use std::io::Write;

use scylla::client::session::Session;

use crate::scylla::cql::ScyllaOptions;

mod error;
mod files;
mod history;
mod keyspace;
mod plan;

pub use crate::scylla::cql::validate_keyspace;
use error::cql_err;
pub use error::MigrateError;
pub use files::{
    checksum, load, migrations, parse_file_name, split_statements, Migration, MIGRATION_FILES,
};
pub use history::SCHEMA_MIGRATIONS_CQL;
pub use keyspace::{
    create_keyspace_cql, datacenters_replication, detect_server, render_replication, ServerKind,
    KEYSPACE_FILE,
};
pub use plan::{plan, AppliedMigration};

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

/// Creates the keyspace if missing and applies the pending migrations; with `dry_run`, only
/// says what it would do and writes nothing. Progress goes to `out`, one line per step.
pub async fn run(
    opts: &ScyllaOptions,
    dry_run: bool,
    out: &mut impl Write,
) -> Result<MigrateReport, MigrateError> {
    let replication = check_options(opts)?;
    let known = migrations()?;
    let ks = opts.keyspace.as_str();

    let session = connect(opts).await?;
    let server = detect_server(&session).await?;
    writeln!(out, "server: {}", server.product())?;

    let ks_exists = history::exists(&session, history::KEYSPACE_EXISTS_CQL, &[ks]).await?;
    let keyspace_created = !ks_exists;
    if ks_exists {
        writeln!(out, "keyspace {ks} exists")?;
    } else {
        let mut dcs: Vec<String> = (session.get_cluster_state().get_nodes_info().iter())
            .filter_map(|n| n.datacenter.clone())
            .collect();
        dcs.sort_unstable();
        dcs.dedup();
        keyspace::check_replication(&replication, &dcs).map_err(MigrateError::Config)?;
        create_keyspace(&session, ks, &replication, server, dry_run, out).await?;
    }

    let applied = read_history(&session, ks, ks_exists, dry_run).await?;
    let pending = plan(&known, &applied)?;
    for a in &applied {
        writeln!(out, "applied already: {:04}_{}", a.version, a.name)?;
    }
    if pending.is_empty() {
        writeln!(out, "nothing to apply: the schema is up to date")?;
    }
    let mut report = MigrateReport {
        server,
        dry_run,
        keyspace_created,
        applied: Vec::new(),
        already_applied: applied.iter().map(|a| a.version).collect(),
    };
    for m in pending {
        if dry_run {
            show_migration(m, out)?;
        } else {
            apply_migration(&session, m, out).await?;
        }
        report.applied.push(m.version);
    }
    Ok(report)
}

/// Checks what the server cannot check for us; returns the replication map rendered
/// canonically.
fn check_options(opts: &ScyllaOptions) -> Result<String, MigrateError> {
    validate_keyspace(&opts.keyspace).map_err(MigrateError::Config)?;
    let replication = render_replication(&opts.replication).map_err(MigrateError::Config)?;
    if opts.nodes.is_empty() {
        return Err(MigrateError::Config(
            "no contact points (store.nodes)".into(),
        ));
    }
    Ok(replication)
}

/// Connects without a keyspace (it may not exist yet), with the store's contact points,
/// credentials and a generous timeout: schema changes wait for the cluster to agree.
async fn connect(opts: &ScyllaOptions) -> Result<Session, MigrateError> {
    crate::scylla::cql::session_builder(opts)
        .build()
        .await
        .map_err(|e| {
            MigrateError::Connect(crate::scylla::cql::explain_connect_error(
                &e.to_string(),
                opts.tls.as_ref(),
            ))
        })
}

/// Creates the missing keyspace (or, in a dry run, prints the statement). A ScyllaDB without
/// tablets refuses the `tablets` option: then the keyspace is created without it.
async fn create_keyspace(
    session: &Session,
    ks: &str,
    replication: &str,
    server: ServerKind,
    dry_run: bool,
    out: &mut impl Write,
) -> Result<(), MigrateError> {
    let cql = create_keyspace_cql(ks, replication, server);
    if dry_run {
        writeln!(out, "would create keyspace {ks}:\n{cql};")?;
        return Ok(());
    }
    writeln!(out, "creating keyspace {ks} with replication {replication}")?;
    match session.query_unpaged(cql.as_str(), ()).await {
        Ok(_) => Ok(()),
        Err(e) if server == ServerKind::Scylla && keyspace::is_unknown_tablets_option(&e) => {
            writeln!(
                out,
                "this ScyllaDB has no tablets; creating without the option"
            )?;
            let cql = create_keyspace_cql(ks, replication, ServerKind::Cassandra);
            session
                .query_unpaged(cql.as_str(), ())
                .await
                .map_err(cql_err)?;
            Ok(())
        }
        Err(e) => Err(cql_err(e)),
    }
}

/// Enters the keyspace and reads what it records. A keyspace without `schema_migrations` gets
/// the table (except in a dry run) and has applied nothing; a dry run against a keyspace that
/// does not exist yet reads nothing.
async fn read_history(
    session: &Session,
    ks: &str,
    ks_exists: bool,
    dry_run: bool,
) -> Result<Vec<AppliedMigration>, MigrateError> {
    let table_exists = ks_exists
        && history::exists(
            session,
            history::TABLE_EXISTS_CQL,
            &[ks, "schema_migrations"],
        )
        .await?;
    if ks_exists || !dry_run {
        session
            .use_keyspace(ks, false)
            .await
            .map_err(|e| MigrateError::Cql(e.to_string()))?;
    }
    if table_exists {
        return history::read_applied(session).await;
    }
    if !dry_run {
        session
            .query_unpaged(SCHEMA_MIGRATIONS_CQL, ())
            .await
            .map_err(cql_err)?;
    }
    Ok(Vec::new())
}

/// Prints what applying a migration would run.
fn show_migration(m: &Migration, out: &mut impl Write) -> Result<(), MigrateError> {
    let statements = split_statements(m.text);
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
    Ok(())
}

/// Runs a migration's statements in order, then records it.
async fn apply_migration(
    session: &Session,
    m: &Migration,
    out: &mut impl Write,
) -> Result<(), MigrateError> {
    writeln!(out, "applying {} (sha256 {})", m.file, m.checksum)?;
    for (i, s) in split_statements(m.text).iter().enumerate() {
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
    history::record(session, m).await
}
