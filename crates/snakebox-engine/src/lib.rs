//! The engine: the one place that composes scripts, environments and sandboxes into executions.
//!
//! The server and the CLI are thin shells around [`Engine`]: they parse arguments, call
//! [`Engine::execute`], [`Engine::validate`] or [`Engine::report`], and shape the record they
//! get back. Everything that decides *how* a script runs (which interpreter, which cached
//! environment, which mounts and limits) is decided here, so both front ends behave the same.
//!
//! Fail closed: when the configured sandbox backend cannot isolate, the engine still starts (so
//! `check_environment` can say why) but refuses every execution with the reason and the fix.

pub mod api;
mod artifacts;
mod audit;
mod base64_bytes;
mod budget;
mod caller;
mod compile;
mod config;
mod environments;
mod error;
mod events;
mod files;
mod gauges;
mod history;
mod host_work;
mod ids;
mod infer;
pub mod keys;
mod learn;
mod lifecycle;
mod network;
mod oneshot;
mod plan;
mod policy;
mod pool;
mod profiles;
mod records;
mod report;
mod result;
mod run;
mod runner;
mod secrets;
mod session;
pub mod shared;
mod size;
pub mod store;
pub mod telemetry;
mod tenants;
/// See [`snakebox_fs::tree`].
use snakebox_fs::tree;
mod validate;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use snakebox_env::{CacheConfig, EnvCache, Interpreters, Uv};
use snakebox_sandbox::{Sandbox, SandboxConfig};

pub use api::{
    ArtifactDownload, ArtifactHead, EngineApi, EngineHandle, EngineHost, InstallPackages,
    ListFiles, OpenArtifact, OutputSink, ReadFile, RequestKind, RunCommand, ToolCallAudit,
    ValidateScript, WireExecution, WriteFile,
};
pub use artifacts::{
    ArtifactContent, ArtifactError, ArtifactFile, ArtifactPrune, ArtifactStore,
    URI_PREFIX as ARTIFACT_URI_PREFIX, URI_TEMPLATE as ARTIFACT_URI_TEMPLATE, encode_artifact_path,
    image_mime, is_text_mime,
};
pub use audit::{
    AUDIT_DIR, AuditEntry, MAX_LINE_BYTES, audit_files, cap_text, read_audit, read_audit_table,
    utc_text,
};
pub use budget::{
    Budget, DEFAULT_ARTIFACT_BYTES, DEFAULT_AUDIT_BYTES, DEFAULT_AUDIT_QUEUE_BYTES,
    DEFAULT_HISTORY_BYTES, DEFAULT_HISTORY_ROWS, MIN_AUDIT_BYTES, MIN_AUDIT_QUEUE_BYTES,
    StoreBudgets, StoreReport, StoresReport, WriteQueueReport,
};
pub use caller::{Caller, LOCAL_TENANT, is_plain_name};
pub use config::{
    CompatToolSet, DEFAULT_PREFORK, DEFAULT_PRELOAD_PACKAGES, EngineConfig, MAX_PRELOAD_PACKAGES,
    MIN_SESSIONS_DISK_SHARE, PythonDownloads, SessionSettings, TENANTS_PER_SESSIONS_DISK,
};
pub use environments::{WarmPhase, WarmReport, WarmState};
pub use error::{EngineError, ErrorKind, Hint};
pub use events::{EventKind, SecurityEvent};
pub use files::{FileEncoding, InputFile, MAX_INPUT_BYTES, MAX_INPUT_FILES};
pub use history::{RunKind, RunQuery, RunRecord};
pub use host_work::off_the_runtime;
pub use learn::is_module_name;
pub use lifecycle::{LIVE_MAX_BYTES, LiveOutput, ShutdownReport, StopReason};
pub use network::{NetworkLogEntry, NetworkPolicy, ProxySettings, parse_install_hosts};
pub use plan::ExecuteRequest;
pub use pool::{ForkServerReport, PoolReport};
pub use profiles::{
    Profile, ProfileLimits, ProfileNetwork, Profiles, STANDARD_PROFILE, builtin_profiles,
    normalize_package,
};
pub use report::{
    ArtifactsReport, CacheReport, CompilationReport, EnvironmentReport, InterpreterReport,
    LimitStatus, NetworkCapsReport, ProfileReport,
};
pub use result::{
    Artifact, ArtifactOrigin, ErrorInfo, ExceptionInfo, ExecutionResult, InlineImage, Package,
    ResourceUse, SkippedFile, Status, ValueRepr,
};
pub use secrets::{SecretReport, SecretSpec, SecretsConfig, is_secret_name};
pub use session::{
    CreateSession, FileContent, FileEntry, FileList, FileWritten, InstallState, InstallStatus,
    MAX_FILE_BYTES, PackageList, SessionInfo, SessionList, SessionSummary, SessionsReport,
};
pub use shared::{DatabaseUrl, PgError, SharedStore, SharedStoreError};
pub use size::{MIN_MEMORY_BYTES, SIZE_HINT, SizeError, parse_memory_limit, parse_size};
pub use snakebox_fs::PathError;
pub use snakebox_sandbox::SecretValue;
/// What the faces see of the sandbox layer: a run's output as it streams, which stream it came
/// on, and which kind of backend isolates runs (the faces name no sandbox crate).
pub use snakebox_sandbox::{BackendKind, OutputChunk, Stream};
pub use tenants::{Tenant, TenantOverride, TenantQuotas};
pub use validate::{
    ImportFound, ImportOrigin, ScriptAnalysis, Validation, ValidationProblem, import_allowed,
};

