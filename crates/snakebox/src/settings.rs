//! Settings resolution: command line, then environment variables (both through clap), then the
//! config file, then defaults, merged into one [`EngineConfig`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use snakebox_engine::EngineConfig;
use snakebox_sandbox::BackendKind;

use crate::cli::{BackendArg, EngineArgs, NetworkArg, Switch};

/// Largest `--warm-pool`: every pooled sandbox is a waiting interpreter.
const MAX_WARM_POOL: usize = 64;

/// The config file: the same settings as the long flags, with `_` for `-`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    python_version: Option<String>,
    sandbox_backend: Option<BackendArg>,
    max_timeout: Option<u64>,
    default_timeout: Option<u64>,
    max_output_bytes: Option<u64>,
    no_warm_cache: Option<bool>,
    warm_pool: Option<usize>,
    fork_server: Option<Switch>,
    uv_path: Option<PathBuf>,
    bwrap_path: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    network: Option<NetworkArg>,
    memory_limit: Option<SizeOrNumber>,
    max_processes: Option<SizeOrNumber>,
    cpu_limit: Option<SizeOrNumber>,
    cpu_cores: Option<CoresValue>,
    scratch_limit: Option<SizeOrNumber>,
    max_script_bytes: Option<SizeOrNumber>,
    cache_max_size: Option<SizeOrNumber>,
    cache_max_age_days: Option<u64>,
    max_concurrent_runs: Option<usize>,
    session_idle_stop: Option<u64>,
    session_idle_delete: Option<u64>,
    max_sessions: Option<usize>,
    sessions_max_disk: Option<SizeOrNumber>,
    session_max_interpreters: Option<usize>,
    artifact_max_age_hours: Option<u64>,
    artifact_max_size: Option<SizeOrNumber>,
    allow_sdist_builds: Option<bool>,
    install_timeout: Option<u64>,
}

/// TOML lets sizes be written as `1073741824` or `"1GiB"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SizeOrNumber {
    Number(u64),
    Text(String),
}

/// TOML lets a core count be written as `1`, `1.5` or `"unlimited"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum CoresValue {
    Number(f64),
    Text(String),
}

impl CoresValue {
    fn into_text(self) -> String {
        match self {
            CoresValue::Number(n) => n.to_string(),
            CoresValue::Text(text) => text,
        }
    }
}

/// `1.5` → 1500 millicores; `unlimited` → no limit. At least 0.01 core.
fn parse_cores(text: &str) -> anyhow::Result<Option<u64>> {
    let trimmed = text.trim().to_ascii_lowercase();
    if matches!(trimmed.as_str(), "unlimited" | "none") {
        return Ok(None);
    }
    let hint = "hint: write a number of cores such as 1, 0.5 or 2, or `unlimited`";
    let cores: f64 = trimmed
        .parse()
        .with_context(|| format!("invalid --cpu-cores value `{text}`\n{hint}"))?;
    if !cores.is_finite() || !(0.01..=4096.0).contains(&cores) {
        bail!("invalid --cpu-cores value `{text}`: out of range\n{hint}");
    }
    // Truncation is intended: whole millicores.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(Some((cores * 1000.0).round() as u64))
}

impl SizeOrNumber {
    fn into_text(self) -> String {
        match self {
            SizeOrNumber::Number(n) => n.to_string(),
            SizeOrNumber::Text(text) => text,
        }
    }
}

