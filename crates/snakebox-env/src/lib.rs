//! Python environments for snakebox: which interpreters exist, and uv-built virtual environments
//! kept in a cache keyed by content.
//!
//! This crate owns interpreter discovery and version requests ([`Interpreters`]), finding and
//! running uv ([`Uv`], [`UvRunner`]), and the environment cache ([`EnvCache`]): building,
//! reusing, warming and pruning. It knows nothing of MCP and never runs user code; it depends on
//! `snakebox-sandbox` only for the data types of a mount and, when installs are sandboxed, to
//! run uv.
//!
//! The one design decision that shapes it: an environment is built once per (interpreter,
//! requirement set), in a temporary directory, then renamed into place and never modified
//! again; every later run reuses it read-only. A dependency's code is as untrusted as the
//! script, so a build has two steps (the `install` module; the steps are one pipeline,
//! [`InstallPipeline`], that the engine's session installs use too): trusted uv downloads and unpacks
//! wheels only, with the operator's index settings ([`EnvVars`]), write access to uv's cache
//! and the network only through an egress proxy, running no package code; then everything
//! that runs package code (bytecode compilation, opt-in sdist builds) runs as
//! [`Role::PackageCode`]: a run's identity and limits, no network, no credentials, uv's cache
//! not mounted. A new environment is published only after it is verified (the `verify`
//! module: installed files against their `RECORD`, compiled files loadable); a build that
//! fails, for lack of space included ([`space`]), leaves nothing behind. The run step (the
//! engine's business) mounts the finished environment read-only ([`Environment::mounts`])
//! and never sees uv's cache.

mod cache;
mod env_vars;
mod error;
mod install;
mod interpreter;
mod pipeline;
pub mod space;
mod uv;
mod verify;

pub use cache::{
    CacheConfig, CacheStats, CompileStats, DEFAULT_INSTALL_TIMEOUT, EnvCache, Environment,
    MANIFEST_FILE, PruneReason, PruneReport, PrunedEnvironment, ResolvedPackage,
};
pub use env_vars::{EnvVars, InstallNetwork, UvEnvironment};
pub use error::{EnvError, INSTALL_HOSTS_HINT, NO_SPACE_HINT, UvStderr};
pub use install::{
    BuildSettings, PACKAGE_CODE_CWD, check_requirement_strings, check_requirement_urls,
    hand_to_package_code, installed_packages, is_missing_wheel, point_scripts_at_venv,
    site_packages, take_back_from_package_code,
};
pub use interpreter::{
    Interpreter, Interpreters, PYTHON_INSTALL_TIMEOUT, SkippedInterpreter, install_python,
};
pub use pipeline::{
    DownloadTarget, DownloaderStep, InstallPipeline, requirements_file_args, venv_python,
};
pub use uv::{
    DirectUvRunner, Egress, IntoUvRunner, PackageIdentity, Role, Uv, UvInvocation, UvOutput,
    UvRunFuture, UvRunner, explain_refusals, install_read_only_paths, run_sandboxed,
};
pub use verify::{
    Mismatch, check_records, damaged_compile, is_damaged_compile, remove_damaged_pycs,
};