/// Why something the engine needs is not available (kind `unavailable`), kept to be reported
/// per call.
type Unavailable = EngineError;

/// Runs Python for callers. Cheap to share behind an `Arc`.
///
/// A façade: the work is done by the engine's services, each holding only what it needs of
/// the rest (an `Arc` of the parts and services it uses), and this keeps short public
/// methods that hand each call to its service.
pub struct Engine {
    config: Arc<EngineConfig>,
    sandbox: Result<Arc<Sandbox>, Unavailable>,
    /// Where the keys, the runs table and the audit log are (`None`: it could not be opened;
    /// the report's `store_problem` says why).
    shared: Option<shared::SharedStore>,
    /// The sessions' state (their manager), for shutdown.
    sessions: Arc<session::Sessions>,
    /// Admission of every call: the stop signal, the calls in flight, the tenants' quotas,
    /// the sandbox slots and host-work threads, the runs table.
    calls: Arc<lifecycle::Calls>,
    /// The checks of a request and the choice (and download) of its interpreter.
    planner: Arc<plan::Planner>,
    /// The artifacts and the runs table, read for callers.
    records: records::Records,
    /// The environment cache: builds in a call's or the server's name, warming, pruning.
    environments: Arc<environments::Environments>,
    /// Fills the warm pool and starts fork servers.
    keeper: Arc<pool::Keeper>,
    /// New environments to byte-compile after their first run ([`compile`]).
    compiler: Arc<compile::Compiler>,
    /// Checks scripts without running them.
    validator: Arc<validate::Validator>,
    /// Runs one script in a fresh sandbox.
    oneshot: oneshot::OneShot,
    /// Sessions: their creation, cells, commands, installs and files.
    session: session::SessionService,
    /// Describes the engine (`check_environment`, `/readyz`, the gauges).
    reports: report::Reports,
}

/// How the environment cache runs package code (compilation, builds): with the server's
/// limits for `install_timeout` per step (what `CallKind::Build` decides; the cache is
/// shared by every profile and tenant, so none of theirs applies).
fn build_settings(config: &EngineConfig) -> snakebox_env::BuildSettings {
    snakebox_env::BuildSettings {
        limits: policy::server_limits(config, config.install_timeout),
        allow_sdist_builds: config.allow_sdist_builds,
    }
}

impl Engine {
    /// Probe the host (sandbox backend, uv, interpreters) and open the environment cache.
    ///
    /// Never fails: what is missing is recorded and reported by [`Engine::report`] and by
    /// every execution that needs it.
    pub async fn new(config: EngineConfig) -> Engine {
        let sandbox = Sandbox::new(SandboxConfig {
            backend: config.backend,
            bwrap_path: config.bwrap_path.clone(),
            scratch_root: config.data_dir.join("scratch"),
            docker_runtime: config.docker_runtime.clone(),
        })
        .map_err(|err| unavailable(&err));
        Engine::assemble(config, sandbox).await
    }

    /// An engine on a sandbox made elsewhere: any [`snakebox_sandbox::Backend`] (tests hand
    /// in a recording one). Otherwise as [`Engine::new`].
    pub async fn with_sandbox(config: EngineConfig, sandbox: Sandbox) -> Engine {
        Engine::assemble(config, Ok(sandbox)).await
    }

