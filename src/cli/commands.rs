//! The bodies of the commands that work on the store: `apply`, `export` and `audit`.

use std::process::ExitCode;

use super::AuditArgs;
use crate::config::Settings;

/// Opens the configured store for a command, saying what to do when the embedded one is held.
async fn open_for_cli(settings: &Settings) -> Result<crate::store::DynStore, String> {
    crate::startup::open_store(settings).await.map_err(|e| {
        if settings.store.kind == crate::config::StoreKind::Embedded {
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
pub(super) async fn apply_file(
    settings: &Settings,
    file: &str,
    dry_run: bool,
    prune: bool,
) -> ExitCode {
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
    let desired = match super::apply::parse(file, &text) {
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
    let changes = match super::apply::plan(&store, &desired, prune).await {
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
    match super::apply::apply(&store, &changes, &actor).await {
        Ok(()) => {
            if let Err(e) = crate::store::CounterStore::flush(&*store).await {
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
pub(super) async fn export(settings: &Settings, format: &str) -> Result<(), String> {
    let store = open_for_cli(settings).await?;
    let file = super::apply::export(&store)
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
pub(super) async fn print_audit(settings: &Settings, args: &AuditArgs) -> Result<(), String> {
    use std::io::Write;

    use crate::store::audit::AuditQuery;

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
                serde_json::to_string(&crate::http::AuditView::of(e)).map_err(|e| e.to_string())?;
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
