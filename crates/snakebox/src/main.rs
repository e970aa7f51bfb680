//! The `snakebox` binary: parse the command line and hand over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    // This program is also fuse2fs's two helpers, by other names (see `fuse_helper`).
    if let Some(code) = snakebox::fuse_helper() {
        return code;
    }
    snakebox::run(snakebox::cli::Cli::parse())
}