    async fn assemble(mut config: EngineConfig, sandbox: Result<Sandbox, Unavailable>) -> Engine {
        // `[tenants.NAME] profiles` and `default_profile` grant what the profiles' own
        // `tenants` lists grant: one set of profiles decides for both.
        for (tenant, over) in &config.tenant_overrides {
            config
                .profiles
                .grant(tenant, &over.profiles, over.default_profile.as_deref());
        }
        let staging = sandbox.as_ref().map_or(
            &snakebox_sandbox::HostDirStaging as &dyn snakebox_sandbox::Staging,
            Sandbox::staging,
        );
        run::remove_stale_run_dirs(&config.data_dir, staging);
        let sandbox = sandbox.map(Arc::new);
        let uv = Uv::locate(config.uv_path.as_deref()).map_err(|err| unavailable(&err));
        let interpreters = match &uv {
            Ok(uv) => Interpreters::discover(uv).await,
            Err(_) => Interpreters::discover_without_uv().await,
        };
        let cache = match (&uv, &sandbox) {
            (Ok(uv), Ok(sandbox)) => EnvCache::with_uv_environment(
                CacheConfig {
                    root: config.data_dir.clone(),
                    max_bytes: config.cache_max_bytes,
                    max_age: config.cache_max_age,
                    unpinned_freshness: config.unpinned_freshness,
                },
                uv.clone(),
                Arc::clone(sandbox),
                // Installs go through the run proxy's machinery with the install rules: the
                // configured indexes, `install_hosts`, the runs' resolver and exceptions.
                match &config.index_url {
                    Some(url) => {
                        snakebox_env::UvEnvironment::from_process().with_default_index(url)
                    }
                    None => snakebox_env::UvEnvironment::from_process(),
                }
                .with_install_network(config.network_proxy.install_network()),
            )
            .map(|cache| {
                cache
                    .with_install_timeout(config.install_timeout)
                    .with_build_settings(build_settings(&config))
            })
            .map_err(|err| unavailable(&err)),
            (Err(missing), _) | (_, Err(missing)) => Err(missing.clone()),
        };
        // The store first: its first opening imports the files of earlier versions (the
        // sessions open it again, once the sessions kept in an old image are taken out).
        let opened = store::Database::open(&config.data_dir).map_err(|err| {
            let err = EngineError::from(err);
            tracing::warn!(err = %err.message, hint = ?err.hint, "the store is not available");
            err
        });
        let (sqlite, mut store_problem) = match opened {
            Ok(store) => (Some(store), None),
            Err(err) => (None, Some(err)),
        };
        // The shared rows (keys, runs, audit): the data directory's store, or the
        // deployment's PostgreSQL (connected off the runtime's threads).
        let store = match config.database.clone() {
            None => sqlite.map(shared::SharedStore::Sqlite),
            Some(url) => {
                let opened = tokio::task::spawn_blocking(move || shared::PgStore::open(&url)).await;
                match opened {
                    Ok(Ok(store)) => Some(shared::SharedStore::Postgres(store)),
                    Ok(Err(err)) => {
                        let err = EngineError::new(ErrorKind::Unavailable, error::describe(&err))
                            .with_hint(err.hint());
                        tracing::warn!(err = %err.message, hint = ?err.hint, "the database is not available");
                        store_problem = Some(err);
                        None
                    }
                    Err(join) => {
                        store_problem = Some(EngineError::new(
                            ErrorKind::Internal,
                            format!("Failed to connect to the database: {join}"),
                        ));
                        None
                    }
                }
            }
        };
        let ledger = Arc::new(budget::Ledger::default());
        // The one place every tenant's bounds come from: each store and queue below asks it
        // for its own.
        let book = tenants::TenantBook::new(
            config.tenants.clone(),
            config.store_budgets.clone(),
            config.sessions.tenant_max_disk_bytes,
            config.tenant_overrides.clone(),
            config.profiles.clone(),
        );
        let artifacts = artifacts::ArtifactStore::new(
            &config.data_dir,
            config.artifact_max_age,
            config.artifact_max_bytes,
        )
        .with_tenant_budget(book.artifact_bytes(), Arc::clone(&ledger));
        let lifecycle = lifecycle::Lifecycle::default();
        let sessions = Arc::new(session::Sessions::open(
            &config.data_dir,
            config.sessions.clone(),
            book.sessions_disk(),
            config.bwrap_path.as_deref(),
            lifecycle.stop_token(),
        ));
        let history = Arc::new(history::History::open(
            &config.data_dir,
            store.as_ref(),
            history::HistoryLimits {
                runs: book.history(),
                audit_bytes: book.audit_bytes(),
                queue_bytes: config.store_budgets.audit_queue_bytes,
            },
            Arc::clone(&ledger),
        ));
        let calls = Arc::new(lifecycle::Calls::new(
            lifecycle,
            Arc::clone(&history),
            tenants::Tenants::new(book.clone()),
            tenants::FairSlots::for_sandboxes(
                config.max_concurrent_runs,
                book.max_concurrent_runs(),
            ),
            host_work::HostWork::new(
                host_work::HostWork::default_threads(),
                config.tenants.max_concurrent_runs.is_some()
                    || config
                        .tenant_overrides
                        .values()
                        .any(|o| o.max_concurrent_runs.is_some()),
                sandbox.as_ref().ok().and_then(|s| s.host_work_group()),
            ),
        ));
        let config = Arc::new(config);
        let planner = Arc::new(plan::Planner::new(Arc::clone(&config), uv, interpreters));
        let proxies = Arc::new(network::Proxies::new(
            config.network.clone(),
            config.network_proxy.clone(),
            sandbox.clone(),
        ));
        let sandboxes = Arc::new(run::Sandboxes::new(
            Arc::clone(&config),
            sandbox.clone(),
            Arc::clone(&proxies),
        ));
        let records = records::Records::new(artifacts.clone(), history, Arc::clone(&calls.host));
        let cache = cache.map(Arc::new);
        let pool = Arc::new(pool::WarmPool::new(
            config.warm_pool,
            config.fork_server,
            config.prefork,
        ));
        let environments = Arc::new(environments::Environments::new(
            Arc::clone(&config),
            cache.clone(),
            Arc::clone(&planner),
            Arc::clone(&calls),
        ));
        let keeper = Arc::new(pool::Keeper::new(
            Arc::clone(&config),
            sandbox.clone(),
            Arc::clone(&pool),
            Arc::clone(&sandboxes),
            Arc::clone(&proxies),
            Arc::clone(&environments),
        ));
        let compiler = Arc::new(compile::Compiler::new(
            cache.clone(),
            Arc::clone(&calls),
            Arc::clone(&keeper),
        ));
        let validator = Arc::new(validate::Validator::new(
            Arc::clone(&config),
            sandbox.clone(),
            Arc::clone(&calls),
            Arc::clone(&planner),
        ));
        let secrets = Arc::new(secrets::Secrets::new(
            config.secrets.clone(),
            config.data_dir.clone(),
        ));
        let oneshot = oneshot::OneShot {
            config: Arc::clone(&config),
            sandbox: sandbox.clone(),
            calls: Arc::clone(&calls),
            planner: Arc::clone(&planner),
            proxies: Arc::clone(&proxies),
            sandboxes: Arc::clone(&sandboxes),
            pool: Arc::clone(&pool),
            environments: Arc::clone(&environments),
            compiler: Arc::clone(&compiler),
            validator: Arc::clone(&validator),
            artifacts: artifacts.clone(),
            secrets: Arc::clone(&secrets),
        };
        let session = session::SessionService {
            config: Arc::clone(&config),
            sandbox: sandbox.clone(),
            calls: Arc::clone(&calls),
            planner: Arc::clone(&planner),
            proxies: Arc::clone(&proxies),
            sandboxes: Arc::clone(&sandboxes),
            sessions: Arc::clone(&sessions),
            artifacts: artifacts.clone(),
            cache: cache.clone(),
        };
        let reports = report::Reports {
            config: Arc::clone(&config),
            sandbox: sandbox.clone(),
            planner: Arc::clone(&planner),
            proxies,
            calls: Arc::clone(&calls),
            cache,
            environments: Arc::clone(&environments),
            pool,
            sessions: Arc::clone(&sessions),
            artifacts,
            ledger,
            store_problem,
            secrets,
        };
        Engine {
            config,
            sandbox,
            shared: store,
            sessions,
            calls,
            planner,
            records,
            environments,
            keeper,
            compiler,
            validator,
            oneshot,
            session,
            reports,
        }
    }

