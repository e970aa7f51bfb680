//! `[pool]`: warm sandboxes, the fork server, its preloads and pre-forked children.

use anyhow::bail;
use serde::Deserialize;
use snakebox_engine::EngineConfig;

use crate::cli::{PoolArgs, Switch};

/// Largest `--warm-pool`: every pooled sandbox is a waiting interpreter.
pub(super) const MAX_WARM_POOL: usize = 64;

/// `[pool]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PoolFile {
    pub(super) size: Option<usize>,
    pub(super) fork_server: Option<Switch>,
    pub(super) preload_packages: Option<usize>,
    pub(super) prefork: Option<usize>,
}

pub(super) fn resolve_pool(
    args: &PoolArgs,
    file: &PoolFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    if let Some(size) = args.warm_pool.or(file.size) {
        if size > MAX_WARM_POOL {
            bail!(
                "--warm-pool must be at most {MAX_WARM_POOL}, got `{size}`\nhint: each pre-started sandbox holds a uid and memory while idle; 2 serves most hosts (0 turns the pool off)"
            );
        }
        config.warm_pool = size;
    }
    // The docker backend cannot fork runs: its warm pool is its containers.
    config.fork_server =
        args.fork_server.or(file.fork_server) != Some(Switch::Off) && config.backend.forks_runs();
    if let Some(count) = args.preload_packages.or(file.preload_packages) {
        if count > snakebox_engine::MAX_PRELOAD_PACKAGES {
            bail!(
                "--preload-packages must be at most {}, got `{count}`\nhint: preloading beyond the heaviest few packages costs each fork server memory for little gain; the default is 8",
                snakebox_engine::MAX_PRELOAD_PACKAGES
            );
        }
        config.preload_packages = count;
    }
    if let Some(count) = args.prefork.or(file.prefork) {
        if count > snakebox_sandbox::MAX_PREFORK {
            bail!(
                "--prefork must be at most {}, got `{count}`",
                snakebox_sandbox::MAX_PREFORK
            );
        }
        config.prefork = count;
    }
    Ok(())
}
