//! How values are written: sizes (`"1GiB"` or a number), cores, counts and `unlimited`,
//! read the same way from a flag, an environment variable or the config file.

use anyhow::{Context, bail};
use serde::Deserialize;

/// TOML lets sizes be written as `1073741824` or `"1GiB"`.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a whole number (`1073741824`) or a size in quotes (`\"1GiB\"`)"
)]
pub(super) enum SizeOrNumber {
    Number(u64),
    Text(String),
}

impl SizeOrNumber {
    pub(super) fn into_text(self) -> String {
        match self {
            SizeOrNumber::Number(n) => n.to_string(),
            SizeOrNumber::Text(text) => text,
        }
    }
}

/// TOML lets a core count be written as `1`, `1.5` or `"unlimited"`.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a number of cores (`1.5`) or `\"unlimited\"`")]
pub(super) enum CoresValue {
    Number(f64),
    Text(String),
}

impl CoresValue {
    pub(super) fn into_text(self) -> String {
        match self {
            CoresValue::Number(n) => n.to_string(),
            CoresValue::Text(text) => text,
        }
    }
}

/// Flag (or environment) first, then the file's text form of a size or count.
pub(super) fn text_or(cli: Option<&String>, file: Option<SizeOrNumber>) -> Option<String> {
    cli.cloned().or(file.map(SizeOrNumber::into_text))
}

/// `1.5` → 1500 millicores; `unlimited` → no limit. At least 0.01 core.
pub(super) fn parse_cores(text: &str) -> anyhow::Result<Option<u64>> {
    let trimmed = text.trim().to_ascii_lowercase();
    if matches!(trimmed.as_str(), "unlimited" | "none") {
        return Ok(None);
    }
    let hint = "hint: write a number of cores such as 1, 0.5 or 2, or `unlimited`";
    let cores: f64 = trimmed.parse().with_context(|| {
        format!("invalid --cpu-cores (`[limits] cpu_cores`) value `{text}`\n{hint}")
    })?;
    if !cores.is_finite() || !(0.01..=4096.0).contains(&cores) {
        bail!("invalid --cpu-cores (`[limits] cpu_cores`) value `{text}`: out of range\n{hint}");
    }
    // Truncation is intended: whole millicores.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(Some((cores * 1000.0).round() as u64))
}

/// `unlimited` (or `none`, `0`) means no limit.
pub(super) fn optional(
    text: &str,
    flag: &str,
    parse: fn(&str) -> anyhow::Result<u64>,
) -> anyhow::Result<Option<u64>> {
    let lowered = text.trim().to_ascii_lowercase();
    if matches!(lowered.as_str(), "unlimited" | "none" | "0") {
        return Ok(None);
    }
    parse(text.trim())
        .map(Some)
        .with_context(|| format!("invalid {flag} value"))
}

/// A plain count: `128`.
pub(super) fn parse_count(text: &str) -> anyhow::Result<u64> {
    text.trim().parse::<u64>().with_context(|| {
        format!("`{text}` is not a whole number\nhint: write a number such as 128, or `unlimited`")
    })
}

/// The fewest processes a run can have: the runner and its reaper (which reports how the run
/// ended); with fewer, no sandbox starts and bubblewrap's own error says only `Resource
/// temporarily unavailable`.
pub(super) const MIN_PROCESSES: u64 = 2;

/// A process limit: a count of at least [`MIN_PROCESSES`].
pub(super) fn parse_process_limit(text: &str) -> anyhow::Result<u64> {
    check_process_limit(parse_count(text)?)
}

/// `count`, if a run can start under it (the server's limit or a profile's).
pub(super) fn check_process_limit(count: u64) -> anyhow::Result<u64> {
    if count < MIN_PROCESSES {
        bail!(
            "a run needs at least {MIN_PROCESSES} processes (the runner and the reaper that reports how it ended), got {count}\nhint: give {MIN_PROCESSES} or more (more for a script that starts processes of its own), or leave the limit out"
        );
    }
    Ok(count)
}

/// A size (`1024`, `512K`, `64MiB`, `1.5G`; see [`snakebox_engine::parse_size`]).
pub(super) fn parse_size(text: &str) -> anyhow::Result<u64> {
    snakebox_engine::parse_size(text)
        .map_err(|err| anyhow::anyhow!("{err}\nhint: {}", snakebox_engine::SIZE_HINT))
}

/// A memory limit: a size of at least 16MiB.
pub(super) fn parse_memory_limit(text: &str) -> anyhow::Result<u64> {
    snakebox_engine::parse_memory_limit(text).map_err(|err| match err {
        snakebox_engine::SizeError::TooSmall(_) => {
            anyhow::anyhow!("{err}\nhint: give 16MiB or more: Python needs some memory to start")
        }
        err => anyhow::anyhow!("{err}\nhint: {}", snakebox_engine::SIZE_HINT),
    })
}