    /// Where the keys, the runs table and the audit log are (`None`: the store could not be
    /// opened; the report's problems say why).
    #[must_use]
    pub fn shared_store(&self) -> Option<&shared::SharedStore> {
        self.shared.as_ref()
    }

    /// Why the store (the data directory's, or the database) could not be opened, if it
    /// could not.
    #[must_use]
    pub fn store_problem(&self) -> Option<&EngineError> {
        self.reports.store_problem.as_ref()
    }

    /// The settings this engine runs with.
    #[must_use]
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Before the process exits: unmount the tenants' shares of the sessions' disk unless
    /// another server of this data directory still runs (the files stay in their images).
    pub fn release_sessions(&self) {
        self.sessions.release();
    }

    /// Run one script: in a fresh sandbox, or in the session its request names. Always
    /// returns a record: failures before the script runs are reported with status
    /// `invalid_request` or `setup_failed` and a hint; a call made while the server stops is
    /// refused (`setup_failed`), one cut short by the stop is `cancelled` and says so.
    pub async fn execute(
        &self,
        caller: &Caller,
        request: ExecuteRequest,
        cancel: tokio_util::sync::CancellationToken,
        output: Option<tokio::sync::mpsc::UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        if let Some(session_id) = request.session_id.clone() {
            return self
                .execute_in_session(caller, &session_id, request, cancel, output)
                .await;
        }
        self.oneshot.execute(caller, request, cancel, output).await
    }

