//! Resolved engine settings: what the operator decided, after CLI, environment and config
//! file were merged by the binary. Plain data with documented defaults.

use std::path::PathBuf;
use std::time::Duration;

use snakebox_sandbox::BackendKind;

/// Declared distributions a fork server preloads by default (see
/// [`EngineConfig::preload_packages`]).
pub const DEFAULT_PRELOAD_PACKAGES: usize = 8;
/// The most it may be set to (the fork server takes no more than 64 modules either way).
pub const MAX_PRELOAD_PACKAGES: usize = 64;
/// Pre-forked children each fork server keeps ready by default ([`EngineConfig::prefork`]).
pub const DEFAULT_PREFORK: usize = 2;

/// Everything the engine needs to know from the operator.
/// `python_downloads`: whether the server downloads a Python version it lacks.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PythonDownloads {
    /// Never (the default): a missing version is refused, naming the fix.
    #[default]
    Never,
    /// When a call asks for a version no interpreter here has, `uv python install` it
    /// (from python-build-standalone, or `UV_PYTHON_INSTALL_MIRROR`), then use it.
    Automatic,
}

impl PythonDownloads {
    /// The setting's name in the config file and on the command line.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::Automatic => "automatic",
        }
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Root of snakebox's own data: environments, uv cache, scratch directories.
    pub data_dir: PathBuf,
    /// Where the keys, the runs table and the audit log are shared by several fronts
    /// (`--database postgres://…`); `None`: the data directory's SQLite store.
    pub database: Option<crate::DatabaseUrl>,
    /// The isolation backend.
    pub backend: BackendKind,
    /// Explicit `bwrap` path.
    pub bwrap_path: Option<PathBuf>,
    /// The docker backend's runtime (`runsc`); the engine's default when `None`.
    pub docker_runtime: Option<String>,
    /// Explicit `uv` path.
    pub uv_path: Option<PathBuf>,
    /// Default Python version request (`3.12`, `>=3.10`); `None` means the newest CPython found.
    pub python_version: Option<String>,
    /// Whether a version a call asks for and this host lacks is downloaded (`uv python
    /// install`) instead of refused.
    pub python_downloads: PythonDownloads,
    /// Timeout applied when a call gives none.
    pub default_timeout: Duration,
    /// Largest timeout a call may ask for (larger requests are clamped, with a note).
    pub max_timeout: Duration,
    /// Bytes of stdout + stderr kept per run.
    pub max_output_bytes: u64,
    /// Largest script accepted, in bytes.
    pub max_script_bytes: usize,
    /// Memory per run.
    pub memory_bytes: Option<u64>,
    /// Processes/threads per run.
    pub max_processes: Option<u64>,
    /// CPU seconds per run (`None`: the wall-time limit bounds it).
    pub cpu_time: Option<Duration>,
    /// Scratch space (`/tmp`, working directory) per run.
    pub scratch_bytes: Option<u64>,
    /// Largest file a run may write.
    pub file_size_bytes: Option<u64>,
    /// Open files per process.
    pub open_files: Option<u64>,
    /// CPU bandwidth per run in thousandths of a core (`None`: unlimited).
    pub cpu_millicores: Option<u64>,
    /// The network policy of runs (`off`, `on`, `allow:` names).
    pub network: crate::NetworkPolicy,
    /// How the run proxy checks destinations (ports, raw addresses, exceptions, resolvers,
    /// caps).
    pub network_proxy: crate::ProxySettings,
    /// The secrets runs may ask for, whose values only the run proxy holds
    /// (`[secrets.NAME]`; see the `secrets` module).
    pub secrets: crate::SecretsConfig,
    /// Pre-started sandboxes kept ready per warm environment (`0`: no warm pool). See
    /// the `pool` module.
    pub warm_pool: usize,
    /// Fork runs of the default environment from a pre-initialised interpreter while serving
    /// (see the `pool` module); falls back to the warm pool where that is unavailable.
    pub fork_server: bool,
    /// How many of an environment's declared distributions its fork server imports before it
    /// forks runs (`0`: none; the rest are imported by the runs that need them).
    pub preload_packages: usize,
    /// Children each fork server keeps already forked into a run's fresh sandbox, waiting for
    /// a run (`0`: every run is forked when it comes); at most
    /// [`snakebox_sandbox::MAX_PREFORK`].
    pub prefork: usize,
    /// Build the default environment at start-up.
    pub warm_cache: bool,
    /// With `warm_cache`, also build an environment of each of these requirements at start-up
    /// (`[cache] warm`), after the default one: a run that declares exactly one of them finds
    /// it ready, and other sets with it build from the wheels already in uv's cache.
    pub warm_packages: Vec<pep508_rs::Requirement>,
    /// Environment cache: total size above which least-recently-used environments are pruned.
    pub cache_max_bytes: u64,
    /// Environment cache: environments unused for this long are pruned.
    pub cache_max_age: Duration,
    /// Requirement sets with unpinned specifiers are re-resolved after this long.
    pub unpinned_freshness: Duration,
    /// Runs executing at once; further calls wait their turn.
    pub max_concurrent_runs: usize,
    /// Persistent sessions: idle times and caps.
    pub sessions: SessionSettings,
    /// What one tenant may take of the server (runs at once, runs per minute, sessions).
    pub tenants: crate::TenantQuotas,
    /// What `[tenants.NAME]` sets apart for one tenant, by name ([`crate::TenantOverride`]).
    pub tenant_overrides: std::collections::BTreeMap<String, crate::TenantOverride>,
    /// What one tenant may keep in each shared store (the runs table, the audit log, the
    /// artifact store) and the writer's queue ([`crate::StoreBudgets`]).
    pub store_budgets: crate::StoreBudgets,
    /// Artifacts (files a run produced) are removed this long after the run.
    pub artifact_max_age: Duration,
    /// The artifact store's total size: a run whose files would take it past this keeps its
    /// files only by removing its own tenant's oldest; never another tenant's.
    pub artifact_max_bytes: u64,
    /// Build requirements that publish no wheel from their sdist (sandboxed like a run,
    /// offline). Off: wheels only.
    pub allow_sdist_builds: bool,
    /// Time limit of each step of an environment build (also the wall time of the package
    /// code it runs: compilation, builds).
    pub install_timeout: Duration,
    /// The profiles offered and the default one ([`crate::Profiles`]).
    pub profiles: crate::Profiles,
    /// The tool sets of other servers the MCP face serves beside snakebox's own
    /// (`--compat-tools`), sorted, each once.
    pub compat_tools: Vec<CompatToolSet>,
    /// Host directories whose files `upload_file_to_sandbox` (python-mcp-sandbox's tool set)
    /// may read, canonical (`--upload-dirs`); empty: it reads none.
    pub upload_dirs: Vec<PathBuf>,
    /// The package index installs resolve from instead of PyPI (`--index-url`: a mirror);
    /// `None`: what the server's environment says (`UV_DEFAULT_INDEX`, ...), else PyPI.
    pub index_url: Option<String>,
    /// Add the package of a well-known import a script does not declare
    /// (`--infer-dependencies`; see the `infer` module).
    pub infer_dependencies: bool,
}

