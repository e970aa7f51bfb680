//! `[server]`: the data directory, the shared database, runs at once, the default profile,
//! the compatibility tools, the largest stdio message and the audit writer's queue.

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::Deserialize;
use snakebox_engine::EngineConfig;

use super::values::{SizeOrNumber, parse_size};
use crate::cli::ServerArgs;

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ServerFile {
    pub(super) profile: Option<String>,
    pub(super) compat_tools: Option<bool>,
    pub(super) data_dir: Option<PathBuf>,
    pub(super) max_concurrent_runs: Option<usize>,
    pub(super) max_frame_bytes: Option<SizeOrNumber>,
    pub(super) audit_queue_size: Option<SizeOrNumber>,
    pub(super) database: Option<String>,
}

pub(super) fn resolve_server(
    args: &ServerArgs,
    file: ServerFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    config.compat_tools = args.compat_tools || file.compat_tools.unwrap_or(false);
    if let Some(profile) = file.profile {
        // Checked against the profiles once `[profiles]` is read.
        config.profiles.default = profile;
    }
    config.data_dir = args
        .data_dir
        .clone()
        .or(file.data_dir)
        .unwrap_or_else(default_data_dir);
    config.database = resolve_database(args.database.as_deref().or(file.database.as_deref()))?;
    if let Some(runs) = args.max_concurrent_runs.or(file.max_concurrent_runs) {
        if runs == 0 {
            bail!("--max-concurrent-runs must be at least 1");
        }
        config.max_concurrent_runs = runs;
    }
    Ok(())
}

/// `--database` (`SNAKEBOX_DATABASE`, `[server] database`): parsed once, here; an empty value
/// is the data directory's store. The message never repeats the URL (it may hold a password).
fn resolve_database(text: Option<&str>) -> anyhow::Result<Option<snakebox_engine::DatabaseUrl>> {
    let Some(text) = text.map(str::trim).filter(|text| !text.is_empty()) else {
        return Ok(None);
    };
    text.parse()
        .map(Some)
        .map_err(|err: snakebox_engine::PgError| {
            anyhow::anyhow!(
                "{err} (--database, `SNAKEBOX_DATABASE`, `[server] database`)\nhint: {}",
                err.hint()
            )
        })
}

pub(super) fn default_data_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/snakebox");
    }
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local").join("share"))
        })
        .unwrap_or_else(std::env::temp_dir)
        .join("snakebox")
}

/// The largest stdio message: at least 64 KiB and at most 1 GiB (it is held whole while it is
/// read), and room for a script at the script limit. By default 16 MiB (a 10 MiB session
/// file in base64 fits), or twice the script limit when that is larger.
pub(super) fn resolve_frame(text: Option<&str>, max_script_bytes: usize) -> anyhow::Result<usize> {
    let Some(text) = text else {
        return Ok(snakebox_server::DEFAULT_MAX_FRAME_BYTES.max(max_script_bytes.saturating_mul(2)));
    };
    let bytes = parse_size(text)
        .with_context(|| "invalid --max-frame-bytes (`[server] max_frame_bytes`)")?;
    if !(64 << 10..=1 << 30).contains(&bytes) {
        bail!(
            "--max-frame-bytes must be between 64KiB and 1GiB, got `{text}`\nhint: the default is 16MiB"
        );
    }
    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    if bytes <= max_script_bytes {
        bail!(
            "--max-frame-bytes (`{text}`) leaves no room for a script of --max-script-bytes ({max_script_bytes} bytes)\nhint: make --max-frame-bytes larger than --max-script-bytes (twice it leaves room for JSON escapes), or lower --max-script-bytes"
        );
    }
    Ok(bytes)
}

/// `[server] audit_queue_size`: bytes of records queued for the writer.
pub(super) fn resolve_audit_queue(
    text: Option<&str>,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    let Some(text) = text else {
        return Ok(());
    };
    let bytes = parse_size(text)
        .with_context(|| "invalid --audit-queue-size (`[server] audit_queue_size`)")?;
    if bytes < snakebox_engine::MIN_AUDIT_QUEUE_BYTES {
        bail!(
            "--audit-queue-size (`[server] audit_queue_size`) must be at least {} bytes\nhint: give a size such as `1MiB` or more, or leave it unset for the default (64MiB)",
            snakebox_engine::MIN_AUDIT_QUEUE_BYTES
        );
    }
    config.store_budgets.audit_queue_bytes = bytes;
    Ok(())
}
