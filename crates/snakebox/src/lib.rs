//! The snakebox binary's library: wires resolved settings to the engine and runs a subcommand.
//!
//! Output discipline: `serve` writes nothing but MCP to stdout (logs go to stderr); `run`
//! writes the script's stdout to stdout and everything else to stderr; `check` prints its
//! report to stdout.

pub mod cli;
mod commands;
mod memory;
mod rooms;
mod settings;

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command};

/// When this process was started as one of `fuse2fs`'s helpers (a normal user's sessions'
/// disk: `fusermount` and a guard, inside `fuse2fs`'s sandbox), act as it and give its exit
/// code; otherwise `None` (and this program may serve images over FUSE). Before the command
/// line is parsed: the helpers have arguments of their own.
#[must_use]
pub fn fuse_helper() -> Option<ExitCode> {
    snakebox_sandbox::run_fuse_helper().map(|code| ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// Run the command line. Returns the process exit code.
#[must_use]
pub fn run(cli: Cli) -> ExitCode {
    // `serve` reports its state at start-up; the terminal commands only warn.
    init_logging(
        if matches!(cli.command, Command::Serve(_) | Command::Agent(_)) {
            "info"
        } else {
            "warn"
        },
    );
    if matches!(cli.command, Command::Serve(_) | Command::Agent(_)) {
        memory::limit_arenas();
    }
    // Before any thread: a normal user's server mounts its runs' capped /work in a mount
    // namespace of its own (`check` enters it too, to report what `serve` enforces).
    if matches!(
        cli.command,
        Command::Serve(_) | Command::Agent(_) | Command::Run(_) | Command::Check(_)
    ) && let Err(err) = snakebox_sandbox::enter_own_mount_namespace()
    {
        tracing::warn!(%err, "could not make a user and mount namespace of our own: runs' /work is not size-capped");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            commands::report_error(
                &anyhow::anyhow!(err).context("could not start the async runtime"),
            );
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => commands::serve(&args).await,
            Command::Agent(args) => commands::agent(&args).await,
            Command::Keys(args) => commands::keys(&args),
            Command::Run(args) => commands::run(args).await,
            Command::Check(args) => commands::check(&args).await,
            Command::Audit(args) => commands::audit(&args),
            Command::Python(args) => commands::python(args).await,
            Command::Image(args) => commands::image(&args).await,
            Command::ClientConfig(args) => commands::client_config(&args),
        }
    });
    // Bounded: a task that never ends (a blocking read of stdin) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match outcome {
        Ok(code) => code,
        Err(err) => {
            commands::report_error(&err);
            ExitCode::from(2)
        }
    }
}

/// Logs go to stderr only (stdout carries MCP); level from `SNAKEBOX_LOG`.
fn init_logging(default_level: &str) {
    use std::io::IsTerminal;
    let filter =
        EnvFilter::try_from_env("SNAKEBOX_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}
