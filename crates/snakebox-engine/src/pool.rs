//! The warm pool: one-shot sandboxes started ahead of time, so that a call does not wait for
//! bubblewrap and the interpreter to start.
//!
//! Each pooled sandbox is set up exactly like a cold run (a fresh run directory with its
//! size-capped working directory, the same policy: mounts, limits, network, seccomp, uid) for
//! one environment and network setting. Its runner has started the interpreter and imported
//! its own modules, and blocks reading one request from a private stdin pipe. A call that
//! matches (same cached environment, same network setting) takes one, writes its script and
//! input files into the run directory, sends "go", and is supervised exactly like a cold run
//! (the wall-time limit counts from the request). Each sandbox serves exactly one run and is
//! then discarded; a background task starts its replacement. No state of one run can reach
//! the next: every run has its own sandbox, namespaces, `/tmp`, working directory and
//! processes, as when cold.
//!
//! What is kept warm: `size` sandboxes for the default environment (once it is built) and for
//! each of the [`RECENT_ENVIRONMENTS`] most recently used other (environment, network) pairs.
//! A call nothing in the pool matches runs cold, as before.
//!
//! **Fork servers.** Runs of an environment kept warm are forked instead
//! (when `fork_server` is on and the sandbox can have one: native, root, cgroups): one
//! interpreter of that environment with the runner imported waits in a sandbox of its own,
//! and each run is a child of it in a fresh sandbox of its own — new namespaces, its own host
//! uid, `/tmp`, working directory, cgroup and limits, no capabilities, the seccomp programs —
//! see `snakebox_sandbox::ForkServer`. A run costs a `fork` instead of a bubblewrap and an
//! interpreter start, which is what lets two cores serve well over a hundred runs a second,
//! and imports nothing twice. While a fork server serves an environment, no pooled
//! sandboxes are kept for it; if it stops, it is restarted (after [`RETRY_AFTER`] when a
//! start failed) and the pool covers the gap. When the environment's directory is replaced
//! by its byte-compiled copy, a fork server of the copy is started before the swap and takes
//! over right after it ([`Keeper::fork_servers_of_copy`]); a fork server of a directory that
//! was replaced otherwise goes at the next claim (or, replaced while it started, as soon as
//! its start returns) and the refill starts one. A fork server of
//! an environment with packages also imports what its recent runs imported (`crate::learn`):
//! once it has learned a module, the refill starts a new one that imports it and puts it in
//! the old one's place.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_env::Environment;
use snakebox_sandbox::{ForkServer, PendingRun};

use crate::environments::Environments;
use crate::ids;
use crate::network::Proxies;
use crate::run::RunDir;
use crate::run::Sandboxes;
use crate::{EngineConfig, Unavailable};

/// Other (environment, network) pairs kept warm besides the default one.
pub(crate) const RECENT_ENVIRONMENTS: usize = 2;
/// The request that starts a pooled run (the script is in its input directory by then).
pub(crate) const GO: &[u8] = b"go\n";
/// How long the refill waits after a failed start before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Fork server keys whose runs' imports are counted at once, at most.
const LEARNING_KEYS: usize = 64;

/// What a pooled sandbox or a fork server is for: a cached environment, a network setting,
/// and whose runs may share it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    environment: String,
    network: bool,
    /// `None` for an environment without packages: nothing a caller chose is imported ahead
    /// of the run. Otherwise the tenant: a fork server has run the environment's import-time
    /// code, which could leave state (a shared mapping) that every later fork inherits, so
    /// tenants never share one (SECURITY.md, "Forked runs").
    tenant: Option<String>,
}

impl Key {
    fn of(environment: &Environment, network: bool, caller: &crate::Caller) -> Key {
        Key::from_parts(
            &environment.key,
            !environment.packages.is_empty(),
            network,
            caller,
        )
    }

    fn from_parts(
        environment: &str,
        has_packages: bool,
        network: bool,
        caller: &crate::Caller,
    ) -> Key {
        Key {
            environment: environment.to_owned(),
            network,
            tenant: has_packages.then(|| caller.id().to_owned()),
        }
    }
}

/// An environment kept warm.
#[derive(Debug, Clone)]
struct Target {
    key: Key,
    /// Holds the environment's lease: it is not pruned while kept warm.
    environment: Environment,
}