    /// Run code in a session's live interpreter (started first when there is none).
    /// Refused while the server stops; cut short by the stop, it is `cancelled` and says so.
    pub async fn execute_in_session(
        &self,
        caller: &Caller,
        session_id: &str,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        self.session
            .execute_in_session(caller, session_id, request, cancel, output)
            .await
    }

    /// Run a shell command in a sandbox over the session's workspace and environment (a
    /// separate short-lived sandbox with the same view and limits as the interpreter's).
    /// Refused while the server stops; cut short by the stop, it is `cancelled` and says so.
    pub async fn run_command(
        &self,
        caller: &Caller,
        session_id: &str,
        command: &str,
        timeout_seconds: Option<f64>,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        self.session
            .run_command(caller, session_id, command, timeout_seconds, cancel, output)
            .await
    }

    /// Create a session: a workspace, a venv with `dependencies`, and (on first use) a live
    /// interpreter.
    ///
    /// # Errors
    /// Invalid arguments, caps reached, no interpreter, a failed install.
    pub async fn create_session(
        &self,
        caller: &Caller,
        request: CreateSession,
    ) -> Result<SessionInfo, EngineError> {
        self.session.create_session(caller, request).await
    }

    /// Every session.
    ///
    /// # Errors
    /// When sessions are unavailable.
    pub async fn list_sessions(&self, caller: &Caller) -> Result<SessionList, EngineError> {
        self.session.list_sessions(caller).await
    }

    /// Delete a session: its interpreter (a running call ends now), files and packages.
    ///
    /// # Errors
    /// No such session.
    pub async fn delete_session(&self, caller: &Caller, id: &str) -> Result<(), EngineError> {
        self.session.delete_session(caller, id).await
    }