/// Merge CLI/env arguments with the config file and defaults.
///
/// # Errors
/// An unreadable or invalid config file, or a value that does not parse; the message names
/// the setting and says what is accepted.
pub(crate) fn resolve(args: &EngineArgs) -> anyhow::Result<EngineConfig> {
    let file = load_file(args.config.as_deref())?;
    let backend = match args.sandbox_backend.or(file.sandbox_backend) {
        Some(BackendArg::None) => BackendKind::None,
        Some(BackendArg::Native) | None => BackendKind::Native,
    };
    let data_dir = args
        .data_dir
        .clone()
        .or(file.data_dir)
        .unwrap_or_else(default_data_dir);
    let mut config = EngineConfig::new(data_dir, backend);
    config.python_version = args.python_version.clone().or(file.python_version);
    config.uv_path = args.uv_path.clone().or(file.uv_path);
    config.bwrap_path = args.bwrap_path.clone().or(file.bwrap_path);
    if let Some(seconds) = args.max_timeout.or(file.max_timeout) {
        if seconds == 0 {
            bail!("--max-timeout must be at least 1 second");
        }
        config.max_timeout = Duration::from_secs(seconds);
    }
    if let Some(seconds) = args.default_timeout.or(file.default_timeout) {
        if seconds == 0 {
            bail!("--default-timeout must be at least 1 second");
        }
        config.default_timeout = Duration::from_secs(seconds);
    }
    if config.default_timeout > config.max_timeout {
        bail!(
            "--default-timeout ({} s) is larger than --max-timeout ({} s)\nhint: raise --max-timeout or lower --default-timeout",
            config.default_timeout.as_secs(),
            config.max_timeout.as_secs()
        );
    }
    if let Some(bytes) = args.max_output_bytes.or(file.max_output_bytes) {
        if bytes < 1024 {
            bail!("--max-output-bytes must be at least 1024, got `{bytes}`");
        }
        config.max_output_bytes = bytes;
    }
    config.warm_cache = !(args.no_warm_cache || file.no_warm_cache.unwrap_or(false));
    if let Some(size) = args.warm_pool.or(file.warm_pool) {
        if size > MAX_WARM_POOL {
            bail!("--warm-pool must be at most {MAX_WARM_POOL}, got `{size}`");
        }
        config.warm_pool = size;
    }
    config.fork_server = args.fork_server.or(file.fork_server) != Some(Switch::Off);
    config.network = args.network.or(file.network) == Some(NetworkArg::On);
    config.allow_sdist_builds = args.allow_sdist_builds || file.allow_sdist_builds.unwrap_or(false);
    if let Some(seconds) = args.install_timeout.or(file.install_timeout) {
        if seconds == 0 {
            bail!("--install-timeout must be at least 1 second\nhint: the default is 300");
        }
        config.install_timeout = Duration::from_secs(seconds);
    }

    let pick = |cli: &Option<String>, file: Option<SizeOrNumber>| {
        cli.clone().or(file.map(SizeOrNumber::into_text))
    };
    if let Some(text) = pick(&args.memory_limit, file.memory_limit) {
        config.memory_bytes = optional(&text, "--memory-limit", parse_size)?;
    }
    if let Some(text) = pick(&args.max_processes, file.max_processes) {
        config.max_processes = optional(&text, "--max-processes", parse_count)?;
    }
    if let Some(text) = pick(&args.cpu_limit, file.cpu_limit) {
        config.cpu_time = optional(&text, "--cpu-limit", parse_count)?.map(Duration::from_secs);
    }
    let cores = args
        .cpu_cores
        .clone()
        .or(file.cpu_cores.map(CoresValue::into_text));
    if let Some(text) = cores {
        config.cpu_millicores = parse_cores(&text)?;
    }
    if let Some(text) = pick(&args.scratch_limit, file.scratch_limit) {
        config.scratch_bytes = optional(&text, "--scratch-limit", parse_size)?;
    }
    if let Some(text) = pick(&args.max_script_bytes, file.max_script_bytes) {
        let bytes = parse_size(&text).with_context(|| "invalid --max-script-bytes")?;
        config.max_script_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    }
    if let Some(text) = pick(&args.cache_max_size, file.cache_max_size) {
        config.cache_max_bytes = parse_size(&text).with_context(|| "invalid --cache-max-size")?;
    }
    if let Some(days) = args.cache_max_age_days.or(file.cache_max_age_days) {
        config.cache_max_age = Duration::from_secs(days.saturating_mul(86_400));
    }
    if let Some(runs) = args.max_concurrent_runs.or(file.max_concurrent_runs) {
        if runs == 0 {
            bail!("--max-concurrent-runs must be at least 1");
        }
        config.max_concurrent_runs = runs;
    }
    if let Some(seconds) = args.session_idle_stop.or(file.session_idle_stop) {
        if seconds == 0 {
            bail!("--session-idle-stop must be at least 1 second");
        }
        config.sessions.idle_stop = Duration::from_secs(seconds);
    }
    if let Some(seconds) = args.session_idle_delete.or(file.session_idle_delete) {
        if seconds == 0 {
            bail!("--session-idle-delete must be at least 1 second");
        }
        config.sessions.idle_delete = Duration::from_secs(seconds);
    }
    if let Some(count) = args.max_sessions.or(file.max_sessions) {
        config.sessions.max_sessions = count;
    }
    if let Some(text) = pick(&args.sessions_max_disk, file.sessions_max_disk) {
        config.sessions.max_disk_bytes =
            parse_size(&text).with_context(|| "invalid --sessions-max-disk")?;
    }
    if let Some(count) = args
        .session_max_interpreters
        .or(file.session_max_interpreters)
    {
        if count == 0 {
            bail!("--session-max-interpreters must be at least 1");
        }
        config.sessions.max_interpreters = count;
    }
    if let Some(hours) = args.artifact_max_age_hours.or(file.artifact_max_age_hours) {
        if hours == 0 {
            bail!("--artifact-max-age-hours must be at least 1");
        }
        config.artifact_max_age = Duration::from_secs(hours.saturating_mul(3600));
    }
    if let Some(text) = pick(&args.artifact_max_size, file.artifact_max_size) {
        config.artifact_max_bytes =
            parse_size(&text).with_context(|| "invalid --artifact-max-size")?;
    }
    Ok(config)
}