/// A started sandbox waiting for its run.
pub(crate) struct Warm {
    key: Key,
    /// The environment directory's (device, inode) when the sandbox mounted it: a set that
    /// was re-resolved since (renamed into place anew) must not be run from the old one.
    root: Option<(u64, u64)>,
    pub(crate) run_dir: RunDir,
    pub(crate) pending: PendingRun,
    /// The proxy of a sandbox kept with network (the server's whole policy): its log is the
    /// log of the one run this sandbox serves.
    pub(crate) proxy: Option<snakebox_sandbox::RunProxy>,
}

/// A fork server of one environment kept warm.
pub(crate) struct Forking {
    pub(crate) server: ForkServer,
    key: Key,
    root: Option<(u64, u64)>,
    /// Holds the environment's lease while it serves.
    environment: Environment,
    /// Its runs report what they import (see `crate::learn`).
    pub(crate) learns: bool,
    /// The learned modules it was started with.
    modules: Vec<String>,
}

impl Forking {
    /// Whether it serves the directory whose (device, inode) is `root`.
    fn serves(&self, root: Option<(u64, u64)>) -> bool {
        self.root.is_some() && self.root == root
    }

    /// Whether it serves the environment's current directory (not one since replaced by a
    /// new one renamed into its place): only then may a claim take it.
    fn is_current(&self) -> bool {
        self.serves(dir_id(&self.environment.root))
    }
}

/// How a call is started (see [`WarmPool::claim`]).
pub(crate) enum Claim {
    /// Forked from the fork server of its environment.
    Fork(Arc<Forking>),
    /// In a ready sandbox of the pool.
    Warm(Box<Warm>),
    /// In a sandbox started now.
    Cold,
}

/// What [`WarmPool::note_use`] took out of the pool (dropped outside its lock).
#[derive(Default)]
struct Discarded {
    warm: Vec<Warm>,
    forks: Vec<Arc<Forking>>,
}

/// A failure kept for `check_environment`, with the tenant whose environment it concerns:
/// its text may name that environment's packages, so another tenant is not shown it.
#[derive(Debug, Clone)]
struct Failure {
    /// `None`: the server's own, or an environment without packages (every tenant's).
    tenant: Option<String>,
    message: String,
    at: std::time::Instant,
}

impl Failure {
    fn of(key: Option<&Key>, message: String) -> Failure {
        Failure {
            tenant: key.and_then(|k| k.tenant.clone()),
            message,
            at: std::time::Instant::now(),
        }
    }
}

/// Whether `viewer` may see what concerns `tenant`'s environments (`None` viewer: the operator).
fn visible(viewer: Option<&crate::Caller>, tenant: Option<&String>) -> bool {
    viewer.is_none_or(|caller| tenant.is_none_or(|owner| caller.owns(owner)))
}

#[derive(Default)]
struct Inner {
    /// Running fork servers, one per (environment, network setting) kept warm.
    forks: Vec<Arc<Forking>>,
    /// Why the last fork server start failed, and when.
    fork_error: Option<Failure>,
    /// The default environment, once known.
    default: Option<Target>,
    /// Recently used other targets, most recent first.
    recent: Vec<Target>,
    ready: Vec<Warm>,
    /// The last failure to start a pooled sandbox.
    last_error: Option<Failure>,
    /// Environments (cache keys) whose fork server failed to start while preloading their
    /// packages: later fork servers of them preload nothing, so a package whose import
    /// crashes, hangs or runs out of memory is not imported again every few seconds.
    no_preload: std::collections::HashSet<String>,
    /// What recent runs imported, per fork server key (see `crate::learn`).
    imports: std::collections::HashMap<Key, crate::learn::Imports>,
    /// Environments (cache keys) whose fork server failed to start while importing learned
    /// modules: they learn no more.
    no_learn: std::collections::HashSet<String>,
}

impl Inner {
    /// Make `forking` the fork server of its key: the ones it replaces are returned (to be
    /// stopped outside the lock), and the key's pooled sandboxes are no longer needed.
    fn install_fork_server(&mut self, forking: Forking) -> Vec<Arc<Forking>> {
        self.ready.retain(|w| w.key != forking.key);
        let (replaced, kept) = std::mem::take(&mut self.forks)
            .into_iter()
            .partition(|f| f.key == forking.key);
        self.forks = kept;
        self.forks.push(Arc::new(forking));
        self.fork_error = None;
        replaced
    }
}

