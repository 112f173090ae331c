//! The command line: `quotad serve` (the default), `migrate`, `hash-token`, `audit`, `apply`
//! and `export`. Each command's body is here, beside what it reads; `src/main.rs` only sets up
//! the process (allocator, memory tuning, the runtime) and calls [`run`].
//!
//! One module a job: `apply` (quotas files: parse, plan, apply, export) and `commands` (the
//! store commands' bodies: apply, export, audit).

pub mod apply;
mod commands;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::Settings;
use crate::startup::Application;
use commands::{apply_file, export, print_audit};

/// What the process's memory tuning did (the binary's `memory` module), for `serve`'s log.
#[derive(Clone, Copy, Debug)]
pub struct MemoryNote {
    pub huge_pages_off: bool,
    pub purge_delay_ms: Option<i64>,
}

#[derive(Parser)]
#[command(
    name = "quotad",
    version,
    about = "Multi-tenant quota and rate-limit service"
)]
pub struct Cli {
    /// A TOML file layered over config/default.toml and under QUOTAD__* environment variables.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the HTTP service (the default).
    Serve,
    /// Apply pending CQL migrations to the configured Cassandra/ScyllaDB keyspace.
    Migrate {
        /// Print what would be applied, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Create a missing keyspace across data centres (NetworkTopologyStrategy), each with
        /// its replicas, e.g. `eu:3,us:3`; instead of `store.replication`.
        #[arg(long, value_name = "DC:REPLICAS,...")]
        datacenters: Option<String>,
    },
    /// Print the salted hash (argon2id) of a token read from standard input, for
    /// `[[auth.tokens]] hash`; a token under 128 bits of entropy is refused.
    HashToken,
    /// Print the audit log from the store, newest first, as JSON lines
    ///
    /// Needs no token: whoever can read the configuration and the store can read the log. On
    /// the embedded store, stop the service first (one process opens it at a time).
    Audit(AuditArgs),
    /// Apply a quotas file (YAML or JSON) to the store: prints a diff per tenant, then applies it
    ///
    /// Validates every policy as the admin API does and writes through the store with the same
    /// versioning, each change in the audit log. On the embedded store, stop the service first.
    Apply {
        /// The quotas file; `-` reads standard input. JSON when the name ends in .json.
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: String,
        /// Print the diff, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Also remove the policies and overrides the file does not name.
        #[arg(long)]
        prune: bool,
    },
    /// Print every policy and override in the store as a quotas file (what apply reads)
    Export {
        /// yaml or json.
        #[arg(long, default_value = "yaml", value_parser = ["yaml", "json"])]
        format: String,
    },
}

#[derive(clap::Args)]
pub struct AuditArgs {
    /// Only this tenant's changes.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Changes made at or after this time (RFC 3339).
    #[arg(long, value_parser = rfc3339)]
    pub from: Option<i64>,
    /// Changes made before this time (RFC 3339); default: now.
    #[arg(long, value_parser = rfc3339)]
    pub to: Option<i64>,
    /// Print at most this many entries; 0 prints every one.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

fn rfc3339(s: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("{e} (expected e.g. 2026-11-23T14:00:00Z)"))
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: log collectors and pipes get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .init();
}

/// Loads the settings and starts logging at their level: what every command that reads the
/// configuration does first.
fn setup(config: Option<PathBuf>) -> Result<Settings, ExitCode> {
    let settings = load(config)?;
    init_logging(&settings.log.level);
    Ok(settings)
}

fn load(config: Option<PathBuf>) -> Result<Settings, ExitCode> {
    Settings::load(config.as_deref()).map_err(|e| {
        eprintln!("quotad: {e}");
        ExitCode::from(2)
    })
}

/// Raises the open-files limit (`crate::os::files`) and says whether the HTTP connection cap
/// fits below it.
fn open_files(settings: &Settings) {
    let Some(files) = crate::os::files::raise() else {
        return;
    };
    let workers = match settings.server.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let http_cap = settings.server.max_connections.saturating_mul(workers) as u64;
    if http_cap >= files.now {
        tracing::warn!(
            open_files = files.now,
            http_connections = http_cap,
            "server.max_connections times the workers is not below the open-files limit: \
             connections that never finish can use every descriptor; lower it or raise the \
             hard limit (LimitNOFILE)"
        );
    } else {
        tracing::info!(
            open_files = files.now,
            before = files.before,
            "open-files limit"
        );
    }
}

/// Runs the command (`serve` when none is given); `memory` is what `serve`'s process tuning
/// did, to be logged once logging has started.
pub async fn run(cli: Cli, memory: Option<MemoryNote>) -> ExitCode {
    let config = cli.config;
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            let settings = match setup(config) {
                Ok(s) => s,
                Err(code) => return code,
            };
            if let Some(m) = memory {
                tracing::info!(
                    transparent_huge_pages_off = m.huge_pages_off,
                    allocator_purge_delay_ms = m.purge_delay_ms,
                    "memory settings"
                );
            }
            open_files(&settings);
            let app = match Application::build(settings).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::error!("cannot start: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match app.run_until_stopped().await {
                Ok(0) => ExitCode::SUCCESS,
                Ok(n) => {
                    tracing::error!(
                        hits = n,
                        "exiting with admitted hits not known to be written (unwritten, or \
                         sent with no answer)"
                    );
                    ExitCode::FAILURE
                }
                Err(e) => {
                    tracing::error!("server error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::HashToken => {
            let mut token = String::new();
            if std::io::Read::read_to_string(&mut std::io::stdin(), &mut token).is_err() {
                eprintln!("quotad hash-token: cannot read standard input");
                return ExitCode::FAILURE;
            }
            // One trailing newline (from echo or a terminal) is not part of the token.
            let token = token.strip_suffix('\n').unwrap_or(&token);
            let token = token.strip_suffix('\r').unwrap_or(token);
            if let Err(e) = crate::config::tokens::check_strength(token) {
                eprintln!("quotad hash-token: {e}");
                return ExitCode::from(2);
            }
            println!("{}", crate::config::tokens::hash(token));
            ExitCode::SUCCESS
        }
        Command::Audit(args) => {
            let settings = match setup(config) {
                Ok(s) => s,
                Err(code) => return code,
            };
            if let Some(Err(e)) = args.tenant.as_deref().map(crate::domain::TenantId::parse) {
                eprintln!("quotad audit: --tenant: {}", e.message);
                return ExitCode::from(2);
            }
            match print_audit(&settings, &args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("quotad audit: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Apply {
            file,
            dry_run,
            prune,
        } => {
            let settings = match setup(config) {
                Ok(s) => s,
                Err(code) => return code,
            };
            apply_file(&settings, &file, dry_run, prune).await
        }
        Command::Export { format } => {
            let settings = match setup(config) {
                Ok(s) => s,
                Err(code) => return code,
            };
            match export(&settings, &format).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("quotad export: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Migrate {
            dry_run,
            datacenters,
        } => {
            let settings = match setup(config) {
                Ok(s) => s,
                Err(code) => return code,
            };
            let mut opts = match crate::startup::scylla_options(&settings) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("quotad migrate: {e}");
                    return ExitCode::from(2);
                }
            };
            if let Some(spec) = datacenters {
                match crate::scylla::migrate::datacenters_replication(&spec) {
                    Ok(r) => opts.replication = r,
                    Err(e) => {
                        eprintln!("quotad migrate: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            match crate::scylla::migrate::run(&opts, dry_run, &mut std::io::stdout()).await {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("quotad migrate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
