//! Settings resolution: command line, then environment variables (both through clap), then the
//! config file, then defaults, merged into one [`EngineConfig`].
//!
//! The config file is sectioned. The sections follow what each setting governs, which is also
//! where the engine keeps it and where the next settings will go:
//!
//! | section | holds | grows into |
//! |---|---|---|
//! | `[server]` | the data directory, runs at once, the largest stdio message, the audit writer's queue | the serve lifecycle |
//! | `[python]` | default interpreter version, the uv binary | interpreter choice per profile |
//! | `[sandbox]` | the backend, the bwrap binary, the docker runtime | the docker engine's socket |
//! | `[network]` | what runs and installs may reach, the run proxy's caps | egress policies |
//! | `[limits]` | what one run may use: time, output, memory, processes, CPU, scratch, script size | `[profiles]` (limit sets) |
//! | `[pool]` | warm sandboxes and the fork server | |
//! | `[cache]` | the environment cache: warming, builds, size and age | |
//! | `[sessions]` | persistent sessions: idle times, count, disk, interpreters | per-tenant quotas |
//! | `[artifacts]` | the artifact store: age and size | |
//! | `[tenants]` | what one tenant may take: runs at once, runs per minute, sessions; what it may keep in the shared stores (runs table, audit log, artifacts); its share of the sessions' disk | |
//! | `[tenants.NAME]` | the same for one tenant set apart, and the profiles it may name and its default profile | tenants' own budgets |
//! | `[profiles.NAME]` | a named policy bundle (network, subprocesses, writable /work, limits, packages, imports, tenants); built-ins `standard`, `basic`, `data_science`, `network`, `filesystem` | |
//! | `[http]` | `serve --http`: address, public URL, allowed hosts and origins, download links' lifetime | |
//!
//! `[limits]` holds only per-run bounds; server-wide capacity (`max_concurrent_runs`) is in
//! `[server]`, and each store's retention is in the store's own section, so a per-tenant or
//! per-profile `[limits]` can later be a copy of one table. What one tenant may keep in a
//! shared store is a tenant's budget, so it is in `[tenants]` beside its other quotas.
//!
//! One tenant's own settings are `[tenants.NAME]` sub-tables of `[tenants]`, not a
//! `[[tenants]]` array: TOML cannot hold an array and the `[tenants]` table (the defaults,
//! written by every earlier file) under one name. [`sectioned`] takes the sub-tables out of
//! `[tenants]` (checking their names and keys), and a tenant's `profiles` grant what the
//! profiles' own `tenants` lists grant: either list lets the tenant name a profile.
//!
//! One mechanism reads the file: the TOML table is normalised into the sectioned form
//! ([`sectioned`]): every flat key of earlier versions (`max_timeout = 120`, the long flag with
//! `_`) is moved to its place in its section by the one table [`FLAT_KEYS`]; a flat key and its
//! sectioned twin both set is an error naming both; an unknown key is an error with a
//! did-you-mean hint. Then serde reads one struct per section (`deny_unknown_fields`), and
//! [`resolve`] runs one step per section, each taking that section's flags (a flattened clap
//! struct, [`crate::cli`]) and that section of the file: flag or environment, else file, else
//! default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use snakebox_engine::EngineConfig;
use snakebox_sandbox::BackendKind;

use crate::cli::{
    ArtifactsArgs, BackendArg, CacheArgs, EngineArgs, HttpArgs, LimitsArgs, NetworkArgs, PoolArgs,
    PythonArgs, PythonDownloadsArg, SandboxArgs, ServeArgs, ServerArgs, SessionsArgs, Switch,
    TenantsArgs,
};

/// Largest `--warm-pool`: every pooled sandbox is a waiting interpreter.
const MAX_WARM_POOL: usize = 64;

/// `(flat key, section, key in the section)`.
type FlatKey = (&'static str, &'static str, &'static str);

/// Every flat key of earlier versions and its place in the sectioned file:
/// `(flat key, section, key in the section)`. The flat key is the long flag with `_`.
/// This is the one list of file keys: the section structs below must accept exactly these
/// (a test checks it).
const FLAT_KEYS: &[FlatKey] = &[
    ("data_dir", "server", "data_dir"),
    ("max_concurrent_runs", "server", "max_concurrent_runs"),
    ("max_frame_bytes", "server", "max_frame_bytes"),
    ("python_version", "python", "version"),
    ("uv_path", "python", "uv_path"),
    ("python_downloads", "python", "downloads"),
    ("sandbox_backend", "sandbox", "backend"),
    ("bwrap_path", "sandbox", "bwrap_path"),
    ("network", "network", "mode"),
    ("network_resolvers", "network", "resolvers"),
    ("network_ports", "network", "ports"),
    ("network_allow_ip_literals", "network", "allow_ip_literals"),
    ("network_exceptions", "network", "exceptions"),
    ("network_install_hosts", "network", "install_hosts"),
    ("network_max_connections", "network", "max_connections"),
    ("network_max_bytes", "network", "max_bytes"),
    (
        "network_max_connection_seconds",
        "network",
        "max_connection_seconds",
    ),
    ("default_timeout", "limits", "default_timeout"),
    ("max_timeout", "limits", "max_timeout"),
    ("max_output_bytes", "limits", "max_output_bytes"),
    ("memory_limit", "limits", "memory"),
    ("max_processes", "limits", "processes"),
    ("cpu_limit", "limits", "cpu_seconds"),
    ("cpu_cores", "limits", "cpu_cores"),
    ("scratch_limit", "limits", "scratch"),
    ("max_script_bytes", "limits", "max_script_bytes"),
    ("warm_pool", "pool", "size"),
    ("fork_server", "pool", "fork_server"),
    ("preload_packages", "pool", "preload_packages"),
    ("prefork", "pool", "prefork"),
    ("no_warm_cache", "cache", "no_warm"),
    ("allow_sdist_builds", "cache", "allow_sdist_builds"),
    ("install_timeout", "cache", "install_timeout"),
    ("cache_max_size", "cache", "max_size"),
    ("cache_max_age_days", "cache", "max_age_days"),
    ("session_idle_stop", "sessions", "idle_stop"),
    ("session_idle_delete", "sessions", "idle_delete"),
    ("max_sessions", "sessions", "max_sessions"),
    ("sessions_max_disk", "sessions", "max_disk"),
    ("session_max_interpreters", "sessions", "max_interpreters"),
    ("artifact_max_age_hours", "artifacts", "max_age_hours"),
    ("artifact_max_size", "artifacts", "max_size"),
];

/// Keys that exist only in their section (added after the file became sectioned, so they
/// have no flat form): `(section, key)`.
const SECTION_KEYS: &[(&str, &str)] = &[
    ("server", "profile"),
    ("sandbox", "docker_runtime"),
    ("server", "compat_tools"),
    ("http", "addr"),
    ("http", "public_url"),
    ("http", "allowed_hosts"),
    ("http", "allowed_origins"),
    ("http", "insecure_no_auth"),
    ("http", "link_ttl"),
    ("http", "max_body_bytes"),
    ("tenants", "max_concurrent_runs"),
    ("tenants", "runs_per_minute"),
    ("tenants", "max_sessions"),
    ("tenants", "history_max_runs"),
    ("tenants", "history_max_size"),
    ("tenants", "audit_max_size"),
    ("tenants", "artifacts_max_size"),
    ("tenants", "sessions_max_disk"),
    ("server", "audit_queue_size"),
];

/// The sections, in the order the README documents them.
const SECTIONS: &[&str] = &[
    "server",
    "python",
    "sandbox",
    "network",
    "limits",
    "pool",
    "cache",
    "sessions",
    "artifacts",
    "tenants",
    "http",
];

/// The config file, sectioned (after [`sectioned`] has moved any flat keys in).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FileSettings {
    server: ServerFile,
    python: PythonFile,
    sandbox: SandboxFile,
    network: NetworkFile,
    limits: LimitsFile,
    pool: PoolFile,
    cache: CacheFile,
    sessions: SessionsFile,
    artifacts: ArtifactsFile,
    tenants: TenantsFile,
    http: HttpFile,
    /// `[profiles.NAME]`: one table per profile (names are the operator's, so the section's
    /// keys are not checked against a list; each table's keys are).
    profiles: BTreeMap<String, ProfileFile>,
    /// `[tenants.NAME]`: one table per tenant set apart, moved out of `[tenants]` by
    /// [`sectioned`] (under a name no file can write: see [`TENANT_TABLES`]).
    #[serde(rename = "tenants.NAME")]
    tenant_tables: BTreeMap<String, TenantFile>,
}

/// Where [`sectioned`] puts the `[tenants.NAME]` tables (a key no file can hold at the top
/// level: every top-level key is checked before).
const TENANT_TABLES: &str = "tenants.NAME";

/// `[profiles.NAME]`: what the profile changes from the built-in of the same name (or from
/// `standard`, which adds nothing to the server's settings).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    description: Option<String>,
    /// `"off"`, `"server"` or a list of host names (`["api.example.com", "*.example.org"]`).
    network: Option<ProfileNetworkFile>,
    subprocesses: Option<bool>,
    writable_work: Option<bool>,
    timeout: Option<u64>,
    memory: Option<SizeOrNumber>,
    cpu_seconds: Option<u64>,
    processes: Option<u64>,
    max_output_bytes: Option<u64>,
    packages: Option<Vec<String>>,
    allowed_imports: Option<Vec<String>>,
    tenants: Option<Vec<String>>,
}

/// A profile's `network`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ProfileNetworkFile {
    Mode(String),
    Domains(Vec<String>),
}

/// `[tenants]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    max_concurrent_runs: Option<usize>,
    runs_per_minute: Option<u32>,
    max_sessions: Option<usize>,
    history_max_runs: Option<u64>,
    history_max_size: Option<SizeOrNumber>,
    audit_max_size: Option<SizeOrNumber>,
    artifacts_max_size: Option<SizeOrNumber>,
    sessions_max_disk: Option<SizeOrNumber>,
}

/// `[tenants.NAME]`: what one tenant gets instead of the `[tenants]` defaults, and the
/// profiles it may name. Sub-tables, not an array of `[[tenants]]` tables: TOML cannot hold
/// both an array and the `[tenants]` table under one key, and every file written before
/// keeps its `[tenants]` defaults this way.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantFile {
    max_concurrent_runs: Option<usize>,
    runs_per_minute: Option<u32>,
    max_sessions: Option<usize>,
    history_max_runs: Option<u64>,
    history_max_size: Option<SizeOrNumber>,
    audit_max_size: Option<SizeOrNumber>,
    artifacts_max_size: Option<SizeOrNumber>,
    sessions_max_disk: Option<SizeOrNumber>,
    /// Profiles the tenant may name (as if it were in each one's `tenants` list).
    profiles: Option<Vec<String>>,
    /// The profile of its calls that name none.
    default_profile: Option<String>,
}

/// The keys of a `[tenants.NAME]` table besides the `[tenants]` ones.
const TENANT_TABLE_KEYS: &[&str] = &["profiles", "default_profile"];

/// `[http]`: read by `serve --http` only.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    addr: Option<String>,
    public_url: Option<String>,
    #[serde(default)]
    allowed_hosts: Vec<String>,
    #[serde(default)]
    allowed_origins: Vec<String>,
    insecure_no_auth: Option<bool>,
    link_ttl: Option<u64>,
    max_body_bytes: Option<SizeOrNumber>,
}

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFile {
    profile: Option<String>,
    compat_tools: Option<bool>,
    data_dir: Option<PathBuf>,
    max_concurrent_runs: Option<usize>,
    max_frame_bytes: Option<SizeOrNumber>,
    audit_queue_size: Option<SizeOrNumber>,
}