fn load_file(explicit: Option<&Path>) -> anyhow::Result<FileSettings> {
    let path = match explicit {
        Some(path) => path.to_path_buf(),
        None => match default_config_path() {
            Some(path) if path.is_file() => path,
            _ => return Ok(FileSettings::default()),
        },
    };
    let text = fs_err::read_to_string(&path)
        .with_context(|| "could not read the config file\nhint: check the --config path")?;
    toml::from_str(&text).with_context(|| {
        format!(
            "invalid config file `{}`\nhint: keys are the long flag names with `_`, e.g. `max_timeout = 120`",
            path.display()
        )
    })
}

fn default_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(base.join("snakebox").join("config.toml"))
}

fn default_data_dir() -> PathBuf {
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

/// `unlimited` (or `none`, `0`) means no limit.
fn optional(
    text: &str,
    flag: &str,
    parse: fn(&str) -> anyhow::Result<u64>,
) -> anyhow::Result<Option<u64>> {
    let lowered = text.trim().to_ascii_lowercase();
    if matches!(lowered.as_str(), "unlimited" | "none" | "0") {
        return Ok(None);
    }
    parse(&lowered)
        .map(Some)
        .with_context(|| format!("invalid {flag} value"))
}

/// A plain count: `128`.
fn parse_count(text: &str) -> anyhow::Result<u64> {
    text.trim().parse::<u64>().with_context(|| {
        format!("`{text}` is not a whole number\nhint: write a number such as 128, or `unlimited`")
    })
}

/// A size: `1024`, `512K`, `512KiB`, `64M`, `64MiB`, `2G`, `2GiB` (all binary multiples).
pub(crate) fn parse_size(text: &str) -> anyhow::Result<u64> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let hint = "hint: write a size such as 1048576, 512MiB or 2G";
    let value: u64 = number
        .parse()
        .with_context(|| format!("`{text}` is not a size\n{hint}"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => bail!("unknown size unit `{other}` in `{text}`\n{hint}"),
    };
    value
        .checked_mul(multiplier)
        .with_context(|| format!("`{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn cores_parse_to_millicores() {
        assert_eq!(parse_cores("1").unwrap(), Some(1000));
        assert_eq!(parse_cores("0.5").unwrap(), Some(500));
        assert_eq!(parse_cores("unlimited").unwrap(), None);
        assert!(parse_cores("0").is_err());
        assert!(parse_cores("lots").is_err());
    }

    #[test]
    fn unlimited_means_none() {
        assert_eq!(optional("unlimited", "--x", parse_size).unwrap(), None);
        assert_eq!(optional("1G", "--x", parse_size).unwrap(), Some(1 << 30));
    }

    #[test]
    fn cli_wins_over_file_and_file_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs_err::write(
            &path,
            "max_timeout = 120\ndefault_timeout = 10\nmemory_limit = \"256MiB\"\nnetwork = \"on\"\nfork_server = \"off\"\nallow_sdist_builds = true\ninstall_timeout = 90\n",
        )
        .unwrap();
        let args = EngineArgs {
            config: Some(path),
            default_timeout: Some(20),
            ..EngineArgs::default()
        };
        let config = resolve(&args).unwrap();
        assert_eq!(config.max_timeout, Duration::from_secs(120));
        assert_eq!(config.default_timeout, Duration::from_secs(20));
        assert_eq!(config.memory_bytes, Some(256 << 20));
        assert!(config.network);
        assert!(!config.fork_server);
        assert!(config.allow_sdist_builds);
        assert_eq!(config.install_timeout, Duration::from_secs(90));
        assert_eq!(config.backend, BackendKind::Native);
        // On unless turned off; wheels only unless builds are allowed.
        let empty = dir.path().join("empty.toml");
        fs_err::write(&empty, "").unwrap();
        let args = EngineArgs {
            config: Some(empty),
            ..EngineArgs::default()
        };
        let config = resolve(&args).unwrap();
        assert!(config.fork_server);
        assert!(!config.allow_sdist_builds);
        assert_eq!(
            config.install_timeout,
            snakebox_env::DEFAULT_INSTALL_TIMEOUT
        );
    }

    #[test]
    fn unknown_config_keys_are_rejected_with_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs_err::write(&path, "max_timeuot = 5\n").unwrap();
        let args = EngineArgs {
            config: Some(path),
            ..EngineArgs::default()
        };
        let err = format!("{:#}", resolve(&args).unwrap_err());
        assert!(err.contains("max_timeuot"), "{err}");
        assert!(err.contains("hint"), "{err}");
    }
}