impl EngineConfig {
    /// Whether the MCP face serves `set` (`--compat-tools`).
    #[must_use]
    pub fn serves(&self, set: CompatToolSet) -> bool {
        self.compat_tools.contains(&set)
    }
}

/// A tool set of another Python-running MCP server that snakebox serves beside its own, so
/// that its clients and prompts keep working (`--compat-tools NAME,...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CompatToolSet {
    /// IBM's python sandbox server: `execute_code`, `validate_code`, `get_sandbox_info`.
    Ibm,
    /// python-mcp-sandbox: `create_sandbox`, `list_sandboxes`, `execute_python_code`, ...
    PythonMcpSandbox,
    /// Python Code Executor: `execute_python(code, timeout)`, `install_package`, ...
    CodeExecutor,
}

impl CompatToolSet {
    /// Every set, in the order they are listed.
    pub const ALL: [CompatToolSet; 3] = [Self::Ibm, Self::PythonMcpSandbox, Self::CodeExecutor];

    /// Its name on the command line and in the config file.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ibm => "ibm",
            Self::PythonMcpSandbox => "python-mcp-sandbox",
            Self::CodeExecutor => "code-executor",
        }
    }

    /// The set named `name` (`_` taken for `-`, any case).
    #[must_use]
    pub fn from_name(name: &str) -> Option<CompatToolSet> {
        let name = name.trim().to_ascii_lowercase().replace('_', "-");
        Self::ALL.into_iter().find(|set| set.name() == name)
    }
}