    /// Reset a session to the state it was created in: a new interpreter, an empty workspace,
    /// only the packages given at creation. The id stays.
    ///
    /// # Errors
    /// No such session, a failed install.
    pub async fn reset_session(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<SessionInfo, EngineError> {
        self.session.reset_session(caller, id).await
    }

    /// Install packages into a session. Waits up to `wait` (default: until done) and returns
    /// the install's state; an install still running then goes on, and `list_packages` reports
    /// it. uv's output goes to `progress` while it runs.
    ///
    /// # Errors
    /// No such session, invalid requirements, an install already running, disk full.
    pub async fn install_packages(
        &self,
        caller: &Caller,
        session_id: &str,
        packages: Vec<String>,
        wait: Option<Duration>,
        progress: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<InstallStatus, EngineError> {
        self.session
            .install_packages(caller, session_id, packages, wait, progress)
            .await
    }

    /// Installed packages and the state of the last install.
    ///
    /// # Errors
    /// No such session.
    pub async fn list_packages(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<PackageList, EngineError> {
        self.session.list_packages(caller, session_id).await
    }

    /// Write a file into a session's workspace (parents created).
    ///
    /// # Errors
    /// No such session, a path outside the workspace, too large, disk full.
    pub async fn write_file(
        &self,
        caller: &Caller,
        session_id: &str,
        path: &str,
        content: &str,
        encoding: Option<&str>,
    ) -> Result<FileWritten, EngineError> {
        self.session
            .write_file(caller, session_id, path, content, encoding)
            .await
    }

    /// Read a file from a session's workspace.
    ///
    /// # Errors
    /// No such session or file, a path outside the workspace, a symlink, too large.
    pub async fn read_file(
        &self,
        caller: &Caller,
        session_id: &str,
        path: &str,
    ) -> Result<FileContent, EngineError> {
        self.session.read_file(caller, session_id, path).await
    }

    /// List a directory of a session's workspace.
    ///
    /// # Errors
    /// No such session or directory, a path outside the workspace.
    pub async fn list_files(
        &self,
        caller: &Caller,
        session_id: &str,
        path: &str,
        depth: usize,
    ) -> Result<FileList, EngineError> {
        self.session
            .list_files(caller, session_id, path, depth)
            .await
    }

    /// Describe this host and configuration, for the operator: every tenant's sessions are
    /// listed (the `check` command, the server's own log, `/readyz`).
    pub fn report(&self) -> EnvironmentReport {
        self.reports.report()
    }

    /// [`Engine::report`] as `caller` may see it: the sessions listed are its own (the counts
    /// and the disk stay the server's). What `check_environment` answers.
    pub fn report_for(&self, caller: &Caller) -> EnvironmentReport {
        self.reports.report_for(caller)
    }

    /// Refresh the gauges of the engine's state from a snapshot: calls in flight, sandbox
    /// slots, sessions, the warm pool and fork servers, the environment cache. A face calls
    /// it before it exports (the cache's size is read from its manifests on disk, so call it
    /// off the async threads).
    pub fn publish_gauges(&self) {
        self.reports.publish_gauges();
    }

    /// Check a script without running it: metadata, requirements, `requires-python` against
    /// the interpreters here, Python syntax for the target version, and what it imports
    /// (against `allowed_imports`, when given: each import outside it is a problem with its
    /// line).
    ///
    /// # Errors
    /// The call's policy refuses it (a profile the caller may not name, imports it would
    /// widen).
    pub async fn validate(
        &self,
        caller: &Caller,
        script: &str,
        dependencies: &[String],
        python_version: Option<&str>,
        profile: Option<&str>,
        allowed_imports: Option<&[String]>,
    ) -> Result<Validation, EngineError> {
        self.validator
            .validate(
                caller,
                script,
                dependencies,
                python_version,
                profile,
                allowed_imports,
            )
            .await
    }

    /// Build the default environment so the first call does not pay for it (cache warming).
    /// Observable through [`Engine::report`] (`warm`). Does nothing when warming is disabled.
    pub async fn warm(&self) {
        self.environments.warm().await;
    }

    /// Remove environments past the cache's retention rule (age, then size).
    ///
    /// # Errors
    /// The cache is not available.
    pub async fn prune(&self) -> Result<snakebox_env::PruneReport, EngineError> {
        self.environments.prune().await
    }

    /// Keep the warm pool filled until [`Engine::stop_warm_pool`]: first the default
    /// environment (built here if cache warming did not), then recently used ones. Returns at
    /// once when the pool is off (`--warm-pool 0`) or the sandbox is unavailable. Meant to be
    /// spawned by a long-running server; one-shot commands do not start it. Fork servers start
    /// only after [`Engine::prepare_fork_server`], which the server calls before it takes
    /// requests.
    pub async fn run_warm_pool(self: Arc<Self>) {
        Arc::clone(&self.keeper).run_warm_pool().await;
    }

    /// Stop refilling and discard every ready sandbox (their trees are killed, their run
    /// directories removed).
    pub async fn stop_warm_pool(&self) {
        self.keeper.stop_warm_pool().await;
    }

    /// Get the run directories ready for a fork server (see
    /// [`snakebox_sandbox::Sandbox::prepare_runs_root`]), before any run starts: `serve`
    /// calls it before it takes requests. Turns the fork server off when that fails.
    pub fn prepare_fork_server(&self) {
        self.keeper.prepare_fork_server();
    }

    /// Open the engine and start what a long-running server keeps going: cache warming and
    /// periodic pruning, the fork servers' run directories, the warm pool. The sessions'
    /// reaper starts with the engine (every command has one) and ends when it begins to stop.
    /// Stop it all with [`Engine::shutdown`].
    pub async fn start(config: EngineConfig) -> Arc<Engine> {
        let engine = Arc::new(Engine::new(config).await);
        let background = Arc::clone(&engine);
        let maintenance = tokio::spawn(async move {
            background.warm().await;
            loop {
                match background.prune().await {
                    Ok(pruned) => tracing::debug!(?pruned, "environment cache pruned"),
                    Err(err) => tracing::debug!(message = %err.message, "cache pruning skipped"),
                }
                let pruned = background.prune_artifacts().await;
                tracing::debug!(?pruned, "artifact store pruned");
                tokio::time::sleep(lifecycle::PRUNE_EVERY).await;
            }
        });
        // Before any request: runs started from here on are visible to the fork server.
        engine.prepare_fork_server();
        let pool = tokio::spawn(Arc::clone(&engine).run_warm_pool());
        let compiles = engine.compiler.start_compiles();
        engine
            .calls
            .lifecycle
            .keep_background([maintenance, pool].into_iter().chain(compiles));
        engine
    }

    /// Stop the server's work and release everything it holds on the host: steps 1 to 3 (see
    /// the module docs). Calls in flight get `drain` to return their records; every step that
    /// waits is bounded, then forced. Safe to call more than once.
    pub async fn shutdown(&self, reason: StopReason, drain: std::time::Duration) -> ShutdownReport {
        let started = std::time::Instant::now();
        let mut report = ShutdownReport::default();
        self.begin_shutdown(reason);
        report.calls_cut_short = self.wait_idle(drain).await;
        for task in self.calls.lifecycle.take_background() {
            task.abort();
        }
        if tokio::time::timeout(lifecycle::STEP_DEADLINE, self.stop_warm_pool())
            .await
            .is_err()
        {
            report.forced = true;
        }
        if tokio::time::timeout(lifecycle::STEP_DEADLINE, self.sessions.stop_interpreters())
            .await
            .is_err()
        {
            report.forced = true;
        }
        self.release_host();
        report.duration_ms = crate::ids::millis(started.elapsed());
        tracing::info!(?report, "stopped");
        report
    }

    /// Release what this server holds on the host without waiting for anything: the
    /// sessions' disk image, its cgroups (members SIGKILLed), its run directories (scratch
    /// and runs-root mounts detached). The last step of [`Engine::shutdown`], and what a
    /// face calls when a shutdown overran its deadline. Best effort, bounded.
    pub fn release_host(&self) {
        self.begin_shutdown(StopReason::Requested);
        if let Ok(sandbox) = &self.sandbox {
            sandbox.remove_own_cgroups();
        }
        crate::run::remove_own_run_dirs(&self.config.data_dir, self.sandbox.as_deref().ok());
        // Last: interpreters killed above no longer hold the image's files.
        self.release_sessions();
        // What the runs table has queued is written before the process exits.
        self.calls.history.close();
    }

    /// The tenant `caller` is for: what it may take of the server and keep in the stores,
    /// and which profiles it may name (the `[tenants]` defaults and its `[tenants.NAME]`).
    #[must_use]
    pub fn tenant(&self, caller: &Caller) -> Tenant {
        self.calls.tenant(caller)
    }

    /// What one of `caller`'s calls has printed so far, while it runs (`None` once it has
    /// ended, and for another caller's call, as for an id that never existed).
    #[must_use]
    pub fn live_output(&self, caller: &Caller, id: &str) -> Option<LiveOutput> {
        self.calls.live_output(caller, id)
    }

    /// Step 1 of stopping: refuse new calls and cancel those in flight (each is answered with
    /// status `cancelled`). Idempotent; the first reason is kept.
    pub fn begin_shutdown(&self, reason: StopReason) {
        self.calls.begin_shutdown(reason);
    }

    /// Record a call of a tool that runs no code in the audit log (runs are recorded by
    /// [`Engine::execute`] and the session calls themselves): when, tenant, tool, status.
    pub fn audit_tool_call(&self, caller: &Caller, tool: &str, status: &str) {
        self.calls.audit_tool_call(caller, tool, status);
    }

    /// Record a call of any tool refused before it ran (an unknown tool, arguments that do
    /// not fit): the tool's name (cut at 200 bytes) and, of `request` (what was sent, as
    /// JSON), only its size and SHA-256.
    pub fn audit_refused_call(&self, caller: &Caller, tool: &str, request: &str) {
        self.calls.audit_refused_call(caller, tool, request);
    }

    /// Whether [`Engine::begin_shutdown`] was called.
    #[must_use]
    pub fn is_stopping(&self) -> bool {
        self.calls.is_stopping()
    }

    /// Step 2: wait until no call is in flight, at most `deadline`. Returns how many calls
    /// were still running when it gave up.
    pub async fn wait_idle(&self, deadline: std::time::Duration) -> usize {
        self.calls.wait_idle(deadline).await
    }

    /// Cancel one of `caller`'s calls that is running now, by its execution id (a one-shot
    /// run, a session cell or a command): its sandbox is stopped and its call answers
    /// `cancelled`, as when its client cancels it.
    ///
    /// # Errors
    /// `not_found` for an id that is not one of `caller`'s running calls (another caller's
    /// included, answered exactly as an id that never existed, or one that has ended).
    pub fn cancel_run(&self, caller: &Caller, id: &str) -> Result<(), EngineError> {
        self.calls.cancel_run(caller, id)
    }

    /// At start, with `python_downloads = "automatic"`: download the server's default Python
    /// (`--python-version`) when no interpreter here has it, before
    /// [`Engine::check_default_python`] judges it.
    ///
    /// # Errors
    /// The download failed.
    pub async fn provide_default_python(&self) -> Result<(), EngineError> {
        self.planner.provide_default_python().await
    }

    /// Whether the server's default Python (`--python-version`, `[python] version`) names an
    /// interpreter that is here: a settings mistake (`3.99`, `banana`) would otherwise fail
    /// every call that does not name its own version.
    ///
    /// # Errors
    /// The request does not parse, or no usable interpreter matches it.
    pub fn check_default_python(&self) -> Result<(), EngineError> {
        self.planner.check_default_python()
    }

    /// The content of one of `caller`'s artifacts (`snakebox://artifacts/<execution_id>/<path>`).
    ///
    /// # Errors
    /// An invalid URI (absolute or `..` paths included), an unknown or expired artifact, or
    /// another caller's (not found, as if it did not exist).
    pub async fn read_artifact(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<ArtifactContent, EngineError> {
        self.records.read_artifact(caller, uri).await
    }

    /// One of `caller`'s artifacts opened for a download: `path` of `execution_id` (as an
    /// artifact URI names it, decoded).
    ///
    /// # Errors
    /// As [`Engine::read_artifact`].
    pub async fn open_artifact(
        &self,
        caller: &Caller,
        execution_id: &str,
        path: &str,
    ) -> Result<ArtifactFile, EngineError> {
        self.records.open_artifact(caller, execution_id, path).await
    }

    /// `caller`'s artifacts of the most recent runs, newest first.
    pub async fn list_artifacts(&self, caller: &Caller, limit: usize) -> Vec<Artifact> {
        self.records.list_artifacts(caller, limit).await
    }

    /// `caller`'s runs (one-shot runs, session cells and commands) that `query` selects,
    /// newest first; a run still going has status `running`.
    pub async fn list_runs(&self, caller: &Caller, query: RunQuery) -> Vec<RunRecord> {
        self.records.list_runs(caller, query).await
    }

    /// One of `caller`'s runs by execution id.
    ///
    /// # Errors
    /// `not_found` for an id that is not one of `caller`'s runs (another caller's included,
    /// answered exactly as an id that never existed) or that has been forgotten.
    pub async fn run_record(&self, caller: &Caller, id: &str) -> Result<RunRecord, EngineError> {
        self.records.run_record(caller, id).await
    }

    /// The result one of `caller`'s finished runs returned (stdout, stderr, result value,
    /// exception, artifacts, network log), as the JSON the tool answered with; `None` while it
    /// runs, for another caller's run (as for an unknown id), for runs recorded before results
    /// were kept, and for a result too large to keep.
    pub async fn run_output(&self, caller: &Caller, id: &str) -> Option<serde_json::Value> {
        self.records.run_output(caller, id).await
    }

    /// The artifact store (location and retention rule).
    #[must_use]
    pub fn artifact_store(&self) -> &ArtifactStore {
        self.records.artifact_store()
    }

    /// Remove artifacts past the store's retention rule (age, then size quota).
    pub async fn prune_artifacts(&self) -> ArtifactPrune {
        self.records.prune_artifacts().await
    }
}

/// A part the engine needs that failed to start (the sandbox, uv, the cache): `unavailable`,
/// whatever the part said, since no call can use it until the operator fixes it.
fn unavailable<E: Hint>(err: &E) -> EngineError {
    EngineError {
        kind: ErrorKind::Unavailable,
        message: describe(err),
        hint: err.hint(),
    }
}

pub(crate) use error::describe;
