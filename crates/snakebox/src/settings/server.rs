//! `[server]`: the data directory, the shared database, runs at once, the default profile,
//! the compatibility tool sets and the directories uploads may read, the largest stdio message
//! and the audit writer's queue.

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::Deserialize;
use snakebox_engine::{CompatToolSet, EngineConfig};

use super::values::{SizeOrNumber, parse_size};
use crate::cli::ServerArgs;

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ServerFile {
    pub(super) profile: Option<String>,
    pub(super) compat_tools: Option<CompatToolsFile>,
    pub(super) upload_dirs: Option<Vec<PathBuf>>,
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
    // The command line (or its variable) wins over the file, whole.
    config.compat_tools = match (&args.compat_tools, file.compat_tools) {
        (Some(text), _) => parse_compat_tools(text).context("invalid --compat-tools")?,
        (None, Some(CompatToolsFile::Switch(on))) => {
            if on {
                vec![CompatToolSet::Ibm]
            } else {
                Vec::new()
            }
        }
        (None, Some(CompatToolsFile::Text(text))) => {
            parse_compat_tools(&text).context("invalid `[server] compat_tools`")?
        }
        (None, Some(CompatToolsFile::List(names))) => {
            parse_compat_tools(&names.join(",")).context("invalid `[server] compat_tools`")?
        }
        (None, None) => Vec::new(),
    };
    let upload_dirs = args.upload_dirs.clone().or(file.upload_dirs);
    config.upload_dirs = resolve_upload_dirs(upload_dirs.as_deref().unwrap_or_default())?;
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

/// `[server] compat_tools`: `true`/`false`, a comma-separated string, or a list of names.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum CompatToolsFile {
    Switch(bool),
    Text(String),
    List(Vec<String>),
}

/// The tool sets `text` names: `true`, `1`, `yes`, `on` or nothing is `ibm` (what the flag
/// meant when it was a switch); `false`, `0`, `no`, `off` or `none` is none; otherwise
/// comma-separated names of [`CompatToolSet`].
pub(super) fn parse_compat_tools(text: &str) -> anyhow::Result<Vec<CompatToolSet>> {
    let names = || {
        CompatToolSet::ALL
            .iter()
            .map(|set| set.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "true" | "1" | "yes" | "on" => return Ok(vec![CompatToolSet::Ibm]),
        "false" | "0" | "no" | "off" | "none" => return Ok(Vec::new()),
        _ => {}
    }
    let mut sets = Vec::new();
    for name in text
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
    {
        let Some(set) = CompatToolSet::from_name(name) else {
            bail!(
                "unknown tool set `{name}`\nhint: the tool sets are {}; give one or more, comma-separated (`--compat-tools python-mcp-sandbox,code-executor`)",
                names()
            );
        };
        sets.push(set);
    }
    sets.sort_unstable();
    sets.dedup();
    if sets.contains(&CompatToolSet::Ibm) && sets.contains(&CompatToolSet::CodeExecutor) {
        bail!(
            "the tool sets `ibm` and `code-executor` cannot be served together: both have a tool named `get_sandbox_info`, with different answers\nhint: serve one of them (`--compat-tools ibm` or `--compat-tools code-executor`), with `python-mcp-sandbox` beside either if you like"
        );
    }
    Ok(sets)
}

/// The directories `upload_file_to_sandbox` may read, each canonical (symlinks resolved, so
/// a file's canonical path is compared with them) and each an existing directory.
pub(super) fn resolve_upload_dirs(dirs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut resolved = Vec::new();
    for dir in dirs.iter().filter(|dir| !dir.as_os_str().is_empty()) {
        if dir.is_relative() {
            bail!(
                "--upload-dirs (`[server] upload_dirs`) needs absolute paths, got `{}`\nhint: give the full path, e.g. `/srv/uploads`",
                dir.display()
            );
        }
        let canonical = match dir.canonicalize() {
            Ok(canonical) => canonical,
            Err(error) => bail!(
                "--upload-dirs (`[server] upload_dirs`): a directory cannot be resolved ({error}): `{}`\nhint: create the directory, or remove it from the list",
                dir.display()
            ),
        };
        if !canonical.is_dir() {
            bail!(
                "--upload-dirs (`[server] upload_dirs`): not a directory: `{}`\nhint: name the directory the files are in",
                dir.display()
            );
        }
        resolved.push(canonical);
    }
    resolved.sort();
    resolved.dedup();
    Ok(resolved)
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
