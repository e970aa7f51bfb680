//! `check_environment`: an honest picture of this host: versions, the sandbox backend and
//! whether it really isolates, each limit and whether it is enforced, interpreters, cache.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::human_bytes;
use std::sync::Arc;

use crate::{Caller, EngineConfig, EngineError, Unavailable, WarmState};

/// One interpreter found on this host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InterpreterReport {
    /// Full version.
    pub version: String,
    /// Path of the real binary.
    pub path: String,
    /// Where it came from (`pyenv`, `uv-managed`, `system`, `path`).
    pub source: String,
}

/// A limit and how it is enforced here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LimitStatus {
    /// Limit name.
    pub name: String,
    /// Configured value (`unlimited` when not set).
    pub value: String,
    /// Whether this host really enforces it.
    pub enforced: bool,
    /// The mechanism in force.
    pub mechanism: String,
}

/// The environment cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CacheReport {
    /// Data directory.
    pub location: String,
    /// Number of cached environments.
    pub environments: usize,
    /// Their total size in bytes.
    pub size_bytes: u64,
    /// The retention rule.
    pub retention: String,
    /// How dependencies are installed: what the download may reach, how package code
    /// (compilation, builds) runs, whether sdists are built.
    pub installs: String,
    /// Cache warming.
    pub warm: WarmState,
    /// New environments are published before their bytecode and compiled after their first
    /// run, in the background: what became of that since the server started.
    pub compilation: CompilationReport,
}

/// Background byte-compilation of new environments (see [`CacheReport::compilation`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct CompilationReport {
    /// Whether new environments are published before they are compiled (a server: yes).
    pub deferred: bool,
    /// Environments queued or being compiled.
    pub pending: usize,
    /// Compiled copies published in place of their environment.
    pub completed: u64,
    /// Attempts whose copy was discarded (the environment stays verified, uncompiled).
    pub failed: u64,
    /// Why the last failed attempt failed.
    pub last_failure: Option<String>,
}

/// The caps of a run's network proxy (`[network]` `max_connections`, `max_bytes`,
/// `max_connection_seconds`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkCapsReport {
    /// Connections one run (or session call) may open.
    pub connections: u64,
    /// Bytes one run may move through its proxy, both directions together.
    pub bytes: u64,
    /// Seconds one connection may stay open.
    pub connection_seconds: u64,
}

/// The artifact store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ArtifactsReport {
    /// Directory of the store.
    pub location: String,
    /// The retention rule (age, then size quota).
    pub retention: String,
    /// Per-run bounds: files kept, bytes per file, bytes per run; inline images.
    pub limits: String,
}