/// The pool's state (see the module documentation).
pub(crate) struct WarmPool {
    size: usize,
    inner: Mutex<Inner>,
    wake: tokio::sync::Notify,
    running: AtomicBool,
    stopped: AtomicBool,
    served: AtomicU64,
    cold: AtomicU64,
    forked: AtomicU64,
    fork_enabled: bool,
    /// Pre-forked children per fork server (`--prefork`).
    prefork: usize,
    /// The run directories are ready for a fork server ([`Keeper::prepare_fork_server`]).
    fork_prepared: AtomicBool,
}

/// The warm pool in `check_environment`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PoolReport {
    /// Sandboxes kept ready per environment (`--warm-pool`); 0 when the pool is off.
    pub size: usize,
    /// Whether the pool is filling (it runs in `serve` only).
    pub active: bool,
    /// Sandboxes ready now, all environments together.
    pub ready: usize,
    /// Ready sandboxes for the default environment.
    pub ready_default: usize,
    /// Environments kept warm (cache keys), the default first.
    pub environments: Vec<String>,
    /// Runs served by a pre-started sandbox since start.
    pub served: u64,
    /// Runs that started a sandbox while the caller waited (nothing ready matched).
    pub cold_starts: u64,
    /// The last failure to start a pooled sandbox, if any.
    pub last_error: Option<String>,
    /// Fork servers running now, one per (environment, network setting) kept warm
    /// (`--fork-server`); 0 when it is off, none started yet, or unavailable here.
    pub fork_servers: usize,
    /// Runs forked since start.
    pub forked: u64,
    /// Why the last fork server start failed, if it did (it is retried after 5 s).
    pub fork_server_error: Option<String>,
    /// Each fork server running now: what it preloaded and what it costs
    /// (`--preload-packages`), and its pre-forked children (`--prefork`).
    pub fork_server_details: Vec<ForkServerReport>,
    /// Children each fork server keeps already forked into a run's fresh sandbox
    /// (`--prefork`; 0: none).
    pub prefork: usize,
    /// Runs served by a pre-forked child, by the fork servers running now.
    pub preforked: u64,
}

/// One fork server in `check_environment`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ForkServerReport {
    /// The environment it forks runs of (its cache key).
    pub environment: String,
    /// The modules it imported before serving, so that its runs find them in memory.
    pub preloaded: Vec<String>,
    /// The most memory its cgroup has been charged (interpreter, preloaded modules, files it
    /// read); `null` where the cgroup does not count it.
    pub peak_memory_bytes: Option<u64>,
    /// Pre-forked children waiting for a run now.
    pub prefork_ready: usize,
    /// Runs one of its pre-forked children served.
    pub preforked: u64,
}

