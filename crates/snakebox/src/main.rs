//! The `snakebox` binary: parse the command line and hand over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    snakebox::run(snakebox::cli::Cli::parse())
}