/// The full `check_environment` record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EnvironmentReport {
    /// snakebox version.
    pub snakebox_version: String,
    /// `os/arch` and kernel release.
    pub platform: String,
    /// Configured sandbox backend (`native` or `none`).
    pub sandbox_backend: String,
    /// Whether runs are really isolated right now.
    pub isolation_active: bool,
    /// Details of the backend, or why it is unavailable.
    pub sandbox_details: Vec<String>,
    /// How to fix an unavailable backend.
    pub sandbox_hint: Option<String>,
    /// Whether runs may use the network.
    pub network: bool,
    /// The network policy of runs: `off`, `on` or `allow:NAME,...`.
    pub network_policy: String,
    /// How the network policy is enforced here (namespace, proxy, checks, caps).
    pub network_enforcement: String,
    /// The caps of each run's network proxy.
    pub network_caps: NetworkCapsReport,
    /// What installs may download from (`[network] install_hosts`).
    pub install_network: String,
    /// The operator's secrets this caller may ask for (`secrets` of execute_python): names
    /// and hosts only, never a value.
    #[serde(default)]
    pub secrets: Vec<crate::SecretReport>,
    /// uv path and version, or why it is missing.
    pub uv: String,
    /// How to fix a missing uv.
    pub uv_hint: Option<String>,
    /// The Python version request used when a call gives none.
    pub default_python: String,
    /// Interpreters found.
    pub pythons: Vec<InterpreterReport>,
    /// Whether a version asked for and not found here is downloaded (`automatic`) or refused
    /// (`never`; the operator can add one with `snakebox python install`).
    pub python_downloads: crate::PythonDownloads,
    /// Whether a script that imports a well-known package it does not declare gets it
    /// installed (`sklearn` → scikit-learn; the result's notes say what was added). Declare
    /// dependencies to choose their versions.
    pub infer_dependencies: bool,
    /// Limits: configured value, whether enforced, and how.
    pub limits: Vec<LimitStatus>,
    /// Default and maximum timeout in seconds.
    pub timeouts: String,
    /// Environment cache.
    pub cache: CacheReport,
    /// Artifact store: where files produced by runs are kept, and for how long.
    pub artifacts: ArtifactsReport,
    /// Persistent sessions: the live ones, running interpreters, disk, caps and idle timers.
    pub sessions: crate::session::SessionsReport,
    /// What the caller's tenant keeps in the shared stores (the runs table, the audit log,
    /// the artifact store), its budget in each and what its budgets removed; the writer's
    /// queue and what it dropped of the tenant's records.
    pub stores: crate::StoresReport,
    /// The warm pool of pre-started sandboxes: size, how many are ready, what it served.
    pub warm_pool: crate::PoolReport,
    /// The profile of a call that names none (the caller's tenant's own, when the operator
    /// gave it one).
    pub default_profile: String,
    /// The caller's tenant: what it may take of the server (runs at once, per minute,
    /// sessions), keep in each store and which profiles it may name (the `[tenants]`
    /// defaults and its own `[tenants.NAME]`). Only the caller's own; absent for the
    /// operator (`snakebox check`).
    pub tenant: Option<crate::Tenant>,
    /// The profiles a call may name (`profile`), what each decides and how it is enforced.
    pub profiles: Vec<ProfileReport>,
    /// Whether executions can run now; if not, `problems` says why.
    pub ready: bool,
    /// What stops executions, each with its fix.
    pub problems: Vec<String>,
}

/// One profile as `check_environment` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProfileReport {
    /// Its name, for `profile`.
    pub name: String,
    /// What it is for.
    pub description: String,
    /// Whether it is the default of the caller's calls (the server's, or the caller's
    /// tenant's own).
    pub default: bool,
    /// Whether this caller may name it.
    pub available: bool,
    /// Each decision and how it is enforced: by the sandbox (the OS), by the server before
    /// anything runs, or as a guard rail (the import policy).
    pub enforces: Vec<String>,
    /// Whether runs may start programs (`false`: seccomp denies `execve`).
    pub subprocesses: bool,
    /// Where runs may connect: `off`, `server` (the server's `network_policy`) or
    /// `allow:NAME,...` (those names, each also allowed by the server's policy).
    pub network: String,
    /// Paths runs may write.
    pub writable_paths: Vec<String>,
    /// Its limits (absent: the server's).
    pub limits: crate::ProfileLimits,
    /// Packages a call may install (absent: any).
    pub packages: Option<Vec<String>>,
    /// Modules the script's own code may import (absent: no import policy).
    pub allowed_imports: Option<Vec<String>>,
}

/// Reports as a service: what describing the engine needs to read (its settings, the
/// sandbox, uv and the interpreters, the proxies, the cache and its warming, the pool, the
/// sessions, the stores and their budgets), and nothing it could change.
pub(crate) struct Reports {
    pub(crate) config: Arc<EngineConfig>,
    pub(crate) sandbox: Result<Arc<snakebox_sandbox::Sandbox>, Unavailable>,
    pub(crate) planner: Arc<crate::plan::Planner>,
    pub(crate) proxies: Arc<crate::network::Proxies>,
    pub(crate) calls: Arc<crate::lifecycle::Calls>,
    pub(crate) cache: Result<Arc<snakebox_env::EnvCache>, Unavailable>,
    pub(crate) environments: Arc<crate::environments::Environments>,
    pub(crate) pool: Arc<crate::pool::WarmPool>,
    pub(crate) sessions: Arc<crate::session::Sessions>,
    pub(crate) artifacts: crate::artifacts::ArtifactStore,
    pub(crate) ledger: Arc<crate::budget::Ledger>,
    /// Why the store (the data directory's, or the database) could not be opened, if it
    /// could not.
    pub(crate) store_problem: Option<EngineError>,
    /// The secrets callers may ask for.
    pub(crate) secrets: Arc<crate::secrets::Secrets>,
}

