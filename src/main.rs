//! quotad: sets up the process (the allocator, memory tuning for `serve`, the async runtime)
//! and runs the command line (`quotad::cli`).

use std::process::ExitCode;

use clap::Parser;
use quotad::cli::{Cli, Command, MemoryNote};

use quotad::os::memory;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before the runtime's threads start and touch memory (src/os/memory.rs).
    let tuned = matches!(cli.command, None | Some(Command::Serve)).then(memory::tune);
    let note = tuned.map(|t| MemoryNote {
        huge_pages_off: t.huge_pages_off,
        purge_delay_ms: t.purge_delay_set.then_some(memory::PURGE_DELAY_MS),
    });
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
    rt.block_on(quotad::cli::run(cli, note))
}
