//! quotad: parses the command line, loads configuration, starts logging and runs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use quotad::config::Settings;
use quotad::startup::Application;

mod memory;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "quotad",
    version,
    about = "Multi-tenant quota and rate-limit service"
)]
struct Cli {
    /// A TOML file layered over config/default.toml and under QUOTAD__* environment variables.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
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
struct AuditArgs {
    /// Only this tenant's changes.
    #[arg(long)]
    tenant: Option<String>,
    /// Changes made at or after this time (RFC 3339).
    #[arg(long, value_parser = rfc3339)]
    from: Option<i64>,
    /// Changes made before this time (RFC 3339); default: now.
    #[arg(long, value_parser = rfc3339)]
    to: Option<i64>,
    /// Print at most this many entries; 0 prints every one.
    #[arg(long, default_value_t = 100)]
    limit: usize,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before the runtime's threads start and touch memory (src/memory.rs).
    let tuned = matches!(cli.command, None | Some(Command::Serve)).then(memory::tune);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("quotad: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(run(cli, tuned))
}

async fn run(cli: Cli, tuned: Option<memory::Tuned>) -> ExitCode {
    let config = cli.config;
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            let settings = match setup(config) {
                Ok(s) => s,
                Err(code) => return code,
            };
            if let Some(t) = tuned {
                tracing::info!(
                    transparent_huge_pages_off = t.huge_pages_off,
                    allocator_purge_delay_ms = t.purge_delay_set.then_some(memory::PURGE_DELAY_MS),
                    "memory settings"
                );
            }
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
                    tracing::error!(hits = n, "exiting with admitted hits not written");
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
            if let Err(e) = quotad::config::tokens::check_strength(token) {
                eprintln!("quotad hash-token: {e}");
                return ExitCode::from(2);
            }
            println!("{}", quotad::config::tokens::hash(token));
            ExitCode::SUCCESS
        }
        Command::Audit(args) => {
            let settings = match setup(config) {
                Ok(s) => s,
                Err(code) => return code,
            };
            if let Some(Err(e)) = args.tenant.as_deref().map(quotad::domain::TenantId::parse) {
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
            let mut opts = match quotad::startup::scylla_options(&settings) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("quotad migrate: {e}");
                    return ExitCode::from(2);
                }
            };
            if let Some(spec) = datacenters {
                match quotad::migrate::datacenters_replication(&spec) {
                    Ok(r) => opts.replication = r,
                    Err(e) => {
                        eprintln!("quotad migrate: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            match quotad::migrate::run(&opts, dry_run, &mut std::io::stdout()).await {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("quotad migrate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Opens the configured store for a command, saying what to do when the embedded one is held.
async fn open_for_cli(settings: &Settings) -> Result<quotad::store::DynStore, String> {
    quotad::startup::open_store(settings).await.map_err(|e| {
        if settings.store.kind == quotad::config::StoreKind::Embedded {
            format!(
                "{e}\n(the embedded store is opened by one process at a time: stop the \
                 service first)"
            )
        } else {
            e.to_string()
        }
    })
}

/// `quotad apply`: exit 2 for a file that cannot be applied, 1 for a store that fails.
async fn apply_file(settings: &Settings, file: &str, dry_run: bool, prune: bool) -> ExitCode {
    let text = if file == "-" {
        let mut t = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut t).map(|_| t)
    } else {
        std::fs::read_to_string(file)
    };
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            eprintln!("quotad apply: {file}: {e}");
            return ExitCode::from(2);
        }
    };
    let desired = match quotad::apply::parse(file, &text) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("quotad apply: {e}");
            return ExitCode::from(2);
        }
    };
    let store = match open_for_cli(settings).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("quotad apply: {e}");
            return ExitCode::FAILURE;
        }
    };
    let changes = match quotad::apply::plan(&store, &desired, prune).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("quotad apply: {e}");
            return ExitCode::FAILURE;
        }
    };
    for c in &changes {
        println!("{}", c.title());
        for l in &c.lines {
            println!("  {l}");
        }
    }
    let n = changes.len();
    if n == 0 {
        println!("no changes");
        return ExitCode::SUCCESS;
    }
    if dry_run {
        println!("dry run: {n} change(s), nothing applied");
        return ExitCode::SUCCESS;
    }
    let actor = format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    match quotad::apply::apply(&store, &changes, &actor).await {
        Ok(()) => {
            if let Err(e) = quotad::store::CounterStore::flush(&*store).await {
                eprintln!("quotad apply: flushing the store: {e}");
                return ExitCode::FAILURE;
            }
            println!("{n} change(s) applied");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("quotad apply: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `quotad export`: the store's policies and overrides as a quotas file on standard output.
async fn export(settings: &Settings, format: &str) -> Result<(), String> {
    let store = open_for_cli(settings).await?;
    let file = quotad::apply::export(&store)
        .await
        .map_err(|e| e.to_string())?;
    let text = if format == "json" {
        serde_json::to_string_pretty(&file).map_err(|e| e.to_string())? + "\n"
    } else {
        serde_yaml_ng::to_string(&file).map_err(|e| e.to_string())?
    };
    print!("{text}");
    Ok(())
}

/// `quotad audit`: pages through the log in the store and prints each entry as the API shows it.
async fn print_audit(settings: &Settings, args: &AuditArgs) -> Result<(), String> {
    use std::io::Write;

    use quotad::store::audit::AuditQuery;

    let store = open_for_cli(settings).await?;
    let mut q = AuditQuery {
        tenant: args.tenant.clone(),
        from: args.from.unwrap_or(0),
        to: args
            .to
            .unwrap_or_else(|| chrono::Utc::now().timestamp_millis() + 60_000),
        before: None,
        limit: 0,
    };
    let mut left = if args.limit == 0 {
        usize::MAX
    } else {
        args.limit
    };
    let mut out = std::io::stdout().lock();
    while left > 0 {
        q.limit = left.min(1000);
        let page = store.audit_page(&q).await.map_err(|e| e.to_string())?;
        let Some(last) = page.last() else { break };
        q.before = Some(last.cursor());
        let full = page.len() == q.limit;
        left -= page.len();
        for e in page {
            let line =
                serde_json::to_string(&quotad::api::AuditView::of(e)).map_err(|e| e.to_string())?;
            if writeln!(out, "{line}").is_err() {
                return Ok(()); // the reader went away (| head)
            }
        }
        if !full {
            break;
        }
    }
    Ok(())
}