impl Reports {
    /// Describe this host and configuration, for the operator: every tenant's sessions are
    /// listed (the `check` command, the server's own log, `/readyz`).
    pub(crate) fn report(&self) -> EnvironmentReport {
        self.report_listing(None)
    }

    /// [`Reports::report`] as `caller` may see it: the sessions listed are its own (the counts
    /// and the disk stay the server's). What `check_environment` answers.
    pub(crate) fn report_for(&self, caller: &Caller) -> EnvironmentReport {
        self.report_listing(Some(caller))
    }

    /// The report, with the sessions, stores, pool and profiles as `viewer` may see them
    /// (`None`: the operator, who sees every tenant's).
    fn report_listing(&self, viewer: Option<&Caller>) -> EnvironmentReport {
        let config = &self.config;
        let (isolation_active, sandbox_details, sandbox_hint, limits) = self.sandbox_report();
        let (uv, uv_hint) = match self.planner.uv() {
            Ok(uv) => (format!("{} ({})", uv.version, uv.path.display()), None),
            Err(missing) => (missing.message.clone(), missing.hint.clone()),
        };
        let problems = self.problems();
        EnvironmentReport {
            snakebox_version: env!("CARGO_PKG_VERSION").into(),
            platform: format!(
                "{}/{} (kernel {})",
                std::env::consts::OS,
                std::env::consts::ARCH,
                kernel_release()
            ),
            sandbox_backend: config.backend.name().into(),
            isolation_active,
            sandbox_details,
            sandbox_hint,
            network: config.network.allows_network(),
            network_policy: config.network.describe(),
            network_enforcement: self.proxies.network_enforcement(),
            network_caps: NetworkCapsReport {
                connections: config.network_proxy.caps.connections,
                bytes: config.network_proxy.caps.bytes,
                connection_seconds: config.network_proxy.caps.connection_time.as_secs(),
            },
            install_network: config.network_proxy.describe_installs(),
            secrets: self.secrets.report(viewer),
            uv,
            uv_hint,
            default_python: config
                .python_version
                .clone()
                .unwrap_or_else(|| "newest available CPython 3".into()),
            python_downloads: config.python_downloads,
            infer_dependencies: config.infer_dependencies,
            pythons: self
                .planner
                .interpreters()
                .all()
                .iter()
                .map(|i| InterpreterReport {
                    version: i.version.to_string(),
                    path: i.executable.display().to_string(),
                    source: i.source.clone(),
                })
                .collect(),
            limits,
            timeouts: format!(
                "default {} s, maximum {} s",
                config.default_timeout.as_secs(),
                config.max_timeout.as_secs()
            ),
            cache: self.cache_report(viewer),
            artifacts: ArtifactsReport {
                location: self.artifacts.root().display().to_string(),
                retention: self.artifacts.retention(),
                limits: crate::artifacts::limits_text(),
            },
            sessions: self.sessions.report(&config.data_dir, viewer),
            stores: self.stores_report(viewer),
            warm_pool: self.pool.report(viewer),
            default_profile: viewer
                .map_or(config.profiles.default.as_str(), |caller| {
                    config.profiles.default_for(caller)
                })
                .to_owned(),
            tenant: viewer.map(|caller| self.calls.tenant(caller)),
            profiles: self.profiles_report(viewer),
            ready: problems.is_empty(),
            problems,
        }
    }

