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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Serialize;
use snakebox_env::Environment;
use snakebox_sandbox::PendingRun;

use crate::Engine;
use crate::execute::RunDir;
use crate::ids;

/// Other (environment, network) pairs kept warm besides the default one.
pub(crate) const RECENT_ENVIRONMENTS: usize = 2;
/// The request that starts a pooled run (the script is in its input directory by then).
pub(crate) const GO: &[u8] = b"go\n";
/// How long the refill waits after a failed start before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// What a pooled sandbox is for: a cached environment and a network setting.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    environment: String,
    network: bool,
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
}

#[derive(Default)]
struct Inner {
    /// The default environment, once known.
    default: Option<Target>,
    /// Recently used other targets, most recent first.
    recent: Vec<Target>,
    ready: Vec<Warm>,
    last_error: Option<String>,
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
}

/// The warm pool in `check_environment`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
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
}

impl WarmPool {
    pub(crate) fn new(size: usize) -> WarmPool {
        WarmPool {
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

    /// A ready sandbox for this environment and network setting, if there is one. Records the
    /// use either way, so recently used environments are kept warm. `is_default`: the call
    /// uses the default environment and network setting (known from its first use when cache
    /// warming did not build it).
    pub(crate) fn take(
        &self,
        environment: &Environment,
        network: bool,
        is_default: bool,
    ) -> Option<Warm> {
        if !self.active() {
            return None;
        }
        let key = Key {
            environment: environment.key.clone(),
            network,
        };
        let (taken, discarded) = {
            let mut inner = self.lock();
            if is_default
                && inner
                    .default
                    .as_ref()
                    .is_none_or(|default| default.key == key)
            {
                inner.default = Some(Target {
                    key: key.clone(),
                    environment: environment.clone(),
                });
            }
            let is_default = inner.default.as_ref().is_some_and(|t| t.key == key);
            if !is_default {
                inner.recent.retain(|t| t.key != key);
                inner.recent.insert(
                    0,
                    Target {
                        key: key.clone(),
                        environment: environment.clone(),
                    },
                );
                inner.recent.truncate(RECENT_ENVIRONMENTS);
            }
            // Sandboxes of environments no longer kept warm go.
            let kept: Vec<Key> = inner
                .default
                .iter()
                .chain(inner.recent.iter())
                .map(|t| t.key.clone())
                .collect();
            let mut discarded = Vec::new();
            let mut index = 0;
            while index < inner.ready.len() {
                if kept.contains(&inner.ready[index].key) {
                    index += 1;
                } else {
                    discarded.push(inner.ready.swap_remove(index));
                }
            }
            let mut taken = None;
            let root = dir_id(&environment.root);
            while let Some(at) = inner.ready.iter().position(|w| w.key == key) {
                let mut warm = inner.ready.remove(at);
                if warm.root.is_some() && warm.root == root && warm.pending.is_alive() {
                    taken = Some(warm);
                    break;
                }
                discarded.push(warm);
            }
            (taken, discarded)
        };
        drop(discarded);
        if taken.is_some() {
            self.served.fetch_add(1, Ordering::Relaxed);
        } else {
            self.cold.fetch_add(1, Ordering::Relaxed);
        }
        self.wake.notify_one();
        taken
    }

    /// The next target that has fewer than `size` sandboxes ready.
    fn wanted(&self) -> Option<Target> {
        let inner = self.lock();
        inner
            .default
            .iter()
            .chain(inner.recent.iter())
            .find(|target| inner.ready.iter().filter(|w| w.key == target.key).count() < self.size)
            .cloned()
    }

    pub(crate) fn report(&self) -> PoolReport {
        let inner = self.lock();
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
                .map(|t| {
                    let network = if t.key.network { " (network on)" } else { "" };
                    format!("{}{network}", t.key.environment)
                })
                .collect(),
            served: self.served.load(Ordering::Relaxed),
            cold_starts: self.cold.load(Ordering::Relaxed),
            last_error: inner.last_error.clone(),
        }
    }
}

impl Engine {
    /// Keep the warm pool filled until [`Engine::stop_warm_pool`]: first the default
    /// environment (built here if cache warming did not), then recently used ones. Returns at
    /// once when the pool is off (`--warm-pool 0`) or the sandbox is unavailable. Meant to be
    /// spawned by a long-running server; one-shot commands do not start it.
    pub async fn run_warm_pool(self: Arc<Self>) {
        let pool = &self.pool;
        if pool.size == 0 || self.sandbox.is_err() || pool.running.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.config.warm_cache {
            match self.default_environment().await {
                Ok(environment) => {
                    pool.lock().default = Some(Target {
                        key: Key {
                            environment: environment.key.clone(),
                            network: self.config.network,
                        },
                        environment,
                    });
                }
                Err(err) => pool.lock().last_error = Some(err.message),
            }
        }
        while !pool.stopped.load(Ordering::Relaxed) {
            let Some(target) = pool.wanted() else {
                pool.wake.notified().await;
                continue;
            };
            match self.prestart(&target) {
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
                    pool.lock().last_error = Some(message);
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
    pub async fn stop_warm_pool(&self) {
        self.pool.stopped.store(true, Ordering::SeqCst);
        self.pool.wake.notify_one();
        let ready = std::mem::take(&mut self.pool.lock().ready);
        for warm in ready {
            warm.pending.discard().await;
            drop(warm.run_dir);
        }
    }

    /// The warm pool's state, for `check_environment`.
    pub(crate) fn pool_report(&self) -> PoolReport {
        self.pool.report()
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
        let (policy, command) = self.sandbox_call(
            &target.environment,
            &run_dir,
            self.config.max_timeout,
            target.key.network,
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
        })
    }
}

/// A directory's (device, inode).
fn dir_id(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}
