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
mod error;
mod events;
mod files;
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

use std::sync::{Arc, Mutex};

use snakebox_env::{CacheConfig, EnvCache, Interpreters, Uv};
use snakebox_sandbox::{Sandbox, SandboxConfig};

pub use api::{
    ArtifactDownload, ArtifactHead, EngineApi, EngineHandle, EngineHost, InstallPackages,
    ListFiles, OpenArtifact, OutputSink, ReadFile, RunCommand, ToolCallAudit, ValidateScript,
    WireExecution, WriteFile,
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
    LimitStatus, NetworkCapsReport, ProfileReport, WarmPhase, WarmReport, WarmState,
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
pub struct Engine {
    config: EngineConfig,
    sandbox: Result<Arc<Sandbox>, Unavailable>,
    uv: Result<Uv, Unavailable>,
    /// Why the store (in the data directory) could not be opened, if it could not: the data
    /// directory is missing and cannot be made, or is not writable (a problem `check`
    /// reports; the server is not ready).
    store_problem: Option<Unavailable>,
    /// Where the keys, the runs table and the audit log are (`None`: it could not be opened;
    /// `store_problem` says why).
    shared: Option<shared::SharedStore>,
    /// The interpreters found on this host; replaced when one is downloaded
    /// ([`Engine::provide_python`]). Read through [`Engine::interpreters`].
    interpreters: std::sync::RwLock<Arc<Interpreters>>,
    /// One `uv python install` at a time.
    python_installs: tokio::sync::Mutex<()>,
    cache: Result<EnvCache, Unavailable>,
    /// `--max-concurrent-runs`: every sandbox that does work holds one while it runs (a run,
    /// a session call or command, an install or environment build, a validation compile), in
    /// the name of the tenant it works for, shared fairly between tenants
    /// ([`tenants::FairSlots`]). Taken around one sandbox at a time, never while holding
    /// another, so none can wait on itself.
    runs: Arc<tenants::FairSlots>,
    /// The server's own work on the host for a tenant's call (file tools, reads of the runs
    /// table and artifacts), on a bounded number of threads shared fairly between tenants.
    host: host_work::HostWork,
    warm: Mutex<WarmState>,
    sessions: session::Sessions,
    artifacts: artifacts::ArtifactStore,
    pool: pool::WarmPool,
    lifecycle: lifecycle::Lifecycle,
    /// The runs table: every tracked call, recorded when admitted and when it returns.
    history: Arc<history::History>,
    /// What the shared stores removed by each tenant's budget, and the writer's queue
    /// dropped ([`budget`]).
    ledger: Arc<budget::Ledger>,
    /// What each tenant holds of the server, against its quotas.
    tenants: tenants::Tenants,
    /// The run proxy's resolver, made on first use.
    resolver: network::ResolverCell,
    /// The proxy's TLS for secrets' hosts (the server's CA), made on first use.
    secrets: secrets::SecretsCell,
    /// The tracked calls running now, by execution id: their owner and the token that
    /// cancels them ([`Engine::cancel_run`]).
    running: lifecycle::RunningCalls,
    /// New environments to byte-compile after their first run ([`compile`]).
    compiles: compile::CompileQueue,
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
        let warm = if config.warm_cache {
            WarmState::Pending
        } else {
            WarmState::Disabled
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
        let sessions = session::Sessions::open(
            &config.data_dir,
            config.sessions.clone(),
            book.sessions_disk(),
            config.bwrap_path.as_deref(),
            lifecycle.stop_token(),
        );
        Engine {
            history: Arc::new(history::History::open(
                &config.data_dir,
                store.as_ref(),
                history::HistoryLimits {
                    runs: book.history(),
                    audit_bytes: book.audit_bytes(),
                    queue_bytes: config.store_budgets.audit_queue_bytes,
                },
                Arc::clone(&ledger),
            )),
            ledger,
            tenants: tenants::Tenants::new(book.clone()),
            resolver: network::ResolverCell::default(),
            secrets: secrets::SecretsCell::default(),
            running: lifecycle::RunningCalls::default(),
            compiles: compile::CompileQueue::default(),
            pool: pool::WarmPool::new(config.warm_pool, config.fork_server, config.prefork),
            sessions,
            artifacts,
            runs: tenants::FairSlots::for_sandboxes(
                config.max_concurrent_runs,
                book.max_concurrent_runs(),
            ),
            host: host_work::HostWork::new(
                host_work::HostWork::default_threads(),
                config.tenants.max_concurrent_runs.is_some()
                    || config
                        .tenant_overrides
                        .values()
                        .any(|o| o.max_concurrent_runs.is_some()),
            ),
            config,
            sandbox,
            uv,
            store_problem,
            shared: store,
            interpreters: std::sync::RwLock::new(Arc::new(interpreters)),
            python_installs: tokio::sync::Mutex::new(()),
            cache,
            warm: Mutex::new(warm),
            lifecycle,
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
        self.store_problem.as_ref()
    }

    /// The tenant `caller` is for: what it may take of the server and keep in the stores,
    /// and which profiles it may name (the `[tenants]` defaults and its `[tenants.NAME]`).
    #[must_use]
    pub fn tenant(&self, caller: &Caller) -> Tenant {
        self.tenants.book().tenant(caller)
    }

    /// The settings this engine runs with.
    #[must_use]
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Build the default environment so the first call does not pay for it (cache warming).
    /// Observable through [`Engine::report`] (`warm`). Does nothing when warming is disabled.
    pub async fn warm(&self) {
        if !self.config.warm_cache {
            return;
        }
        self.set_warm(WarmState::Running);
        let started = std::time::Instant::now();
        let mut failed = Vec::new();
        if let Err(err) = self.default_environment().await {
            failed.push(err.message);
        } else {
            // Then `[cache] warm`, one environment each; one that fails does not stop the rest.
            for requirement in &self.config.warm_packages {
                if let Err(err) = self
                    .server_environment(std::slice::from_ref(requirement))
                    .await
                {
                    failed.push(format!("`{requirement}`: {}", err.message));
                }
            }
        }
        let state = if failed.is_empty() {
            WarmState::Ready {
                duration_ms: ids::millis(started.elapsed()),
            }
        } else {
            WarmState::Failed {
                message: failed.join("; "),
            }
        };
        tracing::info!(?state, "cache warming finished");
        self.set_warm(state);
    }

    /// Before the process exits: unmount the tenants' shares of the sessions' disk unless
    /// another server of this data directory still runs (the files stay in their images).
    pub fn release_sessions(&self) {
        self.sessions.release();
    }

    /// A slot of `--max-concurrent-runs` for one sandbox working for `caller` (see
    /// [`Engine::runs`]).
    /// A call cancelled while it waits gets `cancelled`.
    pub(crate) async fn sandbox_slot(
        &self,
        caller: &Caller,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<tenants::Slot, EngineError> {
        let share = self.runs.share(caller);
        tokio::select! {
            slot = share.slot() => slot,
            () = cancel.cancelled() => Err(EngineError::new(
                ErrorKind::Cancelled,
                "The call was cancelled while it waited for a sandbox slot",
            )),
        }
    }

    /// `caller`'s claim on the sandbox slots, for work that goes on after its call (an
    /// install) to hold in its name.
    pub(crate) fn share(&self, caller: &Caller) -> tenants::Share {
        self.runs.share(caller)
    }

    /// Do `work` on the host for `caller`, on the bounded, fairly shared host-work threads
    /// ([`host_work::HostWork`]).
    ///
    /// # Errors
    /// When the work panicked.
    pub(crate) async fn on_host<R: Send + 'static>(
        &self,
        caller: &Caller,
        action: &str,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, EngineError> {
        self.host.run(caller, action, work).await
    }

    /// A slot for the server's own background work (warming, compilation).
    pub(crate) async fn server_slot(&self) -> Result<tenants::Slot, EngineError> {
        self.runs.server_share().slot().await
    }

    async fn default_environment(&self) -> Result<snakebox_env::Environment, EngineError> {
        self.server_environment(&[]).await
    }

    /// The default interpreter's environment of `requirements` (none: the default
    /// environment), built in the server's name if missing: cache warming's work.
    async fn server_environment(
        &self,
        requirements: &[pep508_rs::Requirement],
    ) -> Result<snakebox_env::Environment, EngineError> {
        let cache = self.cache.as_ref().map_err(Clone::clone)?;
        let interpreter = self.pick_interpreter(None, None)?;
        // Building it runs uv's install sandboxes: a slot, like every sandbox.
        let _slot = self.server_slot().await?;
        Ok(cache.ensure(&interpreter, requirements).await?)
    }

    fn set_warm(&self, state: WarmState) {
        if let Ok(mut warm) = self.warm.lock() {
            *warm = state;
        }
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
        let store = self.artifacts.clone();
        let uri = uri.to_string();
        let caller = caller.clone();
        let who = caller.clone();
        let read = self
            .host
            .run(&who, "read the artifact", move || store.read(&caller, &uri))
            .await?;
        Ok(read?)
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
        let store = self.artifacts.clone();
        let (caller, execution_id, path) =
            (caller.clone(), execution_id.to_owned(), path.to_owned());
        let who = caller.clone();
        let opened = self
            .host
            .run(&who, "open the artifact", move || {
                store.open(&caller, &execution_id, &path)
            })
            .await?;
        Ok(opened?)
    }

    /// `caller`'s artifacts of the most recent runs, newest first.
    pub async fn list_artifacts(&self, caller: &Caller, limit: usize) -> Vec<Artifact> {
        let store = self.artifacts.clone();
        let caller = caller.clone();
        let who = caller.clone();
        self.host
            .run(&who, "list the artifacts", move || {
                store.list(&caller, limit)
            })
            .await
            .unwrap_or_default()
    }

    /// `caller`'s runs (one-shot runs, session cells and commands) that `query` selects,
    /// newest first; a run still going has status `running`.
    pub async fn list_runs(&self, caller: &Caller, query: RunQuery) -> Vec<RunRecord> {
        let caller = caller.clone();
        let history = Arc::clone(&self.history);
        let who = caller.clone();
        self.host
            .run(&who, "list the runs", move || history.list(&caller, &query))
            .await
            .unwrap_or_default()
    }

    /// One of `caller`'s runs by execution id.
    ///
    /// # Errors
    /// `not_found` for an id that is not one of `caller`'s runs (another caller's included,
    /// answered exactly as an id that never existed) or that has been forgotten.
    pub async fn run_record(&self, caller: &Caller, id: &str) -> Result<RunRecord, EngineError> {
        let history = Arc::clone(&self.history);
        let (who, wanted) = (caller.clone(), id.to_owned());
        self.host
            .run(caller, "read the run", move || history.get(&who, &wanted))
            .await
            .ok()
            .flatten()
            .ok_or_else(|| {
                EngineError::new(ErrorKind::NotFound, format!("No run `{id}`")).with_hint(
                    "list the runs to see those that are kept (each tenant's newest, within its budget of runs, for 30 days)",
                )
            })
    }

    /// The result one of `caller`'s finished runs returned (stdout, stderr, result value,
    /// exception, artifacts, network log), as the JSON the tool answered with; `None` while it
    /// runs, for another caller's run (as for an unknown id), for runs recorded before results
    /// were kept, and for a result too large to keep.
    pub async fn run_output(&self, caller: &Caller, id: &str) -> Option<serde_json::Value> {
        let history = Arc::clone(&self.history);
        let (who, wanted) = (caller.clone(), id.to_owned());
        let json = self
            .host
            .run(caller, "read the run's result", move || {
                history.output(&who, &wanted)
            })
            .await
            .ok()
            .flatten()?;
        serde_json::from_str(&json).ok()
    }

    /// The artifact store (location and retention rule).
    #[must_use]
    pub fn artifact_store(&self) -> &ArtifactStore {
        &self.artifacts
    }

    /// Remove artifacts past the store's retention rule (age, then size quota).
    pub async fn prune_artifacts(&self) -> ArtifactPrune {
        let store = self.artifacts.clone();
        tokio::task::spawn_blocking(move || store.prune(None))
            .await
            .unwrap_or_default()
    }

    /// Remove environments past the cache's retention rule (age, then size).
    pub async fn prune(&self) -> Result<snakebox_env::PruneReport, EngineError> {
        let cache = self.cache.as_ref().map_err(Clone::clone)?;
        Ok(cache.prune().await?)
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