    /// The sandbox as the report shows it: whether it isolates, its details, the fix when it
    /// is missing, and each limit with the value configured and how it is enforced.
    fn sandbox_report(&self) -> (bool, Vec<String>, Option<String>, Vec<LimitStatus>) {
        let config = &self.config;
        let (isolation_active, sandbox_details, sandbox_hint, backend_limits) = match &self.sandbox
        {
            Ok(sandbox) => {
                let report = sandbox.report();
                (report.isolation_active, report.details, None, report.limits)
            }
            Err(missing) => (
                false,
                vec![missing.message.clone()],
                missing.hint.clone(),
                Vec::new(),
            ),
        };
        let configured = |name: &str| -> String {
            let unlimited = || "unlimited".to_string();
            match name {
                "wall_time" => format!("{} s default", config.default_timeout.as_secs()),
                "cpu_time" => config
                    .cpu_time
                    .map_or_else(unlimited, |d| format!("{} s", d.as_secs())),
                "memory" => config.memory_bytes.map_or_else(unlimited, human_bytes),
                "max_processes" => config
                    .max_processes
                    .map_or_else(unlimited, |n| n.to_string()),
                "max_output_bytes" => human_bytes(config.max_output_bytes),
                "scratch_bytes" => config.scratch_bytes.map_or_else(unlimited, human_bytes),
                "file_size_bytes" => config.file_size_bytes.map_or_else(unlimited, human_bytes),
                "open_files" => config.open_files.map_or_else(unlimited, |n| n.to_string()),
                "cpu_bandwidth" => config
                    .cpu_millicores
                    .map_or_else(unlimited, |m| format!("{}.{:03} cores", m / 1000, m % 1000)),
                "cpu_weight" => "per tenant".into(),
                "network" => config.network.describe(),
                _ => String::new(),
            }
        };
        let limits = backend_limits
            .into_iter()
            .map(|limit| LimitStatus {
                value: configured(&limit.name),
                mechanism: match limit.name.as_str() {
                    // The engine's rule for the weights the backend writes (tenants.rs).
                    "cpu_weight" if limit.enforced => format!(
                        "{}; each tenant's busy sandboxes together weigh one sandbox, divided evenly between them (the server's own work: one sandbox)",
                        limit.mechanism
                    ),
                    _ => limit.mechanism,
                },
                name: limit.name,
                enforced: limit.enforced,
            })
            .collect();
        (isolation_active, sandbox_details, sandbox_hint, limits)
    }

    /// The environment cache as `viewer` may see it: where, how many, how large, how long
    /// kept, how installs run, warming and compilation.
    fn cache_report(&self, viewer: Option<&Caller>) -> CacheReport {
        let config = &self.config;
        let (environments, size_bytes, location) = match &self.cache {
            Ok(cache) => {
                let stats = cache.stats();
                (
                    stats.environments,
                    stats.bytes,
                    stats.root.display().to_string(),
                )
            }
            Err(_) => (0, 0, config.data_dir.display().to_string()),
        };
        let compilation = self
            .cache
            .as_ref()
            .map(|cache| {
                let stats = cache.compile_stats();
                CompilationReport {
                    deferred: cache.defers_compilation(),
                    pending: stats.pending,
                    completed: stats.completed,
                    failed: stats.failed,
                    // Its text may name another tenant's packages: a tenant of a server with
                    // several sees the counts only.
                    last_failure: stats
                        .last_failure
                        .filter(|_| viewer.is_none_or(|c| c.id() == crate::caller::LOCAL_TENANT)),
                }
            })
            .unwrap_or_default();
        let warm = self
            .environments
            .warm
            .lock()
            .map_or(WarmState::Pending, |state| state.clone());
        CacheReport {
            location,
            environments,
            size_bytes,
            retention: format!(
                "environments unused for {} days are removed, then the least recently used until the total is under {}; unpinned requirement sets are re-resolved after {} h",
                config.cache_max_age.as_secs() / 86_400,
                human_bytes(config.cache_max_bytes),
                config.unpinned_freshness.as_secs() / 3600
            ),
            installs: format!(
                "wheels are downloaded by uv without running package code, through the install proxy (the run proxy's checks with the install rules: {}); package code (bytecode compilation{}) runs sandboxed as a run: run limits, wall time {} s, no network, no credentials, uv's cache not mounted; a new environment is published only after its installed files match their RECORD (under a server: before its bytecode, which a checked copy gets after its first run, off the hot path; `compilation`), and its compiled files load; {}",
                config.network_proxy.describe_installs(),
                if config.allow_sdist_builds {
                    ", sdist builds"
                } else {
                    ""
                },
                config.install_timeout.as_secs(),
                if config.allow_sdist_builds {
                    "sdists are built offline from local UV_FIND_LINKS directories (--allow-sdist-builds)"
                } else {
                    "wheels only: sdists are not built (--allow-sdist-builds to allow)"
                }
            ),
            warm,
            compilation,
        }
    }