impl WarmPool {
    pub(crate) fn new(size: usize, fork_enabled: bool, prefork: usize) -> WarmPool {
        WarmPool {
            prefork,
            forked: AtomicU64::new(0),
            fork_enabled: fork_enabled && size > 0,
            fork_prepared: AtomicBool::new(false),
            size,
            inner: Mutex::new(Inner::default()),
            wake: tokio::sync::Notify::new(),
            running: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            served: AtomicU64::new(0),
            cold: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn active(&self) -> bool {
        self.size > 0
            && self.running.load(Ordering::Relaxed)
            && !self.stopped.load(Ordering::Relaxed)
    }

    /// Record a call's use of an environment, so recently used environments are kept warm,
    /// and discard what is kept for environments no longer warm. `is_default`: the call uses
    /// the default environment and network setting (known from its first use when cache
    /// warming did not build it).
    fn note_use(
        &self,
        inner: &mut Inner,
        key: &Key,
        environment: &Environment,
        is_default: bool,
    ) -> Discarded {
        if is_default
            && inner
                .default
                .as_ref()
                .is_none_or(|default| &default.key == key)
        {
            inner.default = Some(Target {
                key: key.clone(),
                environment: environment.clone(),
            });
        }
        let is_default = inner.default.as_ref().is_some_and(|t| &t.key == key);
        if !is_default {
            inner.recent.retain(|t| &t.key != key);
            inner.recent.insert(
                0,
                Target {
                    key: key.clone(),
                    environment: environment.clone(),
                },
            );
            inner.recent.truncate(RECENT_ENVIRONMENTS);
        }
        let kept: Vec<Key> = inner
            .default
            .iter()
            .chain(inner.recent.iter())
            .map(|t| t.key.clone())
            .collect();
        let mut discarded = Discarded::default();
        let mut index = 0;
        while index < inner.ready.len() {
            if kept.contains(&inner.ready[index].key) {
                index += 1;
            } else {
                discarded.warm.push(inner.ready.swap_remove(index));
            }
        }
        let (forks, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut inner.forks)
            .into_iter()
            .partition(|f| kept.contains(&f.key) && f.server.is_alive());
        inner.forks = forks;
        discarded.forks = gone;
        discarded
    }

    /// How a call is started: forked from a fork server of its environment, in a ready sandbox
    /// of the pool, or cold. Records the use either way (see [`WarmPool::note_use`]).
    pub(crate) fn claim(
        &self,
        caller: &crate::Caller,
        environment: &Environment,
        network: bool,
        is_default: bool,
        narrowed: bool,
    ) -> Claim {
        if !self.active() {
            return Claim::Cold;
        }
        let key = Key::of(environment, network, caller);
        let root = dir_id(&environment.root);
        let (claim, discarded) = {
            let mut inner = self.lock();
            let mut discarded = self.note_use(&mut inner, &key, environment, is_default);
            // A fork server of an environment since re-resolved (a new directory renamed into
            // place) goes: the refill task starts one for the current directory.
            let (forks, stale): (Vec<_>, Vec<_>) = std::mem::take(&mut inner.forks)
                .into_iter()
                .partition(|f| f.key != key || f.serves(root));
            inner.forks = forks;
            discarded.forks.extend(stale);
            let fork = inner
                .forks
                .iter()
                .find(|f| f.key == key && f.serves(root))
                .cloned();
            let claim = match fork {
                Some(fork) => Claim::Fork(fork),
                // A pooled sandbox's proxy has the whole policy (see `prestart`).
                None if narrowed => Claim::Cold,
                None => {
                    let mut taken = None;
                    let mut stale = Vec::new();
                    while let Some(at) = inner.ready.iter().position(|w| w.key == key) {
                        let mut warm = inner.ready.remove(at);
                        if warm.root.is_some() && warm.root == root && warm.pending.is_alive() {
                            taken = Some(warm);
                            break;
                        }
                        stale.push(warm);
                    }
                    drop(stale);
                    taken.map_or(Claim::Cold, |warm| Claim::Warm(Box::new(warm)))
                }
            };
            (claim, discarded)
        };
        drop(discarded);
        match &claim {
            Claim::Fork(_) => self.forked.fetch_add(1, Ordering::Relaxed),
            Claim::Warm(_) => self.served.fetch_add(1, Ordering::Relaxed),
            Claim::Cold => self.cold.fetch_add(1, Ordering::Relaxed),
        };
        self.wake.notify_one();
        claim
    }

    /// Whether a fork server serves `key` now (then no sandboxes are pooled for it).
    fn forks(inner: &Inner, key: &Key) -> bool {
        inner
            .forks
            .iter()
            .any(|f| &f.key == key && f.server.is_alive())
    }

    /// The next target that has fewer than `size` sandboxes ready.
    fn wanted(&self) -> Option<Target> {
        let inner = self.lock();
        inner
            .default
            .iter()
            .chain(inner.recent.iter())
            .filter(|target| !Self::forks(&inner, &target.key))
            .find(|target| inner.ready.iter().filter(|w| w.key == target.key).count() < self.size)
            .cloned()
    }

    /// A fork server to replace with one that imports what its runs were learned to import
    /// (see `crate::learn`), marked as being restarted.
    fn relearn_wanted(&self) -> Option<Target> {
        let mut inner = self.lock();
        let Inner { forks, imports, .. } = &mut *inner;
        let fork = forks.iter().find(|f| {
            f.learns
                && f.server.is_alive()
                && imports
                    .get(&f.key)
                    .is_some_and(|i| i.wants_restart(&f.modules))
        })?;
        if let Some(imports) = imports.get_mut(&fork.key) {
            imports.restarting();
        }
        Some(Target {
            key: fork.key.clone(),
            environment: fork.environment.clone(),
        })
    }

    /// Count what a run forked from `forking` imported; the refill is woken when a module was
    /// learned. The counts are kept for the environments kept warm only.
    pub(crate) fn learn(&self, forking: &Forking, imported: &[String]) {
        if !forking.learns || imported.is_empty() {
            return;
        }
        let learned = {
            let mut inner = self.lock();
            if inner.no_learn.contains(&forking.key.environment) {
                return;
            }
            if !inner.imports.contains_key(&forking.key) && inner.imports.len() >= LEARNING_KEYS {
                let kept: Vec<Key> = inner.forks.iter().map(|f| f.key.clone()).collect();
                inner.imports.retain(|key, _| kept.contains(key));
            }
            if inner.imports.len() >= LEARNING_KEYS {
                return;
            }
            inner
                .imports
                .entry(forking.key.clone())
                .or_default()
                .count(imported)
        };
        if learned {
            self.wake.notify_one();
        }
    }

    /// The first environment kept warm (the default first) that a fork server should serve
    /// and none does, unless a start failed just now.
    fn fork_wanted(&self) -> Option<Target> {
        if !self.fork_enabled || !self.fork_prepared.load(Ordering::SeqCst) {
            return None;
        }
        let inner = self.lock();
        if inner
            .fork_error
            .as_ref()
            .is_some_and(|failure| failure.at.elapsed() < RETRY_AFTER)
        {
            return None;
        }
        inner
            .default
            .iter()
            .chain(inner.recent.iter())
            .find(|target| !Self::forks(&inner, &target.key))
            .cloned()
    }

    /// The pool as `viewer` may see it (`None`: the operator): another tenant's environments,
    /// fork servers and failures are left out; the counts stay the server's.
    pub(crate) fn report(&self, viewer: Option<&crate::Caller>) -> PoolReport {
        let inner = self.lock();
        let seen = |key: &Key| visible(viewer, key.tenant.as_ref());
        let shown = |failure: &Option<Failure>| {
            failure
                .as_ref()
                .filter(|f| visible(viewer, f.tenant.as_ref()))
                .map(|f| f.message.clone())
        };
        let ready_default = inner.default.as_ref().map_or(0, |default| {
            inner.ready.iter().filter(|w| w.key == default.key).count()
        });
        PoolReport {
            size: self.size,
            active: self.active(),
            ready: inner.ready.len(),
            ready_default,
            environments: inner
                .default
                .iter()
                .chain(inner.recent.iter())
                .filter(|t| seen(&t.key))
                .map(|t| {
                    let network = if t.key.network { " (network on)" } else { "" };
                    format!("{}{network}", t.key.environment)
                })
                .collect(),
            served: self.served.load(Ordering::Relaxed),
            cold_starts: self.cold.load(Ordering::Relaxed),
            last_error: shown(&inner.last_error),
            fork_servers: if self.active() {
                inner.forks.iter().filter(|f| f.server.is_alive()).count()
            } else {
                0
            },
            forked: self.forked.load(Ordering::Relaxed),
            fork_server_details: if self.active() {
                inner
                    .forks
                    .iter()
                    .filter(|f| f.server.is_alive() && seen(&f.key))
                    .map(|f| ForkServerReport {
                        environment: f.key.environment.clone(),
                        preloaded: f.server.preloaded().to_vec(),
                        peak_memory_bytes: f.server.peak_memory_bytes(),
                        prefork_ready: f.server.prefork_ready(),
                        preforked: f.server.preforked_runs(),
                    })
                    .collect()
            } else {
                Vec::new()
            },
            prefork: if self.fork_enabled { self.prefork } else { 0 },
            preforked: inner.forks.iter().map(|f| f.server.preforked_runs()).sum(),
            fork_server_error: if self.fork_enabled {
                shown(&inner.fork_error)
            } else {
                None
            },
        }
    }
}

/// The pool's keeper, as a service: what filling the warm pool and starting fork servers
/// needs (the settings, the sandbox, what each sandbox is, the run proxies, the default
/// environment), apart from the pool's state ([`WarmPool`]) that the one-shot path claims
/// from.
pub(crate) struct Keeper {
    config: Arc<EngineConfig>,
    sandbox: Result<Arc<snakebox_sandbox::Sandbox>, Unavailable>,
    pool: Arc<WarmPool>,
    sandboxes: Arc<Sandboxes>,
    proxies: Arc<Proxies>,
    environments: Arc<Environments>,
}

impl Keeper {
    pub(crate) fn new(
        config: Arc<EngineConfig>,
        sandbox: Result<Arc<snakebox_sandbox::Sandbox>, Unavailable>,
        pool: Arc<WarmPool>,
        sandboxes: Arc<Sandboxes>,
        proxies: Arc<Proxies>,
        environments: Arc<Environments>,
    ) -> Keeper {
        Keeper {
            config,
            sandbox,
            pool,
            sandboxes,
            proxies,
            environments,
        }
    }

    /// Keep the warm pool filled until [`Keeper::stop_warm_pool`]: first the default
    /// environment (built here if cache warming did not), then recently used ones. Returns at
    /// once when the pool is off (`--warm-pool 0`) or the sandbox is unavailable. Meant to be
    /// spawned by a long-running server; one-shot commands do not start it. Fork servers start
    /// only after [`Keeper::prepare_fork_server`], which the server calls before it takes
    /// requests.
    pub(crate) async fn run_warm_pool(self: Arc<Self>) {
        let pool = &self.pool;
        if pool.size == 0 || self.sandbox.is_err() || pool.running.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.config.warm_cache {
            match self.environments.default_environment().await {
                Ok(environment) => {
                    pool.lock().default = Some(Target {
                        key: Key::of(
                            &environment,
                            self.config.network.allows_network(),
                            &crate::Caller::local(),
                        ),
                        environment,
                    });
                }
                Err(err) => pool.lock().last_error = Some(Failure::of(None, err.message)),
            }
        }
        while !pool.stopped.load(Ordering::Relaxed) {
            if let Some(target) = pool.fork_wanted() {
                let key = target.key.clone();
                let started = self.start_fork_server_off_runtime(target, None).await;
                let replaced = {
                    let mut inner = pool.lock();
                    match started {
                        // Its environment was published anew while it started (its compiled
                        // copy took the directory's place): a claim would discard it, so it
                        // goes now and the next turn starts one of the current directory.
                        Ok(forking) if !forking.is_current() => {
                            tracing::debug!(environment = %forking.key.environment, "the environment was replaced while its fork server started; starting another");
                            vec![Arc::new(forking)]
                        }
                        Ok(forking) => inner.install_fork_server(forking),
                        Err(message) => {
                            tracing::warn!(%message, "could not start a fork server; the warm pool serves instead");
                            inner.fork_error = Some(Failure::of(Some(&key), message));
                            Vec::new()
                        }
                    }
                };
                // Stopped outside the lock.
                drop(replaced);
                continue;
            }
            if let Some(target) = pool.relearn_wanted() {
                match self.start_fork_server_off_runtime(target, None).await {
                    Ok(forking) if !forking.is_current() => drop(forking),
                    // In the old one's place; the old one is stopped outside the lock.
                    Ok(forking) => drop(pool.lock().install_fork_server(forking)),
                    // The old one serves on.
                    Err(message) => {
                        tracing::warn!(%message, "could not start a fork server with the modules its runs import; the running one serves on");
                    }
                }
                continue;
            }
            let Some(target) = pool.wanted() else {
                // A learned module may wait for RESTART_AFTER: look again then.
                tokio::select! {
                    () = pool.wake.notified() => {}
                    () = tokio::time::sleep(crate::learn::RESTART_AFTER) => {}
                }
                continue;
            };
            // Starting a sandbox blocks (bubblewrap's setup, or the engine's requests for a
            // container): not on the runtime's few worker threads.
            let engine = Arc::clone(&self);
            let key = target.key.clone();
            let started = tokio::task::spawn_blocking(move || engine.prestart(&target))
                .await
                .unwrap_or_else(|err| Err(format!("starting a pooled sandbox failed: {err}")));
            match started {
                Ok(warm) => {
                    let mut inner = pool.lock();
                    if pool.stopped.load(Ordering::Relaxed) {
                        drop(inner);
                        drop(warm);
                        break;
                    }
                    inner.ready.push(warm);
                }
                Err(message) => {
                    tracing::warn!(%message, "could not start a pooled sandbox");
                    pool.lock().last_error = Some(Failure::of(Some(&key), message));
                    tokio::select! {
                        () = tokio::time::sleep(RETRY_AFTER) => {}
                        () = pool.wake.notified() => {}
                    }
                }
            }
            // Let the call that woke us run first: a start costs CPU it may need.
            tokio::task::yield_now().await;
        }
    }

    /// Stop refilling and discard every ready sandbox (their trees are killed, their run
    /// directories removed).
    pub(crate) async fn stop_warm_pool(&self) {
        self.pool.stopped.store(true, Ordering::SeqCst);
        self.pool.wake.notify_one();
        let (ready, forks) = {
            let mut inner = self.pool.lock();
            (
                std::mem::take(&mut inner.ready),
                std::mem::take(&mut inner.forks),
            )
        };
        drop(forks);
        if self.pool.fork_prepared.swap(false, Ordering::SeqCst)
            && let Ok(sandbox) = &self.sandbox
        {
            sandbox.release_runs_root(&crate::run::server_runs_dir(&self.config.data_dir));
        }
        for warm in ready {
            warm.pending.discard().await;
            drop(warm.run_dir);
        }
    }

    /// Get the run directories ready for a fork server (see
    /// [`snakebox_sandbox::Sandbox::prepare_runs_root`]), before any run starts: `serve`
    /// calls it before it takes requests. Turns the fork server off when that fails.
    pub(crate) fn prepare_fork_server(&self) {
        let Ok(sandbox) = &self.sandbox else {
            return;
        };
        if !self.pool.fork_enabled || !sandbox.forks_runs() {
            return;
        }
        let dir = crate::run::server_runs_dir(&self.config.data_dir);
        if let Err(err) = sandbox.prepare_runs_root(&dir) {
            let message = format!(
                "could not mount the run directories at `{}`: {err}",
                dir.display()
            );
            self.pool.lock().fork_error = Some(Failure::of(None, message));
            self.pool.fork_prepared.store(false, Ordering::SeqCst);
            return;
        }
        self.pool.fork_prepared.store(true, Ordering::SeqCst);
    }

    /// Fork servers of the compiled copy of the environment under `key`, at `copy`, for each
    /// of its fork servers running now (see [`snakebox_env::EnvCache::complete`]): started
    /// before the copy takes the environment's place, so that the runs after the publish are
    /// forked at once from servers that see the copy, instead of starting cold until the
    /// refill task has started new ones. Hand them to [`Keeper::adopt_fork_servers`] once
    /// the copy is published.
    pub(crate) async fn fork_servers_of_copy(
        self: &Arc<Self>,
        key: &str,
        copy: PathBuf,
    ) -> Vec<Forking> {
        let targets: Vec<Target> = self
            .pool
            .lock()
            .forks
            .iter()
            .filter(|f| f.key.environment == key && f.server.is_alive())
            .map(|f| Target {
                key: f.key.clone(),
                environment: f.environment.clone(),
            })
            .collect();
        let mut started = Vec::new();
        for target in targets {
            match self
                .start_fork_server_off_runtime(target, Some(copy.clone()))
                .await
            {
                Ok(forking) => started.push(forking),
                Err(message) => {
                    tracing::warn!(%key, %message, "could not start a fork server of the compiled copy; runs start cold until the refill starts one");
                }
            }
        }
        started
    }

    /// [`Keeper::start_fork_server`] on a blocking thread (a start waits for the fork server
    /// to be ready: not on the runtime's few worker threads).
    async fn start_fork_server_off_runtime(
        self: &Arc<Self>,
        target: Target,
        copy: Option<PathBuf>,
    ) -> Result<Forking, String> {
        let engine = Arc::clone(self);
        tokio::task::spawn_blocking(move || engine.start_fork_server(&target, copy.as_deref()))
            .await
            .unwrap_or_else(|err| Err(format!("starting a fork server failed: {err}")))
    }

    /// Put fork servers of a just-published environment (see
    /// [`Keeper::fork_servers_of_copy`]) in the place of those of the directory it replaced.
    pub(crate) fn adopt_fork_servers(&self, forkings: Vec<Forking>) {
        let replaced: Vec<Arc<Forking>> = {
            let mut inner = self.pool.lock();
            forkings
                .into_iter()
                .flat_map(|forking| inner.install_fork_server(forking))
                .collect()
        };
        // Stopped outside the lock.
        drop(replaced);
    }

    /// Start the fork server for `target` (blocking: it waits until the server is ready); with
    /// `copy`, of that copy of the environment's directory, mounted in its place.
    fn start_fork_server(&self, target: &Target, copy: Option<&Path>) -> Result<Forking, String> {
        let sandbox = self.sandbox.as_ref().map_err(|m| m.message.clone())?;
        let mut spec = self.sandboxes.fork_server_spec(&target.environment);
        let key = &target.environment.key;
        // Runs learn what to import only where the fork server is the tenant's own and
        // preloads packages (`--preload-packages` 0 turns both off).
        let learns = {
            let inner = self.pool.lock();
            if inner.no_preload.contains(key) {
                spec.preload.clear();
            }
            let learns = target.key.tenant.is_some()
                && self.config.preload_packages > 0
                && !inner.no_learn.contains(key);
            if learns && let Some(imports) = inner.imports.get(&target.key) {
                spec.modules = imports.learned().to_vec();
            }
            learns
        };
        if let Some(copy) = copy {
            for mount in &mut spec.policy.mounts {
                if mount.host == target.environment.root {
                    mount.host = copy.to_path_buf();
                }
            }
        }
        // The directory's (device, inode): a copy keeps it when it takes the environment's place.
        let root = dir_id(copy.unwrap_or(&target.environment.root));
        let server = sandbox.start_fork_server(&spec).map_err(|err| {
            let mut message = crate::describe(&err);
            if !spec.modules.is_empty() {
                // Its next start imports the declared packages alone (then, if that fails
                // too, nothing).
                let mut inner = self.pool.lock();
                inner.no_learn.insert(key.clone());
                inner.imports.retain(|k, _| &k.environment != key);
                message.push_str(
                    "; it was importing the modules recent runs imported, which its next start will not",
                );
            } else if !spec.preload.is_empty() {
                self.pool.lock().no_preload.insert(key.clone());
                message.push_str(
                    "; it was preloading the environment's packages, which its next start will not",
                );
            }
            message
        })?;
        Ok(Forking {
            server,
            key: target.key.clone(),
            root,
            environment: target.environment.clone(),
            learns,
            modules: spec.modules,
        })
    }

    /// Start one sandbox for `target`, exactly as a cold run of it would be set up.
    fn prestart(&self, target: &Target) -> Result<Warm, String> {
        let sandbox = self.sandbox.as_ref().map_err(|m| m.message.clone())?;
        let run_dir = RunDir::for_run(
            sandbox,
            &self.config.data_dir,
            &ids::execution_id(),
            None,
            self.config.scratch_bytes,
        )
        .map_err(|err| format!("could not prepare a run directory: {err}"))?;
        // A sandbox kept with network gets its proxy now, with the server's whole policy
        // (a call that narrows it runs cold).
        let network = self.sandboxes.run_network(target.key.network);
        let proxy = match (network, self.config.network.names()) {
            (crate::run::RunNetwork::Proxy, Some(names)) => Some(
                self.proxies
                    .start_run_proxy(&run_dir.input, names)
                    .map_err(|err| err.message)?,
            ),
            _ => None,
        };
        let (policy, command) = self.sandboxes.sandbox_call(
            &target.environment,
            &run_dir,
            &crate::policy::server_shape(&self.config, self.config.max_timeout),
            network,
            true,
        );
        let root = dir_id(&target.environment.root);
        let pending = sandbox
            .prestart(&policy, &command)
            .map_err(|err| crate::describe(&err))?;
        Ok(Warm {
            key: target.key.clone(),
            root,
            run_dir,
            pending,
            proxy,
        })
    }
}

/// A directory's (device, inode).
fn dir_id(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::Key;
    use crate::Caller;

    #[test]
    fn tenants_share_nothing_warm_of_an_environment_with_packages() {
        let (a, b) = (
            Caller::tenant("team-a").unwrap(),
            Caller::tenant("team-b").unwrap(),
        );
        // With packages (their import-time code ran in the fork server): one per tenant.
        assert_ne!(
            Key::from_parts("env", true, false, &a),
            Key::from_parts("env", true, false, &b)
        );
        assert_eq!(
            Key::from_parts("env", true, false, &a),
            Key::from_parts("env", true, false, &a)
        );
        // A bare environment imports nothing a caller chose: shared.
        assert_eq!(
            Key::from_parts("env", false, false, &a),
            Key::from_parts("env", false, false, &b)
        );
    }
}