impl EngineConfig {
    /// Defaults for a given data directory and backend.
    #[must_use]
    pub fn new(data_dir: PathBuf, backend: BackendKind) -> Self {
        EngineConfig {
            data_dir,
            database: None,
            backend,
            bwrap_path: None,
            docker_runtime: None,
            uv_path: None,
            python_version: None,
            python_downloads: PythonDownloads::Never,
            default_timeout: Duration::from_secs(30),
            max_timeout: Duration::from_secs(300),
            max_output_bytes: 102_400,
            max_script_bytes: 1024 * 1024,
            memory_bytes: Some(1024 * 1024 * 1024),
            max_processes: Some(128),
            cpu_time: None,
            scratch_bytes: Some(512 * 1024 * 1024),
            file_size_bytes: Some(256 * 1024 * 1024),
            open_files: Some(1024),
            cpu_millicores: Some(1000),
            network: crate::NetworkPolicy::Off,
            network_proxy: crate::ProxySettings::default(),
            secrets: crate::SecretsConfig::default(),
            warm_pool: 2,
            fork_server: true,
            preload_packages: DEFAULT_PRELOAD_PACKAGES,
            prefork: DEFAULT_PREFORK,
            warm_cache: true,
            warm_packages: Vec::new(),
            cache_max_bytes: 10 * 1024 * 1024 * 1024,
            cache_max_age: Duration::from_secs(30 * 24 * 3600),
            unpinned_freshness: Duration::from_secs(24 * 3600),
            max_concurrent_runs: 8,
            sessions: SessionSettings::default(),
            tenants: crate::TenantQuotas::default(),
            tenant_overrides: std::collections::BTreeMap::new(),
            store_budgets: crate::StoreBudgets::default(),
            artifact_max_age: Duration::from_secs(24 * 3600),
            artifact_max_bytes: 1024 * 1024 * 1024,
            allow_sdist_builds: false,
            install_timeout: snakebox_env::DEFAULT_INSTALL_TIMEOUT,
            profiles: crate::Profiles::default(),
            compat_tools: Vec::new(),
            upload_dirs: Vec::new(),
            infer_dependencies: false,
            index_url: None,
        }
    }
}

/// The smallest share of the sessions' disk (and the smallest sessions' disk): an ext4 image
/// of less leaves little room once its own metadata is written.
pub const MIN_SESSIONS_DISK_SHARE: u64 = 32 << 20;

/// Served over HTTP (several tenants), a tenant's share of the sessions' disk is by default
/// this part of it: shares are reserved, so this many tenants may hold sessions at once, and
/// none can take the others' room. (On stdio the one tenant has the whole disk.)
pub const TENANTS_PER_SESSIONS_DISK: u64 = 4;

/// The operator's settings for sessions.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    /// A session's interpreter idle this long is stopped (variables lost, files kept).
    pub idle_stop: Duration,
    /// A session unused this long is deleted with its files.
    pub idle_delete: Duration,
    /// Sessions that may exist at once.
    pub max_sessions: usize,
    /// Total bytes of all sessions' workspaces and environments: what every tenant's share
    /// together may reserve.
    pub max_disk_bytes: u64,
    /// One tenant's share of `max_disk_bytes` (its sessions' image); `None`: all of it.
    pub tenant_max_disk_bytes: Option<u64>,
    /// Interpreters that may run at once: starting one more first stops the least recently
    /// used idle one (its variables are lost; the next call says so).
    pub max_interpreters: usize,
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings {
            idle_stop: Duration::from_secs(15 * 60),
            idle_delete: Duration::from_secs(7 * 24 * 3600),
            max_sessions: 32,
            max_disk_bytes: 10 * 1024 * 1024 * 1024,
            tenant_max_disk_bytes: None,
            max_interpreters: 8,
        }
    }
}