    /// What keeps this server from serving calls, each with its fix (none: ready).
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for missing in [
            self.sandbox.as_ref().err(),
            self.planner.uv().as_ref().err(),
            self.store_problem.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            let mut line = missing.message.clone();
            if let Some(hint) = &missing.hint {
                line.push_str(&format!(" (hint: {hint})"));
            }
            problems.push(line);
        }
        if let Ok(sandbox) = &self.sandbox
            && let Some((message, hint)) = sandbox.start_failure()
        {
            let mut line = message;
            if let Some(hint) = hint {
                line.push_str(&format!(" (hint: {hint})"));
            }
            problems.push(line);
        }
        if let Err(err) = self.planner.check_default_python() {
            let mut line = err.message;
            if let Some(hint) = &err.hint {
                line.push_str(&format!(" (hint: {hint})"));
            }
            problems.push(line);
        } else if self.planner.interpreters().all().is_empty() {
            problems.push(
                "No Python interpreter was found (hint: install one with pyenv, `uv python install`, or the system package manager)"
                    .into(),
            );
        }
        problems
    }

    /// Every profile as `viewer` sees it: its default and the ones it may name marked.
    fn profiles_report(&self, viewer: Option<&Caller>) -> Vec<ProfileReport> {
        let config = &self.config;
        config
            .profiles
            .all
            .values()
            .map(|profile| ProfileReport {
                name: profile.name.clone(),
                description: profile.description.clone(),
                default: profile.name
                    == viewer.map_or(config.profiles.default.as_str(), |caller| {
                        config.profiles.default_for(caller)
                    }),
                available: viewer.is_none_or(|caller| {
                    config
                        .profiles
                        .for_caller(caller, Some(&profile.name))
                        .is_ok()
                }),
                enforces: profile.enforcement(),
                subprocesses: profile.subprocesses,
                network: profile.network.describe(),
                writable_paths: if profile.writable_work {
                    vec!["/work".into(), "/tmp".into()]
                } else {
                    vec!["/tmp".into()]
                },
                limits: profile.limits.clone(),
                packages: profile.packages.clone(),
                allowed_imports: profile.allowed_imports.clone(),
            })
            .collect()
    }
}

impl Reports {
    /// The shared stores as `viewer` may see them: its own tenant's figures (none of
    /// another's); for the operator (`None`), the budgets alone.
    fn stores_report(&self, viewer: Option<&Caller>) -> crate::StoresReport {
        let (runs, audit, write_queue) = self.calls.history.report(viewer);
        crate::StoresReport {
            tenant: viewer.map(|caller| caller.id().to_owned()),
            runs,
            audit,
            artifacts: self.artifacts.report(viewer),
            artifacts_refused: viewer.map_or(0, |c| self.ledger.counts(c.id()).artifacts_refused),
            write_queue,
        }
    }
}

fn kernel_release() -> String {
    fs_err::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".into(), |s| s.trim().to_string())
}