/// `[python]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PythonFile {
    version: Option<String>,
    uv_path: Option<PathBuf>,
    downloads: Option<PythonDownloadsArg>,
}

/// `[sandbox]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SandboxFile {
    backend: Option<BackendArg>,
    bwrap_path: Option<PathBuf>,
    docker_runtime: Option<String>,
}

/// `[network]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkFile {
    mode: Option<String>,
    resolvers: Option<String>,
    ports: Option<String>,
    allow_ip_literals: Option<bool>,
    exceptions: Option<String>,
    install_hosts: Option<String>,
    max_connections: Option<u64>,
    max_bytes: Option<SizeOrNumber>,
    max_connection_seconds: Option<u64>,
}

/// `[limits]`: per run.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    default_timeout: Option<u64>,
    max_timeout: Option<u64>,
    max_output_bytes: Option<u64>,
    memory: Option<SizeOrNumber>,
    processes: Option<SizeOrNumber>,
    cpu_seconds: Option<SizeOrNumber>,
    cpu_cores: Option<CoresValue>,
    scratch: Option<SizeOrNumber>,
    max_script_bytes: Option<SizeOrNumber>,
}

/// `[pool]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolFile {
    size: Option<usize>,
    fork_server: Option<Switch>,
    preload_packages: Option<usize>,
    prefork: Option<usize>,
}

/// `[cache]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheFile {
    no_warm: Option<bool>,
    allow_sdist_builds: Option<bool>,
    install_timeout: Option<u64>,
    max_size: Option<SizeOrNumber>,
    max_age_days: Option<u64>,
}

/// `[sessions]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionsFile {
    idle_stop: Option<u64>,
    idle_delete: Option<u64>,
    max_sessions: Option<usize>,
    max_disk: Option<SizeOrNumber>,
    max_interpreters: Option<usize>,
}

/// `[artifacts]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ArtifactsFile {
    max_age_hours: Option<u64>,
    max_size: Option<SizeOrNumber>,
}

/// TOML lets sizes be written as `1073741824` or `"1GiB"`.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a whole number (`1073741824`) or a size in quotes (`\"1GiB\"`)"
)]
enum SizeOrNumber {
    Number(u64),
    Text(String),
}

impl SizeOrNumber {
    fn into_text(self) -> String {
        match self {
            SizeOrNumber::Number(n) => n.to_string(),
            SizeOrNumber::Text(text) => text,
        }
    }
}

/// TOML lets a core count be written as `1`, `1.5` or `"unlimited"`.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a number of cores (`1.5`) or `\"unlimited\"`")]
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

/// Flag (or environment) first, then the file's text form of a size or count.
fn text_or(cli: Option<&String>, file: Option<SizeOrNumber>) -> Option<String> {
    cli.cloned().or(file.map(SizeOrNumber::into_text))
}

/// `serve`'s settings: the engine's, and the HTTP face's when `--http` (or `SNAKEBOX_HTTP`)
/// asks for it (`None`: stdio). One read of the config file for both.
///
/// # Errors
/// As [`resolve`]; also an address that does not parse, or a public URL that is not one.
pub(crate) fn resolve_serve(
    args: &ServeArgs,
) -> anyhow::Result<(Settings, Option<snakebox_http::HttpConfig>)> {
    let mut file = load_file(args.engine.config.as_deref())?;
    let http_file = std::mem::take(&mut file.http);
    let mut settings = resolve_with(&args.engine, file)?;
    let http = resolve_http(&args.http, http_file, settings.engine.max_script_bytes)?;
    if http.is_some() {
        several_tenants(&mut settings.engine);
    }
    Ok((settings, http))
}

/// Defaults for a server several tenants share (`--http`): none may take every slot, nor
/// fill the sessions' disk (each has a share of it, see `TENANTS_PER_SESSIONS_DISK`).
fn several_tenants(engine: &mut EngineConfig) {
    if engine.tenants.max_concurrent_runs.is_none() {
        engine.tenants.max_concurrent_runs =
            Some(engine.max_concurrent_runs.saturating_sub(1).max(1));
    }
    let sessions = &mut engine.sessions;
    if sessions.tenant_max_disk_bytes.is_none() {
        let total = sessions.max_disk_bytes;
        sessions.tenant_max_disk_bytes = Some(
            (total / snakebox_engine::TENANTS_PER_SESSIONS_DISK)
                .max(snakebox_engine::MIN_SESSIONS_DISK_SHARE)
                .min(total),
        );
    }
}

/// Shortest and longest validity of a download link, in seconds.
const LINK_TTL_MIN: u64 = 10;
const LINK_TTL_MAX: u64 = 30 * 86_400;

/// The default address of `serve --http`.
const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8000";

fn resolve_http(
    args: &HttpArgs,
    file: HttpFile,
    max_script_bytes: usize,
) -> anyhow::Result<Option<snakebox_http::HttpConfig>> {
    let Some(flag) = &args.http else {
        return Ok(None);
    };
    let addr = Some(flag.as_str())
        .filter(|addr| !addr.is_empty())
        .map(str::to_owned)
        .or(file.addr)
        .unwrap_or_else(|| DEFAULT_HTTP_ADDR.to_owned());
    let addr = addr.parse().with_context(|| {
        format!("invalid --http address `{addr}`\nhint: write an IP address and a port, e.g. `127.0.0.1:8000` or `0.0.0.0:8000`")
    })?;
    let mut allowed_hosts = file.allowed_hosts;
    allowed_hosts.extend(args.allowed_hosts.iter().cloned());
    let mut allowed_origins = file.allowed_origins;
    allowed_origins.extend(args.allowed_origins.iter().cloned());
    let link_ttl = match args.link_ttl.or(file.link_ttl) {
        None => snakebox_http::DEFAULT_LINK_TTL,
        Some(seconds) if (LINK_TTL_MIN..=LINK_TTL_MAX).contains(&seconds) => {
            Duration::from_secs(seconds)
        }
        Some(seconds) => anyhow::bail!(
            "invalid --link-ttl `{seconds}`\nhint: give the seconds a download link stays valid, from {LINK_TTL_MIN} to {LINK_TTL_MAX} (30 days), e.g. 3600"
        ),
    };
    let max_body_bytes = resolve_body_limit(
        text_or(args.max_body_bytes.as_ref(), file.max_body_bytes).as_deref(),
        max_script_bytes,
    )?;
    Ok(Some(snakebox_http::HttpConfig {
        addr,
        public_url: args.public_url.clone().or(file.public_url),
        allowed_hosts,
        allowed_origins,
        insecure_no_auth: args.insecure_no_auth || file.insecure_no_auth.unwrap_or(false),
        conformance_fixtures: args.conformance_fixtures,
        link_ttl,
        max_body_bytes,
    }))
}

/// The largest HTTP request body: at least 64 KiB and at most 1 GiB (a body is held whole
/// while it is read), and room for a script at the script limit. By default 64 MiB.
fn resolve_body_limit(text: Option<&str>, max_script_bytes: usize) -> anyhow::Result<usize> {
    let Some(text) = text else {
        return Ok(snakebox_http::DEFAULT_MAX_BODY_BYTES.max(max_script_bytes.saturating_mul(2)));
    };
    let bytes =
        parse_size(text).with_context(|| "invalid --max-body-bytes (`[http] max_body_bytes`)")?;
    if !(64 << 10..=1 << 30).contains(&bytes) {
        bail!(
            "--max-body-bytes must be between 64KiB and 1GiB, got `{text}`\nhint: the default is 64MiB"
        );
    }
    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    if bytes <= max_script_bytes {
        bail!(
            "--max-body-bytes (`{text}`) leaves no room for a script of --max-script-bytes ({max_script_bytes} bytes)\nhint: make --max-body-bytes larger than --max-script-bytes (twice it leaves room for JSON escapes), or lower --max-script-bytes"
        );
    }
    Ok(bytes)
}

/// The resolved settings: the engine's, and those of `serve`'s stdio face.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) engine: EngineConfig,
    /// Largest message read from stdin (`[server] max_frame_bytes`).
    pub(crate) max_frame_bytes: usize,
}

/// Merge CLI/env arguments with the config file and defaults: one step per section.
///
/// # Errors
/// An unreadable or invalid config file, or a value that does not parse; the message names
/// the setting and says what is accepted.
pub(crate) fn resolve(args: &EngineArgs) -> anyhow::Result<Settings> {
    resolve_with(args, load_file(args.config.as_deref())?)
}

/// [`resolve`] with the file already read.
fn resolve_with(args: &EngineArgs, mut file: FileSettings) -> anyhow::Result<Settings> {
    let mut config = EngineConfig::new(PathBuf::new(), BackendKind::Native);
    let frame = text_or(
        args.server.max_frame_bytes.as_ref(),
        file.server.max_frame_bytes.take(),
    );
    let queue = text_or(
        args.server.audit_queue_size.as_ref(),
        file.server.audit_queue_size.take(),
    );
    resolve_server(&args.server, file.server, &mut config)?;
    resolve_python(&args.python, file.python, &mut config);
    resolve_sandbox(&args.sandbox, file.sandbox, &mut config);
    resolve_network(&args.network, file.network, &mut config)?;
    resolve_limits(&args.limits, file.limits, &mut config)?;
    resolve_pool(&args.pool, &file.pool, &mut config)?;
    resolve_cache(&args.cache, file.cache, &mut config)?;
    resolve_sessions(&args.sessions, file.sessions, &mut config)?;
    resolve_artifacts(&args.artifacts, file.artifacts, &mut config)?;
    resolve_tenants(&args.tenants, &mut file.tenants, &mut config)?;
    resolve_audit_queue(queue.as_deref(), &mut config)?;
    resolve_profiles(
        &args.server,
        std::mem::take(&mut file.profiles),
        &mut config,
    )?;
    resolve_tenant_tables(std::mem::take(&mut file.tenant_tables), &mut config)?;
    let max_frame_bytes = resolve_frame(frame.as_deref(), config.max_script_bytes)?;
    Ok(Settings {
        engine: config,
        max_frame_bytes,
    })
}

/// The largest stdio message: at least 64 KiB and at most 1 GiB (it is held whole while it is
/// read), and room for a script at the script limit. By default 16 MiB (a 10 MiB session
/// file in base64 fits), or twice the script limit when that is larger.
fn resolve_frame(text: Option<&str>, max_script_bytes: usize) -> anyhow::Result<usize> {
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

/// `[profiles.NAME]` over the built-ins, then the default profile (`--profile`, `[server]
/// profile`, else `standard`).
fn resolve_profiles(
    args: &ServerArgs,
    file: BTreeMap<String, ProfileFile>,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    use snakebox_engine::{Profile, ProfileLimits, ProfileNetwork};
    let profiles = &mut config.profiles;
    for (name, table) in file {
        if !snakebox_engine::is_plain_name(&name) {
            bail!(
                "invalid profile name `[profiles.{name}]`\nhint: use 1 to 64 characters of lowercase letters, digits, `-` and `_`"
            );
        }
        let base = profiles.all.get(&name).cloned().unwrap_or_else(|| {
            Profile::unrestricted(&name, &format!("the operator's profile `{name}`"))
        });
        let what = |key: &str| format!("`[profiles.{name}] {key}`");
        let network = match table.network {
            None => base.network,
            Some(ProfileNetworkFile::Mode(mode)) => match mode.as_str() {
                "off" => ProfileNetwork::Off,
                "server" => ProfileNetwork::Server,
                other => bail!(
                    "invalid {} `{other}`\nhint: write \"off\", \"server\" (the [network] policy) or a list of host names such as [\"api.example.com\"]",
                    what("network")
                ),
            },
            Some(ProfileNetworkFile::Domains(names)) if names.is_empty() => ProfileNetwork::Off,
            Some(ProfileNetworkFile::Domains(names)) => ProfileNetwork::Allow(
                names
                    .iter()
                    .map(|n| n.trim().trim_end_matches('.').to_ascii_lowercase())
                    .collect(),
            ),
        };
        let memory_bytes = match table.memory {
            None => base.limits.memory_bytes,
            Some(value) => {
                let bytes = parse_memory_limit(&value.into_text())
                    .with_context(|| format!("invalid {}", what("memory")))?;
                Some(bytes)
            }
        };
        for (key, value) in [
            ("timeout", table.timeout),
            ("cpu_seconds", table.cpu_seconds),
        ] {
            if value == Some(0) {
                bail!(
                    "{} must be at least 1\nhint: leave it out for the server's limit",
                    what(key)
                );
            }
        }
        if table.max_output_bytes.is_some_and(|bytes| bytes < 1024) {
            bail!("{} must be at least 1024", what("max_output_bytes"));
        }
        if let Some(count) = table.processes {
            check_process_limit(count).with_context(|| format!("invalid {}", what("processes")))?;
        }
        let profile = Profile {
            name: name.clone(),
            description: table.description.unwrap_or(base.description),
            network,
            subprocesses: table.subprocesses.unwrap_or(base.subprocesses),
            writable_work: table.writable_work.unwrap_or(base.writable_work),
            limits: ProfileLimits {
                timeout_seconds: table.timeout.or(base.limits.timeout_seconds),
                memory_bytes,
                cpu_seconds: table.cpu_seconds.or(base.limits.cpu_seconds),
                processes: table.processes.or(base.limits.processes),
                output_bytes: table.max_output_bytes.or(base.limits.output_bytes),
            },
            packages: table.packages.or(base.packages),
            allowed_imports: table.allowed_imports.or(base.allowed_imports),
            tenants: table.tenants.unwrap_or(base.tenants),
        };
        profiles.all.insert(name, profile);
    }
    if let Some(name) = args.profile.clone().or(profiles_default_from_file(config)) {
        if !config.profiles.all.contains_key(&name) {
            bail!(
                "--profile (`[server] profile`) names `{name}`, which is not a profile\nhint: name one of {}, or define `[profiles.{name}]` in the config file",
                config.profiles.names().join(", ")
            );
        }
        config.profiles.default = name;
    }
    Ok(())
}

/// The `[server] profile` read by [`resolve_server`] (kept in the config until profiles are
/// resolved).
fn profiles_default_from_file(config: &EngineConfig) -> Option<String> {
    Some(config.profiles.default.clone()).filter(|name| name != snakebox_engine::STANDARD_PROFILE)
}

fn resolve_server(
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
    if let Some(runs) = args.max_concurrent_runs.or(file.max_concurrent_runs) {
        if runs == 0 {
            bail!("--max-concurrent-runs must be at least 1");
        }
        config.max_concurrent_runs = runs;
    }
    Ok(())
}

fn resolve_python(args: &PythonArgs, file: PythonFile, config: &mut EngineConfig) {
    config.python_version = args.python_version.clone().or(file.version);
    config.uv_path = args.uv_path.clone().or(file.uv_path);
    config.python_downloads = match args.python_downloads.or(file.downloads) {
        Some(PythonDownloadsArg::Automatic) => snakebox_engine::PythonDownloads::Automatic,
        Some(PythonDownloadsArg::Never) | None => snakebox_engine::PythonDownloads::Never,
    };
}

fn resolve_sandbox(args: &SandboxArgs, file: SandboxFile, config: &mut EngineConfig) {
    config.backend = match args.sandbox_backend.or(file.backend) {
        Some(BackendArg::None) => BackendKind::None,
        Some(BackendArg::Docker) => BackendKind::Docker,
        Some(BackendArg::Native) | None => BackendKind::Native,
    };
    config.bwrap_path = args.bwrap_path.clone().or(file.bwrap_path);
    config.docker_runtime = args.docker_runtime.clone().or(file.docker_runtime);
}

fn resolve_network(
    args: &NetworkArgs,
    file: NetworkFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    resolve_network_caps(args, &file, config)?;
    if let Some(list) = args
        .network_install_hosts
        .as_ref()
        .or(file.install_hosts.as_ref())
    {
        config.network_proxy.install_hosts = Some(
            snakebox_engine::parse_install_hosts(list).map_err(|reason| {
                anyhow::anyhow!(
                    "--network-install-hosts: {reason}\nhint: for example `--network-install-hosts files.example.org,*.cdn.example.org` (the configured package indexes are always allowed)"
                )
            })?,
        );
    }
    if let Some(mode) = args.network.as_ref().or(file.mode.as_ref()) {
        config.network = snakebox_engine::NetworkPolicy::parse(mode).map_err(|reason| {
            anyhow::anyhow!(
                "--network: {reason}\nhint: for example `--network allow:api.example.com,files.example.org`"
            )
        })?;
    }
    if let Some(list) = args.network_resolvers.as_ref().or(file.resolvers.as_ref()) {
        config.network_proxy.resolvers = list
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| {
                item.parse::<std::net::SocketAddr>()
                    .or_else(|_| {
                        item.parse::<std::net::IpAddr>()
                            .map(|ip| std::net::SocketAddr::new(ip, 53))
                    })
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "--network-resolvers: `{item}` is not an IP address or IP:PORT\nhint: for example `--network-resolvers 192.0.2.53,192.0.2.54:5353`"
                        )
                    })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(list) = args.network_ports.as_ref().or(file.ports.as_ref()) {
        config.network_proxy.ports = list
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| {
                item.parse::<u16>().ok().filter(|port| *port > 0).ok_or_else(|| {
                    anyhow::anyhow!(
                        "--network-ports: `{item}` is not a port number\nhint: for example `--network-ports 80,443,8443`"
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    config.network_proxy.allow_ip_literals =
        args.network_allow_ip_literals || file.allow_ip_literals.unwrap_or(false);
    if let Some(list) = args
        .network_exceptions
        .as_ref()
        .or(file.exceptions.as_ref())
    {
        config.network_proxy.exceptions = list
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| {
                item.parse::<ipnet::IpNet>()
                    .or_else(|_| item.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "--network-exceptions: `{item}` is not an address range\nhint: write CIDR ranges such as `10.20.0.0/16,fd00:1::/64`"
                        )
                    })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    Ok(())
}

/// The run proxy's caps: connections, bytes and seconds per connection, each at least 1.
fn resolve_network_caps(
    args: &NetworkArgs,
    file: &NetworkFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    let caps = &mut config.network_proxy.caps;
    if let Some(n) = args.network_max_connections.or(file.max_connections) {
        if n == 0 {
            bail!(
                "--network-max-connections must be at least 1\nhint: run without network instead (`network: false`), or raise it"
            );
        }
        caps.connections = n;
    }
    let bytes = args
        .network_max_bytes
        .clone()
        .or(file.max_bytes.as_ref().map(|value| match value {
            SizeOrNumber::Number(n) => n.to_string(),
            SizeOrNumber::Text(text) => text.clone(),
        }));
    if let Some(text) = bytes {
        let n = parse_size(&text)
            .with_context(|| "invalid --network-max-bytes (`[network] max_bytes`)")?;
        if n == 0 {
            bail!("--network-max-bytes must be at least 1 byte\nhint: the default is 1GiB");
        }
        caps.bytes = n;
    }
    if let Some(seconds) = args
        .network_max_connection_seconds
        .or(file.max_connection_seconds)
    {
        if seconds == 0 {
            bail!("--network-max-connection-seconds must be at least 1\nhint: the default is 600");
        }
        caps.connection_time = Duration::from_secs(seconds);
    }
    Ok(())
}

fn resolve_limits(
    args: &LimitsArgs,
    file: LimitsFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
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
    if let Some(text) = text_or(args.memory_limit.as_ref(), file.memory) {
        config.memory_bytes = optional(
            &text,
            "--memory-limit (`[limits] memory`)",
            parse_memory_limit,
        )?;
    }
    if let Some(text) = text_or(args.max_processes.as_ref(), file.processes) {
        config.max_processes = optional(
            &text,
            "--max-processes (`[limits] processes`)",
            parse_process_limit,
        )?;
    }
    if let Some(text) = text_or(args.cpu_limit.as_ref(), file.cpu_seconds) {
        config.cpu_time = optional(&text, "--cpu-limit (`[limits] cpu_seconds`)", parse_count)?
            .map(Duration::from_secs);
    }
    let cores = args
        .cpu_cores
        .clone()
        .or(file.cpu_cores.map(CoresValue::into_text));
    if let Some(text) = cores {
        config.cpu_millicores = parse_cores(&text)?;
    }
    if let Some(text) = text_or(args.scratch_limit.as_ref(), file.scratch) {
        config.scratch_bytes = optional(&text, "--scratch-limit (`[limits] scratch`)", parse_size)?;
    }
    if let Some(text) = text_or(args.max_script_bytes.as_ref(), file.max_script_bytes) {
        let bytes = parse_size(&text)
            .with_context(|| "invalid --max-script-bytes (`[limits] max_script_bytes`)")?;
        config.max_script_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    }
    Ok(())
}

fn resolve_pool(args: &PoolArgs, file: &PoolFile, config: &mut EngineConfig) -> anyhow::Result<()> {
    if let Some(size) = args.warm_pool.or(file.size) {
        if size > MAX_WARM_POOL {
            bail!(
                "--warm-pool must be at most {MAX_WARM_POOL}, got `{size}`\nhint: each pre-started sandbox holds a uid and memory while idle; 2 serves most hosts (0 turns the pool off)"
            );
        }
        config.warm_pool = size;
    }
    // The docker backend cannot fork runs: its warm pool is its containers.
    config.fork_server = args.fork_server.or(file.fork_server) != Some(Switch::Off)
        && config.backend != BackendKind::Docker;
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

fn resolve_cache(
    args: &CacheArgs,
    file: CacheFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    config.warm_cache = !(args.no_warm_cache || file.no_warm.unwrap_or(false));
    config.allow_sdist_builds = args.allow_sdist_builds || file.allow_sdist_builds.unwrap_or(false);
    if let Some(seconds) = args.install_timeout.or(file.install_timeout) {
        if seconds == 0 {
            bail!("--install-timeout must be at least 1 second\nhint: the default is 300");
        }
        config.install_timeout = Duration::from_secs(seconds);
    }
    if let Some(text) = text_or(args.cache_max_size.as_ref(), file.max_size) {
        config.cache_max_bytes =
            parse_size(&text).with_context(|| "invalid --cache-max-size (`[cache] max_size`)")?;
    }
    if let Some(days) = args.cache_max_age_days.or(file.max_age_days) {
        config.cache_max_age = Duration::from_secs(days.saturating_mul(86_400));
    }
    Ok(())
}

fn resolve_sessions(
    args: &SessionsArgs,
    file: SessionsFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    let sessions = &mut config.sessions;
    if let Some(seconds) = args.session_idle_stop.or(file.idle_stop) {
        if seconds == 0 {
            bail!("--session-idle-stop must be at least 1 second");
        }
        sessions.idle_stop = Duration::from_secs(seconds);
    }
    if let Some(seconds) = args.session_idle_delete.or(file.idle_delete) {
        if seconds == 0 {
            bail!("--session-idle-delete must be at least 1 second");
        }
        sessions.idle_delete = Duration::from_secs(seconds);
    }
    if let Some(count) = args.max_sessions.or(file.max_sessions) {
        sessions.max_sessions = count;
    }
    if let Some(text) = text_or(args.sessions_max_disk.as_ref(), file.max_disk) {
        sessions.max_disk_bytes = parse_size(&text)
            .with_context(|| "invalid --sessions-max-disk (`[sessions] max_disk`)")?;
    }
    if let Some(count) = args.session_max_interpreters.or(file.max_interpreters) {
        if count == 0 {
            bail!("--session-max-interpreters must be at least 1");
        }
        sessions.max_interpreters = count;
    }
    Ok(())
}

fn resolve_artifacts(
    args: &ArtifactsArgs,
    file: ArtifactsFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    if let Some(hours) = args.artifact_max_age_hours.or(file.max_age_hours) {
        if hours == 0 {
            bail!("--artifact-max-age-hours must be at least 1");
        }
        config.artifact_max_age = Duration::from_secs(hours.saturating_mul(3600));
    }
    if let Some(text) = text_or(args.artifact_max_size.as_ref(), file.max_size) {
        config.artifact_max_bytes = parse_size(&text)
            .with_context(|| "invalid --artifact-max-size (`[artifacts] max_size`)")?;
    }
    Ok(())
}

fn resolve_tenants(
    args: &TenantsArgs,
    file: &mut TenantsFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    resolve_store_budgets(args, file, &mut config.store_budgets)?;
    let quotas = &mut config.tenants;
    quotas.max_concurrent_runs = args.tenant_max_concurrent_runs.or(file.max_concurrent_runs);
    quotas.runs_per_minute = args.tenant_runs_per_minute.or(file.runs_per_minute);
    quotas.max_sessions = args.tenant_max_sessions.or(file.max_sessions);
    if let Some(text) = text_or(
        args.tenant_sessions_max_disk.as_ref(),
        file.sessions_max_disk.take(),
    ) {
        let bytes = parse_size(&text).with_context(
            || "invalid --tenant-sessions-max-disk (`[tenants] sessions_max_disk`)",
        )?;
        let total = config.sessions.max_disk_bytes;
        if bytes < snakebox_engine::MIN_SESSIONS_DISK_SHARE {
            bail!(
                "--tenant-sessions-max-disk (`[tenants] sessions_max_disk`) must be at least 32MiB, got `{text}`\nhint: a share is a file-system image, and ext4's own metadata leaves little of less"
            );
        }
        if bytes > total {
            bail!(
                "--tenant-sessions-max-disk (`{text}`) is larger than --sessions-max-disk ({total} bytes)\nhint: a tenant's share is a part of the sessions' disk: raise --sessions-max-disk, or lower the share"
            );
        }
        config.sessions.tenant_max_disk_bytes = Some(bytes);
    }
    for (name, value) in [
        ("--tenant-max-concurrent-runs", quotas.max_concurrent_runs),
        (
            "--tenant-runs-per-minute",
            quotas.runs_per_minute.map(|n| n as usize),
        ),
        ("--tenant-max-sessions", quotas.max_sessions),
    ] {
        if value == Some(0) {
            bail!("{name} must be at least 1\nhint: leave it unset for no per-tenant bound");
        }
    }
    Ok(())
}

/// `[tenants.NAME]`: each tenant set apart, checked as the `[tenants]` defaults are, with
/// profiles that exist. The profiles it names are granted as the profiles' own `tenants`
/// lists grant them (the engine takes the union: either way lets the tenant name it).
fn resolve_tenant_tables(
    file: BTreeMap<String, TenantFile>,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    for (name, table) in file {
        let what = |key: &str| format!("`[tenants.{name}] {key}`");
        for (key, value) in [
            ("max_concurrent_runs", table.max_concurrent_runs),
            ("runs_per_minute", table.runs_per_minute.map(|n| n as usize)),
            ("max_sessions", table.max_sessions),
            (
                "history_max_runs",
                table
                    .history_max_runs
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            ),
        ] {
            if value == Some(0) {
                bail!(
                    "{} must be at least 1\nhint: leave it out for the `[tenants]` default",
                    what(key)
                );
            }
        }
        let size = |key: &str, value: Option<SizeOrNumber>, least: u64| {
            let Some(text) = text_or(None, value) else {
                return Ok(None);
            };
            let bytes = parse_size(&text).with_context(|| format!("invalid {}", what(key)))?;
            if bytes < least {
                bail!(
                    "{} must be at least {least} bytes, got `{text}`\nhint: give a larger size, or leave it out for the `[tenants]` default",
                    what(key)
                );
            }
            anyhow::Ok(Some(bytes))
        };
        let sessions_max_disk = size(
            "sessions_max_disk",
            table.sessions_max_disk,
            snakebox_engine::MIN_SESSIONS_DISK_SHARE,
        )?;
        let total = config.sessions.max_disk_bytes;
        if let Some(bytes) = sessions_max_disk.filter(|bytes| *bytes > total) {
            bail!(
                "{} ({bytes} bytes) is larger than --sessions-max-disk ({total} bytes)\nhint: a tenant's share is a part of the sessions' disk: raise --sessions-max-disk, or lower the share",
                what("sessions_max_disk")
            );
        }
        let profiles = table.profiles.unwrap_or_default();
        for profile in profiles.iter().chain(&table.default_profile) {
            if !config.profiles.all.contains_key(profile) {
                bail!(
                    "{} names `{profile}`, which is not a profile\nhint: name one of {}, or define it with `[profiles.{profile}]`",
                    what(if table.default_profile.as_ref() == Some(profile) {
                        "default_profile"
                    } else {
                        "profiles"
                    }),
                    config.profiles.names().join(", ")
                );
            }
        }
        let over = snakebox_engine::TenantOverride {
            max_concurrent_runs: table.max_concurrent_runs,
            runs_per_minute: table.runs_per_minute,
            max_sessions: table.max_sessions,
            history_max_runs: table.history_max_runs,
            history_max_bytes: size("history_max_size", table.history_max_size, 64 << 10)?,
            audit_max_bytes: size(
                "audit_max_size",
                table.audit_max_size,
                snakebox_engine::MIN_AUDIT_BYTES,
            )?,
            artifacts_max_bytes: size("artifacts_max_size", table.artifacts_max_size, 1)?,
            sessions_max_disk_bytes: sessions_max_disk,
            profiles,
            default_profile: table.default_profile,
        };
        config.tenant_overrides.insert(name, over);
    }
    Ok(())
}

/// What one tenant may keep in each shared store (`[tenants]` `history_max_runs`,
/// `history_max_size`, `audit_max_size`, `artifacts_max_size`).
fn resolve_store_budgets(
    args: &TenantsArgs,
    file: &mut TenantsFile,
    budgets: &mut snakebox_engine::StoreBudgets,
) -> anyhow::Result<()> {
    if let Some(runs) = args.tenant_history_max_runs.or(file.history_max_runs) {
        if runs == 0 {
            bail!(
                "--tenant-history-max-runs must be at least 1\nhint: leave it unset for the default (100000)"
            );
        }
        budgets.history.items = Some(runs);
    }
    let size = |flag: &str,
                key: &str,
                cli: Option<&String>,
                file: Option<SizeOrNumber>,
                least: u64| {
        let Some(text) = text_or(cli, file) else {
            return Ok(None);
        };
        let bytes =
            parse_size(&text).with_context(|| format!("invalid {flag} (`[tenants] {key}`)"))?;
        if bytes < least {
            bail!(
                "{flag} (`[tenants] {key}`) must be at least {least} bytes\nhint: give a size such as `64KiB` or more, or leave it unset for the default"
            );
        }
        Ok(Some(bytes))
    };
    if let Some(bytes) = size(
        "--tenant-history-max-size",
        "history_max_size",
        args.tenant_history_max_size.as_ref(),
        file.history_max_size.take(),
        64 << 10,
    )? {
        budgets.history.bytes = Some(bytes);
    }
    if let Some(bytes) = size(
        "--tenant-audit-max-size",
        "audit_max_size",
        args.tenant_audit_max_size.as_ref(),
        file.audit_max_size.take(),
        snakebox_engine::MIN_AUDIT_BYTES,
    )? {
        budgets.audit_bytes = bytes;
    }
    if let Some(bytes) = size(
        "--tenant-artifacts-max-size",
        "artifacts_max_size",
        args.tenant_artifacts_max_size.as_ref(),
        file.artifacts_max_size.take(),
        1,
    )? {
        budgets.artifact_bytes = bytes;
    }
    Ok(())
}

/// `[server] audit_queue_size`: bytes of records queued for the writer.
fn resolve_audit_queue(text: Option<&str>, config: &mut EngineConfig) -> anyhow::Result<()> {
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
    parse_file(&text).with_context(|| format!("invalid config file `{}`", path.display()))
}

/// Parse a config file's text: TOML, normalised to the sectioned form, then the sections.
fn parse_file(text: &str) -> anyhow::Result<FileSettings> {
    let table: toml::Table = text.parse().map_err(|err: toml::de::Error| {
        let message = err.to_string();
        let message = message.trim_end();
        // TOML itself refuses the one flat key that is also a section's name.
        if message.contains("duplicate key") && message.contains("network") {
            anyhow::anyhow!(
                "{message}\nhint: the flat `network = ...` and the `[network]` section cannot both be written; write it in the section as `mode = ...`"
            )
        } else {
            anyhow::anyhow!("{message}")
        }
    })?;
    let (table, moved) = sectioned(table)?;
    // The name a key was written under: its flat form when it was moved into its section.
    let written = |section: &str, name: &str| {
        moved
            .iter()
            .find(|(_, s, n)| *s == section && *n == name)
            .map_or_else(
                || format!("`[{section}] {name}`"),
                |(flat, _, _)| format!("`{flat}` (`[{section}] {name}`)"),
            )
    };
    match FileSettings::deserialize(toml::Value::Table(table.clone())) {
        Ok(settings) => Ok(settings),
        // Serde does not always say which key it was reading (untagged values, numbers):
        // find it by reading each key alone, and say what that key takes.
        Err(err) => match first_bad_key(&table) {
            Some((section, name, message)) => bail!(
                "{}: {message}\nhint: {}",
                written(&section, &name),
                type_hint(&message)
            ),
            None => bail!(
                "{}\nhint: {}",
                err.to_string().trim_end(),
                type_hint(&err.to_string())
            ),
        },
    }
}

/// The first `(section, key, serde's message)` whose value alone does not deserialize
/// (`[profiles.NAME]` keys are one level deeper: their section is `profiles.NAME`).
fn first_bad_key(table: &toml::Table) -> Option<(String, String, String)> {
    for (section, keys) in table {
        let toml::Value::Table(keys) = keys else {
            continue;
        };
        for (name, value) in keys {
            match value {
                toml::Value::Table(profile) if section == "profiles" => {
                    for (key, value) in profile {
                        if let Some(message) = fails_alone(&[section, name, key], value) {
                            return Some((format!("profiles.{name}"), key.clone(), message));
                        }
                    }
                }
                toml::Value::Table(tenant) if section == TENANT_TABLES => {
                    for (key, value) in tenant {
                        if let Some(message) = fails_alone(&[section, name, key], value) {
                            return Some((format!("tenants.{name}"), key.clone(), message));
                        }
                    }
                }
                _ => {
                    if let Some(message) = fails_alone(&[section, name], value) {
                        return Some((section.clone(), name.clone(), message));
                    }
                }
            }
        }
    }
    None
}

/// Serde's message when `value`, alone at `path` in an otherwise empty file, is refused.
fn fails_alone(path: &[&String], value: &toml::Value) -> Option<String> {
    let file = path.iter().rev().fold(value.clone(), |inner, key| {
        toml::Value::Table(toml::Table::from_iter([((*key).clone(), inner)]))
    });
    let err = FileSettings::deserialize(file).err()?;
    let message = err.to_string();
    // Serde may name the place itself (`in `cache.no_warm``): the caller names it already.
    let message = message.trim_end();
    let message = message.split(['\n', ' ']).collect::<Vec<_>>().join(" ");
    let message = readable(message.split(" in `").next().unwrap_or(&message));
    // An untagged value's message is only what it expects (`a whole number ...`).
    Some(if message.starts_with("a ") {
        format!("expected {message}")
    } else {
        message
    })
}

/// Serde's type names in words a config file's author uses.
fn readable(message: &str) -> String {
    let mut message = message.to_owned();
    for (from, to) in [
        ("expected u64", "expected a whole number"),
        ("expected u32", "expected a whole number"),
        ("expected usize", "expected a whole number"),
        ("expected a boolean", "expected `true` or `false`"),
        (
            "invalid type: unit variant, expected string only",
            "expected `\"on\"` or `\"off\"`",
        ),
    ] {
        message = message.replace(from, to);
    }
    message
}

/// What to write instead, from what the key expected.
fn type_hint(message: &str) -> &'static str {
    if message.contains("unknown field") {
        "check the key's spelling against the keys the message lists"
    } else if message.contains("`true` or `false`") || message.contains("a boolean") {
        "a switch of this key is written bare: `true` or `false`"
    } else if message.contains("`\"on\"` or `\"off\"`") || message.contains("unit variant") {
        "write `\"on\"` or `\"off\"`, in quotes"
    } else if message.contains("size in quotes") {
        "write a size in quotes (`\"1GiB\"`) or a whole number of bytes (`1073741824`)"
    } else if message.contains("number of cores") {
        "write a number of cores bare (`1.5`), or `\"unlimited\"` in quotes"
    } else if message.contains("invalid value: integer") {
        "this key takes a whole number, 0 or more"
    } else if message.contains("whole number") {
        "numbers are written bare: `120`, not `\"120\"`"
    } else {
        "numbers are written bare (`120`), text in quotes (`\"512MiB\"`), switches bare (`true`)"
    }
}

/// Move every flat key into its section. A flat key whose sectioned twin is also set, an
/// unknown key, or a section that is not a table is an error with a hint. Also returns the
/// flat keys moved, `(flat key, section, key)`, so later errors can name what was written.
fn sectioned(table: toml::Table) -> anyhow::Result<(toml::Table, Vec<FlatKey>)> {
    let mut sections: BTreeMap<String, toml::Table> = BTreeMap::new();
    let mut flat = Vec::new();
    for (key, value) in table {
        let flat_place = FLAT_KEYS.iter().find(|(flat_key, _, _)| *flat_key == key);
        match (value, flat_place) {
            // A section; `network` is also a flat key, but only a table is the section.
            // Profiles are named by the operator: each `[profiles.NAME]` is checked by serde.
            (toml::Value::Table(section), _) if key == "profiles" => {
                sections.insert(key, section);
            }
            // `[tenants]` holds the defaults and, as sub-tables, `[tenants.NAME]`.
            (toml::Value::Table(mut section), _) if key == "tenants" => {
                let named: Vec<String> = section
                    .iter()
                    .filter(|(_, value)| value.is_table())
                    .map(|(name, _)| name.clone())
                    .collect();
                let mut tables = toml::Table::new();
                for name in named {
                    if let Some(table) = section.remove(&name) {
                        check_tenant_table(&name, &table)?;
                        tables.insert(name, table);
                    }
                }
                for name in section.keys() {
                    check_section_key(&key, name)?;
                }
                sections.insert(key, section);
                if !tables.is_empty() {
                    sections.insert(TENANT_TABLES.to_owned(), tables);
                }
            }
            (toml::Value::Table(section), _) if SECTIONS.contains(&key.as_str()) => {
                for name in section.keys() {
                    check_section_key(&key, name)?;
                }
                sections.insert(key, section);
            }
            (value, Some(&place)) => flat.push((place, value)),
            _ if SECTIONS.contains(&key.as_str()) => bail!(
                "`{key}` must be a section\nhint: write `[{key}]` on a line of its own, then its keys"
            ),
            _ => bail!("unknown key `{key}`\nhint: {}", top_level_hint(&key)),
        }
    }
    let mut moved = Vec::with_capacity(flat.len());
    for (place, value) in flat {
        moved.push(place);
        let (key, section, name) = place;
        let entry = sections.entry(section.to_owned()).or_default();
        if entry.contains_key(name) {
            bail!(
                "`{key}` and `[{section}] {name}` are the same setting, and both are set\nhint: keep `[{section}] {name}` and remove the flat `{key}`"
            );
        }
        entry.insert(name.to_owned(), value);
    }
    let table = sections
        .into_iter()
        .map(|(name, section)| (name, toml::Value::Table(section)))
        .collect();
    Ok((table, moved))
}

/// A key inside `[section]` must be one of that section's keys.
fn check_section_key(section: &str, name: &str) -> anyhow::Result<()> {
    let known = FLAT_KEYS
        .iter()
        .map(|&(flat, s, key)| (flat, s, key))
        .chain(SECTION_KEYS.iter().map(|&(s, key)| ("", s, key)))
        .filter(|(_, s, _)| *s == section);
    if known.clone().any(|(_, _, key)| key == name) {
        return Ok(());
    }
    let hint = if let Some((_, s, key)) = FLAT_KEYS.iter().find(|(flat, _, _)| *flat == name) {
        // A flat key written inside a section: say where it lives.
        format!("in a section it is `[{s}] {key}`")
    } else if let Some((_, s, key)) = FLAT_KEYS
        .iter()
        .find(|(_, s, key)| *key == name && *s != section)
    {
        format!("`{key}` belongs in `[{s}]`")
    } else {
        let keys: Vec<&str> = known.map(|(_, _, key)| key).collect();
        match closest(name, keys.iter().copied()) {
            Some(best) => format!("did you mean `{best}`? `[{section}]` has {}", list(&keys)),
            None => format!("`[{section}]` has {}", list(&keys)),
        }
    };
    bail!("unknown key `{name}` in `[{section}]`\nhint: {hint}")
}

/// A `[tenants.NAME]` table: a tenant's name, and only keys such a table has.
fn check_tenant_table(name: &str, table: &toml::Value) -> anyhow::Result<()> {
    let defaults: Vec<&str> = SECTION_KEYS
        .iter()
        .filter(|(section, _)| *section == "tenants")
        .map(|(_, key)| *key)
        .collect();
    if defaults.contains(&name) {
        bail!(
            "`[tenants.{name}]` is a table, but `{name}` is a setting of `[tenants]`\nhint: write `{name} = ...` under `[tenants]` for every tenant, or `[tenants.TENANT]` then `{name} = ...` for one"
        );
    }
    if !snakebox_engine::is_plain_name(name) {
        bail!(
            "invalid tenant name `[tenants.{name}]`\nhint: use 1 to 64 characters of lowercase letters, digits, `-` and `_` (the name `snakebox keys add` was given)"
        );
    }
    let keys: Vec<&str> = defaults.iter().chain(TENANT_TABLE_KEYS).copied().collect();
    if let toml::Value::Table(table) = table {
        for key in table.keys() {
            if keys.contains(&key.as_str()) {
                continue;
            }
            let hint = match closest(key, keys.iter().copied()) {
                Some(best) => format!(
                    "did you mean `{best}`? `[tenants.{name}]` has {}",
                    list(&keys)
                ),
                None => format!("`[tenants.{name}]` has {}", list(&keys)),
            };
            bail!("unknown key `{key}` in `[tenants.{name}]`\nhint: {hint}");
        }
    }
    Ok(())
}

/// The hint for an unknown key at the top level.
fn top_level_hint(key: &str) -> String {
    let mut sectioned = FLAT_KEYS
        .iter()
        .map(|&(_, section, name)| (section, name))
        .chain(SECTION_KEYS.iter().copied());
    if let Some((section, name)) = sectioned.find(|(_, name)| *name == key) {
        return format!("`{key}` belongs in a section: `[{section}] {name}`");
    }
    let candidates = FLAT_KEYS
        .iter()
        .map(|(flat, _, _)| *flat)
        .chain(SECTIONS.iter().copied());
    match closest(key, candidates) {
        Some(best) if SECTIONS.contains(&best) => format!("did you mean the section `[{best}]`?"),
        Some(best) => format!("did you mean `{best}`?"),
        None => format!("the sections are {}", list(SECTIONS)),
    }
}

/// `` `a`, `b`, `c` ``.
fn list(keys: &[&str]) -> String {
    keys.iter()
        .map(|key| format!("`{key}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The candidate nearest to `word` by edit distance, if it is near enough to be a typo.
fn closest<'a>(word: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .map(|candidate| (edit_distance(word, candidate), candidate))
        .filter(|(distance, candidate)| *distance <= (candidate.len() / 3).max(2))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// `1.5` → 1500 millicores; `unlimited` → no limit. At least 0.01 core.
fn parse_cores(text: &str) -> anyhow::Result<Option<u64>> {
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
    parse(text.trim())
        .map(Some)
        .with_context(|| format!("invalid {flag} value"))
}

/// A plain count: `128`.
fn parse_count(text: &str) -> anyhow::Result<u64> {
    text.trim().parse::<u64>().with_context(|| {
        format!("`{text}` is not a whole number\nhint: write a number such as 128, or `unlimited`")
    })
}

/// The fewest processes a run can have: the runner and its reaper (which reports how the run
/// ended); with fewer, no sandbox starts and bubblewrap's own error says only `Resource
/// temporarily unavailable`.
const MIN_PROCESSES: u64 = 2;

/// A process limit: a count of at least [`MIN_PROCESSES`].
fn parse_process_limit(text: &str) -> anyhow::Result<u64> {
    check_process_limit(parse_count(text)?)
}

/// `count`, if a run can start under it (the server's limit or a profile's).
fn check_process_limit(count: u64) -> anyhow::Result<u64> {
    if count < MIN_PROCESSES {
        bail!(
            "a run needs at least {MIN_PROCESSES} processes (the runner and the reaper that reports how it ended), got {count}\nhint: give {MIN_PROCESSES} or more (more for a script that starts processes of its own), or leave the limit out"
        );
    }
    Ok(count)
}

/// A size (`1024`, `512K`, `64MiB`, `1.5G`; see [`snakebox_engine::parse_size`]).
pub(crate) fn parse_size(text: &str) -> anyhow::Result<u64> {
    snakebox_engine::parse_size(text)
        .map_err(|err| anyhow::anyhow!("{err}\nhint: {}", snakebox_engine::SIZE_HINT))
}

/// A memory limit: a size of at least 16MiB.
fn parse_memory_limit(text: &str) -> anyhow::Result<u64> {
    snakebox_engine::parse_memory_limit(text).map_err(|err| match err {
        snakebox_engine::SizeError::TooSmall(_) => {
            anyhow::anyhow!("{err}\nhint: give 16MiB or more: Python needs some memory to start")
        }
        err => anyhow::anyhow!("{err}\nhint: {}", snakebox_engine::SIZE_HINT),
    })
}

#[cfg(test)]
mod tests {
    use indoc::indoc;

    use super::*;

    #[test]
    fn several_tenants_get_a_quarter_of_the_sessions_disk_each_unless_told() {
        let share = |total: u64, told: Option<u64>| {
            let mut engine = EngineConfig::new(PathBuf::new(), BackendKind::Native);
            engine.sessions.max_disk_bytes = total;
            engine.sessions.tenant_max_disk_bytes = told;
            several_tenants(&mut engine);
            engine.sessions.tenant_max_disk_bytes
        };
        assert_eq!(share(10 << 30, None), Some((10 << 30) / 4));
        assert_eq!(share(10 << 30, Some(1 << 30)), Some(1 << 30));
        // Never less than the smallest share, nor more than the disk.
        assert_eq!(share(64 << 20, None), Some(32 << 20));
        assert_eq!(share(16 << 20, None), Some(16 << 20));
    }

    #[test]
    fn download_links_live_an_hour_unless_told_and_within_bounds() {
        let serving = HttpArgs {
            http: Some(String::new()),
            ..HttpArgs::default()
        };
        let ttl = |args: &HttpArgs, text: &str| {
            let file = parse_file(text).map(|mut file| std::mem::take(&mut file.http));
            resolve_http(args, file.unwrap_or_else(|err| panic!("{err:#}")), 1 << 20)
                .map(|http| http.map(|http| http.link_ttl))
        };
        assert_eq!(
            ttl(&serving, "").unwrap_or_else(|err| panic!("{err:#}")),
            Some(snakebox_http::DEFAULT_LINK_TTL)
        );
        assert_eq!(
            ttl(&serving, "[http]\nlink_ttl = 600\n").unwrap_or_else(|err| panic!("{err:#}")),
            Some(Duration::from_secs(600))
        );
        let flag = HttpArgs {
            link_ttl: Some(60),
            ..serving.clone()
        };
        assert_eq!(
            ttl(&flag, "[http]\nlink_ttl = 600\n").unwrap_or_else(|err| panic!("{err:#}")),
            Some(Duration::from_secs(60))
        );
        for bad in ["0", "99999999"] {
            let err = ttl(&serving, &format!("[http]\nlink_ttl = {bad}\n"))
                .err()
                .map(|err| format!("{err:#}"))
                .unwrap_or_default();
            assert!(err.contains("--link-ttl") && err.contains("hint:"), "{err}");
        }
    }

    #[test]
    fn the_body_limit_is_64_mib_unless_told_and_within_bounds() {
        let serving = HttpArgs {
            http: Some(String::new()),
            ..HttpArgs::default()
        };
        let limit = |args: &HttpArgs, text: &str, script: usize| {
            let file = parse_file(text).map(|mut file| std::mem::take(&mut file.http));
            resolve_http(args, file.unwrap_or_else(|err| panic!("{err:#}")), script)
                .map(|http| http.map(|http| http.max_body_bytes))
        };
        let ok =
            |result: anyhow::Result<Option<usize>>| result.unwrap_or_else(|err| panic!("{err:#}"));
        assert_eq!(ok(limit(&serving, "", 1 << 20)), Some(64 << 20));
        // Twice a large script limit, when that is more.
        assert_eq!(ok(limit(&serving, "", 40 << 20)), Some(80 << 20));
        assert_eq!(
            ok(limit(
                &serving,
                "[http]\nmax_body_bytes = \"8MiB\"\n",
                1 << 20
            )),
            Some(8 << 20)
        );
        assert_eq!(
            ok(limit(
                &serving,
                "[http]\nmax_body_bytes = 1048577\n",
                1 << 20
            )),
            Some((1 << 20) + 1)
        );
        let flag = HttpArgs {
            max_body_bytes: Some("2MiB".into()),
            ..serving.clone()
        };
        assert_eq!(
            ok(limit(&flag, "[http]\nmax_body_bytes = \"8MiB\"\n", 1 << 20)),
            Some(2 << 20)
        );
        for (bad, script, says) in [
            ("\"1K\"", 1 << 20, "between 64KiB and 1GiB"),
            ("\"2GiB\"", 1 << 20, "between 64KiB and 1GiB"),
            ("\"big\"", 1 << 20, "--max-body-bytes"),
            ("\"1MiB\"", 2 << 20, "leaves no room for a script"),
        ] {
            let err = limit(
                &serving,
                &format!("[http]\nmax_body_bytes = {bad}\n"),
                script,
            )
            .err()
            .map(|err| format!("{err:#}"))
            .unwrap_or_default();
            assert!(err.contains(says) && err.contains("hint:"), "{bad}: {err}");
        }
    }

    /// Parse `text` as a config file and resolve it with no flags.
    fn resolve_settings(text: &str) -> anyhow::Result<Settings> {
        resolve_with(&EngineArgs::default(), parse_file(text)?)
    }

    /// The engine's part of [`resolve_settings`].
    fn resolve_text(text: &str) -> anyhow::Result<EngineConfig> {
        resolve_settings(text).map(|settings| settings.engine)
    }

    /// The resolved settings, comparable.
    fn shown(settings: &Settings) -> String {
        format!("{settings:?}")
    }

    /// `name: file => |config| condition,` — the file is accepted and the condition holds.
    macro_rules! accepted {
        ($($name:ident: $text:expr => |$config:ident| $check:expr,)*) => {$(
            #[test]
            fn $name() {
                let $config = match resolve_text($text) {
                    Ok(config) => config,
                    Err(err) => panic!("refused: {err:#}"),
                };
                assert!($check, "{:#?}", $config);
            }
        )*};
    }

    /// `name: file => ["part", ...],` — the file is refused and the message has every part.
    macro_rules! refused {
        ($($name:ident: $text:expr => [$($part:expr),+ $(,)?],)*) => {$(
            #[test]
            fn $name() {
                let err = match resolve_text($text) {
                    Ok(config) => panic!("accepted: {config:#?}"),
                    Err(err) => format!("{err:#}"),
                };
                $(assert!(err.contains($part), "`{}` not in: {err}", $part);)+
            }
        )*};
    }

    accepted! {
        empty_file_gives_the_defaults: "" => |config| format!("{config:?}") == format!("{:?}", resolve_text("\n").unwrap())
            && config.max_timeout == Duration::from_secs(300)
            && config.warm_cache
            && config.fork_server,
        sectioned_limits: indoc! {r#"
            [limits]
            max_timeout = 120
            default_timeout = 10
            memory = "256MiB"
            processes = "unlimited"
        "#} => |config| config.max_timeout == Duration::from_secs(120)
            && config.default_timeout == Duration::from_secs(10)
            && config.memory_bytes == Some(256 << 20)
            && config.max_processes.is_none(),
        two_processes: "[limits]\nprocesses = 2\n" => |config| config.max_processes == Some(2),
        sizes_may_be_numbers: "[limits]\nmemory = 134217728\n" => |config| config.memory_bytes == Some(128 << 20),
        cores_may_be_fractions: "[limits]\ncpu_cores = 1.5\n" => |config| config.cpu_millicores == Some(1500),
        cores_may_be_whole: "[limits]\ncpu_cores = 2\n" => |config| config.cpu_millicores == Some(2000),
        sizes_and_counts_may_be_unlimited: "[limits]\nmemory = \"unlimited\"\ncpu_seconds = \"unlimited\"\n" => |config| config.memory_bytes.is_none() && config.cpu_time.is_none(),
        cores_may_be_unlimited: "[limits]\ncpu_cores = \"unlimited\"\n" => |config| config.cpu_millicores.is_none(),
        network_section: "[network]\nmode = \"on\"\n" => |config| config.network == snakebox_engine::NetworkPolicy::On,
        network_caps: "[network]\nmax_connections = 1\nmax_bytes = \"2MiB\"\nmax_connection_seconds = 5\n" => |config| config.network_proxy.caps == snakebox_sandbox::NetCaps { connections: 1, bytes: 2 << 20, connection_time: Duration::from_secs(5) },
        install_hosts: "[network]\ninstall_hosts = \"Files.Example.org., *.cdn.example.org, 198.51.100.7\"\n" => |config| config.network_proxy.install_hosts == Some(vec!["files.example.org".into(), "*.cdn.example.org".into(), "198.51.100.7".into()]),
        install_hosts_empty: "[network]\ninstall_hosts = \"\"\n" => |config| config.network_proxy.install_hosts == Some(Vec::new()),
        install_hosts_unset: "" => |config| config.network_proxy.install_hosts.is_none() && config.network_proxy.caps == snakebox_sandbox::NetCaps::default(),
        network_allowlist: "[network]\nmode = \"allow:api.example.com,*.example.com\"\nresolvers = \"198.51.100.2\"\nports = \"443\"\n" => |config| config.network == snakebox_engine::NetworkPolicy::Allow(vec!["api.example.com".into(), "*.example.com".into()]) && config.network_proxy.resolvers == vec!["198.51.100.2:53".parse().unwrap()] && config.network_proxy.ports == vec![443],
        tenants_section: "[tenants]\nmax_concurrent_runs = 2\nruns_per_minute = 60\nmax_sessions = 3\n" => |config| config.tenants.max_concurrent_runs == Some(2)
            && config.tenants.runs_per_minute == Some(60)
            && config.tenants.max_sessions == Some(3),
        no_tenant_quotas_by_default: "" => |config| config.tenants == snakebox_engine::TenantQuotas::default(),
        the_one_tenant_has_the_whole_sessions_disk: "" => |config| config.sessions.tenant_max_disk_bytes.is_none(),
        a_sessions_share: "[sessions]\nmax_disk = \"1GiB\"\n[tenants]\nsessions_max_disk = \"100MiB\"\n" => |config| config.sessions.tenant_max_disk_bytes == Some(100 << 20),
        store_budgets_by_default: "" => |config| config.store_budgets == snakebox_engine::StoreBudgets::default()
            && config.store_budgets.history.items == Some(100_000)
            && config.store_budgets.audit_bytes == 160 << 20
            && config.store_budgets.artifact_bytes == 256 << 20
            && config.store_budgets.audit_queue_bytes == 64 << 20,
        store_budgets_per_tenant: indoc! {r#"
            [server]
            audit_queue_size = "1MiB"
            [tenants]
            history_max_runs = 500
            history_max_size = "10MiB"
            audit_max_size = "2MiB"
            artifacts_max_size = 3145728
        "#} => |config| config.store_budgets.history == snakebox_engine::Budget { items: Some(500), bytes: Some(10 << 20) }
            && config.store_budgets.audit_bytes == 2 << 20
            && config.store_budgets.artifact_bytes == 3 << 20
            && config.store_budgets.audit_queue_bytes == 1 << 20,
        tenant_tables_override_the_defaults_for_one_tenant: indoc! {r#"
            [tenants]
            max_sessions = 4
            runs_per_minute = 60
            [tenants.team-a]
            max_sessions = 1
            history_max_size = "2MiB"
            profiles = ["network"]
            default_profile = "basic"
            [profiles.network]
            tenants = ["team-b"]
        "#} => |config| config.tenants.max_sessions == Some(4)
            && config.tenants.runs_per_minute == Some(60)
            && config.tenant_overrides["team-a"] == snakebox_engine::TenantOverride {
                max_sessions: Some(1),
                history_max_bytes: Some(2 << 20),
                profiles: vec!["network".into()],
                default_profile: Some("basic".into()),
                ..snakebox_engine::TenantOverride::default()
            }
            && config.profiles.all["network"].tenants == ["team-b"]
            && config.tenant_overrides.len() == 1,
        a_tenant_table_alone: "[tenants.team-b]\nmax_concurrent_runs = 1\n" => |config| config.tenants == snakebox_engine::TenantQuotas::default()
            && config.tenant_overrides["team-b"].max_concurrent_runs == Some(1),
        switches_and_booleans: indoc! {r#"
            [pool]
            fork_server = "off"
            [cache]
            no_warm = true
            allow_sdist_builds = true
        "#} => |config| !config.fork_server && !config.warm_cache && config.allow_sdist_builds,
        flat_and_sectioned_keys_mix: indoc! {r#"
            max_timeout = 120
            [sessions]
            max_sessions = 3
        "#} => |config| config.max_timeout == Duration::from_secs(120) && config.sessions.max_sessions == 3,
        flat_key_fills_a_section_that_is_also_written: indoc! {r#"
            max_timeout = 120
            [limits]
            default_timeout = 10
        "#} => |config| config.max_timeout == Duration::from_secs(120)
            && config.default_timeout == Duration::from_secs(10),
        builtin_profiles_and_the_standard_default: "" => |config| config.profiles.default == "standard"
            && config.profiles.names() == ["basic", "data_science", "filesystem", "network", "standard"]
            && !config.compat_tools,
        a_profile_of_the_operators: indoc! {r#"
            [server]
            profile = "web"
            compat_tools = true
            [profiles.web]
            network = ["API.example.com."]
            subprocesses = false
            memory = "512MiB"
            timeout = 20
            packages = ["httpx"]
            tenants = ["team-a"]
        "#} => |config| {
            let web = &config.profiles.all["web"];
            config.profiles.default == "web"
                && config.compat_tools
                && web.network == snakebox_engine::ProfileNetwork::Allow(vec!["api.example.com".into()])
                && !web.subprocesses
                && web.writable_work
                && web.limits.memory_bytes == Some(512 << 20)
                && web.limits.timeout_seconds == Some(20)
                && web.packages == Some(vec!["httpx".into()])
                && web.allowed_imports.is_none()
                && web.tenants == ["team-a"]
        },
        a_builtin_changed_key_by_key: "[profiles.basic]
tenants = [\"*\"]
network = \"off\"
" => |config| {
            let basic = &config.profiles.all["basic"];
            basic.tenants == ["*"] && !basic.subprocesses && basic.allowed_imports.as_ref().is_some_and(|m| m.contains(&"math".to_owned()))
        },
    }

    refused! {
        flat_typo_gets_a_did_you_mean: "max_timeuot = 5\n" => ["unknown key `max_timeuot`", "hint: did you mean `max_timeout`?"],
        section_typo_gets_a_did_you_mean: "[limit]\nmax_timeout = 5\n" => ["unknown key `limit`", "did you mean the section `[limits]`?"],
        key_typo_in_a_section: "[limits]\nmemroy = \"1G\"\n" => ["unknown key `memroy` in `[limits]`", "did you mean `memory`?"],
        unknown_key_in_a_section_lists_the_keys: "[pool]\nwhatever = 1\n" => ["unknown key `whatever` in `[pool]`", "`size`, `fork_server`, `preload_packages`, `prefork`"],
        flat_key_inside_its_section: "[limits]\nmemory_limit = \"1G\"\n" => ["`memory_limit`", "in a section it is `[limits] memory`"],
        key_in_the_wrong_section: "[limits]\nidle_stop = 5\n" => ["`idle_stop` in `[limits]`", "belongs in `[sessions]`"],
        sectioned_key_at_the_top: "idle_stop = 5\n" => ["unknown key `idle_stop`", "`[sessions] idle_stop`"],
        section_that_is_not_a_table: "limits = 5\n" => ["`limits` must be a section", "hint"],
        flat_and_sectioned_twins_conflict: "max_timeout = 5\n[limits]\nmax_timeout = 6\n" => ["`max_timeout` and `[limits] max_timeout`", "both are set", "hint"],
        renamed_twins_conflict: "memory_limit = \"1G\"\n[limits]\nmemory = \"2G\"\n" => ["`memory_limit` and `[limits] memory`"],
        wrong_type_in_a_section: "[limits]\nmax_timeout = \"soon\"\n" => ["`[limits] max_timeout`: invalid type: string \"soon\", expected a whole number", "hint: numbers are written bare"],
        wrong_type_flat: "warm_pool = -1\n" => ["`warm_pool` (`[pool] size`): invalid value: integer `-1`, expected a whole number", "hint: this key takes a whole number, 0 or more"],
        unknown_choice: "[network]\nmode = \"maybe\"\n" => ["maybe", "hint"],
        bad_install_host: "[network]\ninstall_hosts = \"files example\"\n" => ["--network-install-hosts", "`files example`", "hint"],
        zero_connections: "[network]\nmax_connections = 0\n" => ["--network-max-connections must be at least 1", "hint"],
        bad_network_bytes: "[network]\nmax_bytes = \"lots\"\n" => ["--network-max-bytes", "hint"],
        unknown_choice_flat: "sandbox_backend = \"podman\"\n" => ["podman"],
        bad_size_names_the_flag: "[limits]\nmemory = \"lots\"\n" => ["--memory-limit", "hint"],
        bad_size_flat: "memory_limit = \"lots\"\n" => ["--memory-limit", "hint"],
        zero_timeout: "[limits]\nmax_timeout = 0\n" => ["--max-timeout must be at least 1"],
        default_above_max: "[limits]\nmax_timeout = 10\ndefault_timeout = 20\n" => ["larger than --max-timeout", "hint"],
        not_toml: "[limits\n" => ["TOML", "limits"],
        zero_tenant_quota: "[tenants]\nmax_sessions = 0\n" => ["--tenant-max-sessions must be at least 1", "hint"],
        zero_history_runs: "[tenants]\nhistory_max_runs = 0\n" => ["--tenant-history-max-runs must be at least 1", "hint"],
        tiny_audit_budget: "[tenants]\naudit_max_size = \"1KiB\"\n" => ["--tenant-audit-max-size (`[tenants] audit_max_size`) must be at least 65536 bytes", "hint"],
        bad_artifacts_budget: "[tenants]\nartifacts_max_size = \"lots\"\n" => ["invalid --tenant-artifacts-max-size (`[tenants] artifacts_max_size`)"],
        bad_sessions_share: "[tenants]\nsessions_max_disk = \"lots\"\n" => ["invalid --tenant-sessions-max-disk (`[tenants] sessions_max_disk`)", "hint"],
        tiny_sessions_share: "[tenants]\nsessions_max_disk = \"1MiB\"\n" => ["--tenant-sessions-max-disk", "at least 32MiB", "hint"],
        share_larger_than_the_disk: "[sessions]\nmax_disk = \"1GiB\"\n[tenants]\nsessions_max_disk = \"2GiB\"\n" => ["--tenant-sessions-max-disk (`2GiB`) is larger than --sessions-max-disk", "hint: a tenant's share is a part"],
        tiny_audit_queue: "[server]\naudit_queue_size = \"64KiB\"\n" => ["--audit-queue-size (`[server] audit_queue_size`) must be at least 524288 bytes", "hint"],
        tenant_key_typo: "[tenants]\nmax_session = 2\n" => ["unknown key `max_session` in `[tenants]`", "did you mean `max_sessions`?"],
        tenant_table_key_typo: "[tenants.team-a]\nmax_session = 2\n" => ["unknown key `max_session` in `[tenants.team-a]`", "did you mean `max_sessions`?"],
        tenant_table_profile_typo: "[tenants.team-a]\ndefault_profiles = \"basic\"\n" => ["unknown key `default_profiles` in `[tenants.team-a]`", "did you mean `default_profile`?"],
        tenant_table_bad_name: "[tenants.Team-A]\nmax_sessions = 2\n" => ["invalid tenant name `[tenants.Team-A]`", "hint"],
        tenant_table_named_like_a_setting: "[tenants.max_sessions]\nmax_sessions = 2\n" => ["`max_sessions` is a setting of `[tenants]`", "hint"],
        tenant_table_zero: "[tenants.team-a]\nmax_sessions = 0\n" => ["`[tenants.team-a] max_sessions` must be at least 1", "hint"],
        tenant_table_wrong_type: "[tenants.team-a]\nmax_sessions = \"2\"\n" => ["`[tenants.team-a] max_sessions`", "hint: numbers are written bare"],
        tenant_table_bad_size: "[tenants.team-a]\naudit_max_size = \"1KiB\"\n" => ["`[tenants.team-a] audit_max_size` must be at least 65536 bytes", "hint"],
        tenant_table_share_larger_than_the_disk: "[sessions]\nmax_disk = \"1GiB\"\n[tenants.team-a]\nsessions_max_disk = \"2GiB\"\n" => ["`[tenants.team-a] sessions_max_disk`", "larger than --sessions-max-disk", "hint"],
        tenant_table_unknown_profile: "[tenants.team-a]\nprofiles = [\"nope\"]\n" => ["`[tenants.team-a] profiles` names `nope`, which is not a profile", "hint: name one of basic"],
        tenant_table_unknown_default_profile: "[tenants.team-a]\ndefault_profile = \"nope\"\n" => ["`[tenants.team-a] default_profile` names `nope`", "hint"],
        frame_limit_too_small: "[server]\nmax_frame_bytes = \"1K\"\n" => ["--max-frame-bytes must be between 64KiB and 1GiB", "hint"],
        frame_limit_not_a_size: "[server]\nmax_frame_bytes = \"big\"\n" => ["--max-frame-bytes", "hint"],
        unknown_default_profile: "[server]\nprofile = \"nope\"\n" => ["names `nope`, which is not a profile", "hint: name one of basic, data_science"],
        profile_key_typo: "[profiles.x]\nsubprocess = false\n" => ["unknown field `subprocess`"],
        profile_network_choice: "[profiles.x]\nnetwork = \"sometimes\"\n" => ["`[profiles.x] network` `sometimes`", "hint"],
        profile_memory_too_small: "[profiles.x]\nmemory = \"1MiB\"\n" => ["invalid `[profiles.x] memory`: `1MiB` is below 16MiB, too little for Python to start", "hint: give 16MiB or more"],
        profile_name: "[profiles.Big]\n" => ["invalid profile name `[profiles.Big]`", "hint"],
        one_process: "[limits]\nprocesses = 1\n" => ["invalid --max-processes (`[limits] processes`) value", "a run needs at least 2 processes", "got 1", "hint: give 2 or more"],
        profile_one_process: "[profiles.x]\nprocesses = 1\n" => ["invalid `[profiles.x] processes`", "a run needs at least 2 processes", "hint"],
        profile_no_process: "[profiles.x]\nprocesses = 0\n" => ["invalid `[profiles.x] processes`", "a run needs at least 2 processes", "got 0", "hint"],
        frame_limit_below_the_script_limit: "[server]\nmax_frame_bytes = \"1MiB\"\n[limits]\nmax_script_bytes = \"2MiB\"\n" => ["leaves no room for a script", "hint"],
    }

    /// A value for every flat key, each different from its default.
    const SAMPLES: &[(&str, &str)] = &[
        ("data_dir", "\"/srv/snakebox\""),
        ("max_concurrent_runs", "3"),
        ("max_frame_bytes", "\"4MiB\""),
        ("python_version", "\"3.12\""),
        ("uv_path", "\"/opt/uv\""),
        ("python_downloads", "\"automatic\""),
        ("sandbox_backend", "\"none\""),
        ("bwrap_path", "\"/opt/bwrap\""),
        ("network", "\"on\""),
        ("network_resolvers", "\"198.51.100.2\""),
        ("network_ports", "\"443,8443\""),
        ("network_allow_ip_literals", "true"),
        ("network_exceptions", "\"10.20.0.0/16\""),
        ("network_install_hosts", "\"files.example.org\""),
        ("network_max_connections", "8"),
        ("network_max_bytes", "\"64MiB\""),
        ("network_max_connection_seconds", "30"),
        ("default_timeout", "7"),
        ("max_timeout", "70"),
        ("max_output_bytes", "4096"),
        ("memory_limit", "\"2GiB\""),
        ("max_processes", "64"),
        ("cpu_limit", "20"),
        ("cpu_cores", "0.5"),
        ("scratch_limit", "\"64MiB\""),
        ("max_script_bytes", "2048"),
        ("warm_pool", "5"),
        ("fork_server", "\"off\""),
        ("preload_packages", "3"),
        ("prefork", "3"),
        ("no_warm_cache", "true"),
        ("allow_sdist_builds", "true"),
        ("install_timeout", "90"),
        ("cache_max_size", "\"1GiB\""),
        ("cache_max_age_days", "3"),
        ("session_idle_stop", "60"),
        ("session_idle_delete", "600"),
        ("max_sessions", "4"),
        ("sessions_max_disk", "\"1GiB\""),
        ("session_max_interpreters", "2"),
        ("artifact_max_age_hours", "2"),
        ("artifact_max_size", "\"10MiB\""),
    ];

    #[test]
    fn every_flat_key_and_its_sectioned_twin_resolve_alike() {
        assert_eq!(SAMPLES.len(), FLAT_KEYS.len());
        let defaults = shown(&resolve_settings("").unwrap());
        for &(flat, section, name) in FLAT_KEYS {
            let value = SAMPLES
                .iter()
                .find(|(key, _)| *key == flat)
                .map(|(_, value)| *value)
                .unwrap_or_else(|| panic!("no sample for `{flat}`"));
            let flat_form = resolve_settings(&format!("{flat} = {value}\n"))
                .unwrap_or_else(|err| panic!("`{flat}` refused: {err:#}"));
            let sectioned_form = resolve_settings(&format!("[{section}]\n{name} = {value}\n"))
                .unwrap_or_else(|err| panic!("`[{section}] {name}` refused: {err:#}"));
            assert_eq!(shown(&flat_form), shown(&sectioned_form), "{flat}");
            assert_ne!(shown(&flat_form), defaults, "`{flat}` changed nothing");
            let both = resolve_text(&format!(
                "{flat} = {value}\n[{section}]\n{name} = {value}\n"
            ))
            .expect_err(flat);
            let both = format!("{both:#}");
            // `network` is also the section's name: TOML refuses the pair before we see it.
            let named = if flat == "network" {
                "`[network]` section cannot both be written".to_owned()
            } else {
                format!("`{flat}` and `[{section}] {name}`")
            };
            assert!(both.contains(&named) && both.contains("hint"), "{both}");
        }
    }

    #[test]
    fn the_frame_limit_defaults_to_16_mib_or_twice_the_script_limit() {
        let frame = |text: &str| resolve_settings(text).unwrap().max_frame_bytes;
        assert_eq!(frame(""), 16 << 20);
        assert_eq!(frame("[limits]\nmax_script_bytes = \"12MiB\"\n"), 24 << 20);
        assert_eq!(frame("[server]\nmax_frame_bytes = \"2MiB\"\n"), 2 << 20);
    }

    /// The keys a section's struct reads, as serde sees them: a deserializer that only
    /// records the field list it is asked for.
    fn fields_of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
        use serde::de::{self, Visitor};
        struct Fields<'a>(&'a mut &'static [&'static str]);
        impl<'de> de::Deserializer<'de> for Fields<'_> {
            type Error = de::value::Error;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
                Err(de::Error::custom("not a struct"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Self::Error> {
                *self.0 = fields;
                Err(de::Error::custom("recorded"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
                byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
                identifier ignored_any
            }
        }
        let mut fields: &'static [&'static str] = &[];
        let _ = T::deserialize(Fields(&mut fields));
        fields
    }

    /// A key a section's struct reads but the key check does not know is refused as unknown
    /// (as `[sandbox] docker_runtime` was): every field must be a known key.
    #[test]
    fn every_field_of_every_section_is_a_known_key() {
        let sections: [(&str, &[&str]); 11] = [
            ("server", fields_of::<ServerFile>()),
            ("python", fields_of::<PythonFile>()),
            ("sandbox", fields_of::<SandboxFile>()),
            ("network", fields_of::<NetworkFile>()),
            ("limits", fields_of::<LimitsFile>()),
            ("pool", fields_of::<PoolFile>()),
            ("cache", fields_of::<CacheFile>()),
            ("sessions", fields_of::<SessionsFile>()),
            ("artifacts", fields_of::<ArtifactsFile>()),
            ("tenants", fields_of::<TenantsFile>()),
            ("http", fields_of::<HttpFile>()),
        ];
        assert_eq!(sections.len(), SECTIONS.len());
        for (section, fields) in sections {
            assert!(!fields.is_empty(), "{section}");
            for field in fields {
                assert!(
                    check_section_key(section, field).is_ok(),
                    "[{section}] {field} is read but refused as unknown"
                );
            }
        }
    }

    #[test]
    fn a_wrong_type_names_its_key_and_what_to_write() {
        let error = |text: &str| format!("{:#}", parse_file(text).unwrap_err());
        let message = error("[limits]\ndefault_timeout = \"60\"\n");
        assert!(
            message.contains(
                "`[limits] default_timeout`: invalid type: string \"60\", expected a whole number"
            ),
            "{message}"
        );
        assert!(
            message.contains("hint: numbers are written bare: `120`"),
            "{message}"
        );
        let message = error("[limits]\nmemory = 5.5\n");
        assert!(
            message.contains("`[limits] memory`: expected a whole number"),
            "{message}"
        );
        assert!(!message.contains("untagged"), "{message}");
        let message = error("[cache]\nno_warm = \"on\"\n");
        assert!(
            message.contains("hint: a switch of this key is written bare: `true` or `false`"),
            "{message}"
        );
        let message = error("[pool]\nfork_server = true\n");
        assert!(
            message.contains("`[pool] fork_server`: expected `\"on\"` or `\"off\"`"),
            "{message}"
        );
        let message = error("install_timeout = \"9\"\n");
        assert!(
            message.contains("`install_timeout` (`[cache] install_timeout`): invalid type"),
            "{message}"
        );
        let message = error("[profiles.mine]\ntimeout = \"5\"\n");
        assert!(
            message.contains("`[profiles.mine] timeout`: invalid type"),
            "{message}"
        );
        let message = error("profile = \"basic\"\n");
        assert!(
            message.contains("hint: `profile` belongs in a section: `[server] profile`"),
            "{message}"
        );
        assert!(parse_file("[sandbox]\ndocker_runtime = \"runsc\"\n").is_ok());
    }

    #[test]
    fn sections_are_the_flat_keys_sections() {
        for &(_, section, _) in FLAT_KEYS {
            assert!(SECTIONS.contains(&section), "{section}");
        }
        for section in SECTIONS {
            assert!(
                FLAT_KEYS.iter().any(|(_, s, _)| s == section)
                    || SECTION_KEYS.iter().any(|(s, _)| s == section),
                "{section}"
            );
        }
    }

    /// `audit --event` and `--status` list their values by hand in `--help`: every kind and
    /// status the parser accepts must be among them.
    #[test]
    fn audit_help_lists_every_event_kind_and_status() {
        use clap::CommandFactory;
        let command = crate::cli::Cli::command();
        let audit = command
            .find_subcommand("audit")
            .expect("an audit subcommand");
        let help = |id: &str| {
            audit
                .get_arguments()
                .find(|arg| arg.get_id() == id)
                .and_then(|arg| arg.get_help())
                .map(ToString::to_string)
                .unwrap_or_default()
        };
        let (events, statuses) = (help("event"), help("status"));
        for kind in snakebox_engine::EventKind::ALL {
            assert!(
                events.contains(kind.as_str()),
                "--event's help lacks {}",
                kind.as_str()
            );
        }
        for status in snakebox_engine::Status::ALL {
            assert!(
                statuses.contains(status.as_str()),
                "--status's help lacks {}",
                status.as_str()
            );
        }
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        crate::cli::Cli::command().debug_assert();
    }

    /// Every flag of earlier versions, with a value, as `serve`, `run` and `check` take them.
    #[test]
    fn every_flag_still_parses_for_every_command() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let flags: Vec<String> = [
            "--config=/etc/snakebox.toml",
            "--python-version=3.12",
            "--sandbox-backend=none",
            "--max-timeout=70",
            "--default-timeout=7",
            "--max-output-bytes=4096",
            "--no-warm-cache",
            "--warm-pool=5",
            "--fork-server=off",
            "--preload-packages=3",
            "--prefork=3",
            "--uv-path=/opt/uv",
            "--python-downloads=automatic",
            "--bwrap-path=/opt/bwrap",
            "--data-dir=/srv/snakebox",
            "--network=on",
            "--network-resolvers=198.51.100.2",
            "--network-ports=443",
            "--network-allow-ip-literals",
            "--network-exceptions=10.20.0.0/16",
            "--network-install-hosts=files.example.org",
            "--network-max-connections=8",
            "--network-max-bytes=64MiB",
            "--network-max-connection-seconds=30",
            "--allow-sdist-builds",
            "--install-timeout=90",
            "--memory-limit=2GiB",
            "--max-processes=64",
            "--cpu-limit=20",
            "--cpu-cores=0.5",
            "--scratch-limit=64MiB",
            "--max-script-bytes=2048",
            "--cache-max-size=1GiB",
            "--cache-max-age-days=3",
            "--max-concurrent-runs=3",
            "--max-frame-bytes=4MiB",
            "--session-idle-stop=60",
            "--session-idle-delete=600",
            "--max-sessions=4",
            "--sessions-max-disk=1GiB",
            "--session-max-interpreters=2",
            "--artifact-max-age-hours=2",
            "--artifact-max-size=10MiB",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(flags.len(), FLAT_KEYS.len() + 1);
        for command in [
            vec!["serve"],
            vec!["run", "x.py"],
            vec!["check"],
            vec!["python", "install", "3.14"],
        ] {
            let argv = ["snakebox"]
                .into_iter()
                .map(str::to_owned)
                .chain(command.iter().map(|word| (*word).to_owned()))
                .chain(flags.iter().cloned());
            let cli = Cli::try_parse_from(argv).unwrap_or_else(|err| panic!("{command:?}: {err}"));
            let args = match cli.command {
                Command::Serve(serve) => serve.engine,
                Command::Run(run) => run.engine,
                Command::Check(check) => check.engine,
                Command::Audit(audit) => audit.engine,
                Command::Keys(keys) => keys.action.engine().clone(),
                Command::Python(python) => {
                    let crate::cli::PythonAction::Install { engine, .. } = python.action;
                    *engine
                }
                Command::Image(_) => unreachable!("`image` takes no engine flags"),
            };
            assert_eq!(
                args.python.python_downloads,
                Some(crate::cli::PythonDownloadsArg::Automatic)
            );
            assert_eq!(args.limits.memory_limit.as_deref(), Some("2GiB"));
            assert_eq!(args.sessions.max_sessions, Some(4));
            assert!(args.cache.no_warm_cache && args.cache.allow_sdist_builds);
            assert_eq!(args.network.network.as_deref(), Some("on"));
            assert_eq!(args.artifacts.artifact_max_size.as_deref(), Some("10MiB"));
        }
    }

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
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("max_timeout", "max_timeout"), 0);
        assert_eq!(edit_distance("max_timeuot", "max_timeout"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(closest("zzzzzz", ["max_timeout"].into_iter()), None);
    }

    #[test]
    fn cli_wins_over_file_and_file_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs_err::write(
            &path,
            indoc! {r#"
                install_timeout = 90
                [limits]
                max_timeout = 120
                default_timeout = 10
                memory = "256MiB"
                [network]
                mode = "on"
                [pool]
                fork_server = "off"
                [cache]
                allow_sdist_builds = true
            "#},
        )
        .unwrap();
        let mut args = EngineArgs {
            config: Some(path),
            ..EngineArgs::default()
        };
        args.limits.default_timeout = Some(20);
        let config = resolve(&args).unwrap().engine;
        assert_eq!(config.max_timeout, Duration::from_secs(120));
        assert_eq!(config.default_timeout, Duration::from_secs(20));
        assert_eq!(config.memory_bytes, Some(256 << 20));
        assert_eq!(config.network, snakebox_engine::NetworkPolicy::On);
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
        let config = resolve(&args).unwrap().engine;
        assert!(config.fork_server);
        assert!(!config.allow_sdist_builds);
        assert_eq!(
            config.install_timeout,
            snakebox_env::DEFAULT_INSTALL_TIMEOUT
        );
    }

    #[test]
    fn errors_name_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs_err::write(&path, "max_timeuot = 5\n").unwrap();
        let args = EngineArgs {
            config: Some(path.clone()),
            ..EngineArgs::default()
        };
        let err = format!("{:#}", resolve(&args).unwrap_err());
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("max_timeuot") && err.contains("hint"), "{err}");
    }
}
