//! The environment cache: one read-only virtual environment per (interpreter, requirement set),
//! built once, reused by every run, pruned by age and size.
//!
//! On disk, under the data root:
//!
//! ```text
//! <root>/environments-v1/<key>/       a complete venv + snakebox-env.json (its manifest)
//! <root>/last-used-v1/<key>           empty file; its mtime is the last time the env was handed out
//! <root>/installs-v1/                 one mount for the downloader, so uv hard-links:
//!          uv-cache/                  uv's cache (written by trusted uv only, never by package code)
//!          builds/build-<random>/     builds in progress (the env, the requirements file)
//! <root>/.trash/                      environments being deleted
//! ```
//!
//! The key is a hash of the interpreter's real path and full version, the sorted normalised
//! requirement strings, and the index settings uv runs with. An environment is built in
//! `installs-v1/builds`, verified (the `verify` module: installed files against their
//! `RECORD`, compiled files loadable; a build that fails it is not kept, and one published by
//! an earlier version without that check is rebuilt at its next use), given its manifest
//! and made world-readable, then renamed into place in one step;
//! once there it is never modified (uv's cache-poisoning lesson: a half-written or patched
//! environment must never be visible under a key). A requirement set with anything but exact
//! pins is re-resolved once its environment is older than
//! [`CacheConfig::unpinned_freshness`]: the new build atomically replaces the old one
//! (`renameat2(RENAME_EXCHANGE)`), and runs that already mounted the old one keep it.
//!
//! Pruning ([`EnvCache::prune`]): first every environment unused for longer than
//! [`CacheConfig::max_age`], then the least recently used ones until the total is at most
//! [`CacheConfig::max_bytes`]. An environment that is in use (an [`Environment`] handed out by
//! this cache is still alive) or being built is never removed. Sizes are the disk usage recorded
//! in each manifest at build time (files hard-linked with uv's cache count in full).

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pep440_rs::Operator;
use pep508_rs::{Requirement, VersionOrUrl};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use snakebox_sandbox::{CpuShare, Mount};

use crate::env_vars::UvEnvironment;
use crate::error::{EnvError, UvStderr};
use crate::install::{self, BuildSettings};
use crate::interpreter::Interpreter;
use crate::pipeline::{DownloadTarget, InstallPipeline, requirements_file_args, venv_python};
use crate::uv::{IntoUvRunner, PackageIdentity, Uv, UvInvocation, UvRunner};

/// Version of the on-disk layout; part of the directory names.
const ENVIRONMENTS_DIR: &str = "environments-v1";
const LAST_USED_DIR: &str = "last-used-v1";
/// uv's cache and the builds in progress, under one directory: the downloader's sandbox
/// mounts it whole, so that uv can hard-link from its cache into a build (a hard link cannot
/// cross mounts, even two binds of one file system).
const INSTALLS_DIR: &str = "installs-v1";
const UV_CACHE_DIR: &str = "uv-cache";
const BUILDS_DIR: &str = "builds";
/// Where uv's cache and the builds were before `installs-v1` (moved at start).
const OLD_UV_CACHE_DIR: &str = "uv-cache";
const OLD_TMP_DIR: &str = ".tmp";
const TRASH_DIR: &str = ".trash";
/// The manifest's file name inside each environment.
pub const MANIFEST_FILE: &str = "snakebox-env.json";
const MANIFEST_SCHEMA: u32 = 1;

/// How long one step of an install may take by default (an environment build's and a
/// session install's alike): long enough for the largest wheels on a slow link.
pub const DEFAULT_INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Settings of the environment cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// The data root. Must be traversable by the sandbox's uid when that is not root
    /// (`/root` is mode 700: put the root elsewhere, e.g. `/var/lib/snakebox`).
    pub root: PathBuf,
    /// Pruning shrinks the environments to at most this many bytes.
    pub max_bytes: u64,
    /// Environments unused for longer than this are pruned.
    pub max_age: Duration,
    /// A requirement set that is not all exact pins (`==`) is re-resolved when its environment
    /// is older than this; exact pins are reused indefinitely.
    pub unpinned_freshness: Duration,
}

impl CacheConfig {
    /// Defaults: 10 GiB, 30 days unused, unpinned sets re-resolved after 24 hours.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            max_bytes: 10 * 1024 * 1024 * 1024,
            max_age: Duration::from_secs(30 * 24 * 3600),
            unpinned_freshness: Duration::from_secs(24 * 3600),
        }
    }
}

/// One installed distribution, as `uv pip list` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedPackage {
    /// Distribution name.
    pub name: String,
    /// Installed version.
    pub version: String,
}

/// A built environment, ready to be mounted read-only into a run.
///
/// While any clone of it is alive the environment counts as in use and is never pruned: keep
/// it for as long as a run (or a session) uses the directory.
#[derive(Debug, Clone)]
pub struct Environment {
    /// The environment's directory.
    pub root: PathBuf,
    /// `root/bin/python`.
    pub python: PathBuf,
    /// The interpreter it was built on.
    pub interpreter: Interpreter,
    /// What is installed (empty for a bare environment).
    pub packages: Vec<ResolvedPackage>,
    /// Whether it came from the cache rather than being built by this call.
    pub reused: bool,
    /// The cache key (the directory's name).
    pub key: String,
    /// The normalised, sorted requirement strings it was built for.
    pub requirements: Vec<String>,
    /// Whether its packages are byte-compiled (see [`EnvCache::complete`]).
    pub compiled: bool,
    lease: Arc<Lease>,
}

impl Environment {
    /// The read-only mounts a run needs: the environment and the interpreter's prefix, each at
    /// its own path, so the venv's `bin/python` symlink and `pyvenv.cfg` keep working.
    pub fn mounts(&self) -> Vec<Mount> {
        let mut paths = vec![self.root.clone(), self.interpreter.prefix.clone()];
        if let Some(bin) = self.interpreter.executable.parent()
            && !bin.starts_with(&self.interpreter.prefix)
        {
            paths.push(bin.to_path_buf());
        }
        paths
            .into_iter()
            .map(|path| Mount {
                host: path.clone(),
                dest: path,
                writable: false,
            })
            .collect()
    }

    /// The build this handle refers to (for logs).
    pub fn build_id(&self) -> &str {
        &self.lease.build_id
    }
}

/// Held by every live [`Environment`]; its presence marks a build as in use.
#[derive(Debug)]
struct Lease {
    build_id: String,
}

/// Counts and sizes, for `check_environment`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheStats {
    /// The data root.
    pub root: PathBuf,
    /// Number of cached environments.
    pub environments: usize,
    /// Their total size in bytes (disk usage recorded at build time).
    pub bytes: u64,
    /// uv's cache directory (never visible to runs).
    pub uv_cache_dir: PathBuf,
    /// Whether installs run in a sandbox.
    pub installs_sandboxed: bool,
}

/// What became of the byte-compilation of environments published before it
/// ([`EnvCache::complete`]), since this cache was opened (for `check_environment`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CompileStats {
    /// Environments waiting to be compiled or being compiled.
    pub pending: usize,
    /// Compiled copies published in place of their environment.
    pub completed: u64,
    /// Attempts whose copy was discarded (the environment stays as it was: verified, not
    /// compiled; the next server tries again).
    pub failed: u64,
    /// Why the last failed attempt failed.
    pub last_failure: Option<String>,
}

/// The keys this cache has taken up for compilation (each at most once per process, so that a
/// package whose compilation always fails does not make every run start another attempt), and
/// the counts.
#[derive(Debug, Default)]
struct CompileBook {
    taken: std::collections::HashSet<String>,
    stats: CompileStats,
}

/// Why an environment was pruned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PruneReason {
    /// Unused for longer than [`CacheConfig::max_age`].
    Age,
    /// Least recently used while the cache was over [`CacheConfig::max_bytes`].
    Size,
    /// Its manifest was missing or unreadable.
    Unreadable,
}

/// One pruned environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrunedEnvironment {
    /// Its key.
    pub key: String,
    /// Its size.
    pub bytes: u64,
    /// Why it went.
    pub reason: PruneReason,
}

/// What [`EnvCache::prune`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Environments removed.
    pub removed: Vec<PrunedEnvironment>,
    /// Environments that would have been removed but were in use or being built.
    pub skipped_in_use: usize,
    /// Environments left.
    pub kept: usize,
    /// Total bytes before.
    pub bytes_before: u64,
    /// Total bytes after.
    pub bytes_after: u64,
}

/// The manifest written into each environment before it is renamed into place.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    schema: u32,
    key: String,
    build_id: String,
    requirements: Vec<String>,
    pinned: bool,
    packages: Vec<ResolvedPackage>,
    interpreter: ManifestInterpreter,
    index_settings: Vec<String>,
    uv_version: String,
    /// Seconds since the Unix epoch.
    created_at: u64,
    size_bytes: u64,
    /// Whether the environment passed the checks of the `verify` module before it was
    /// published. Environments built by versions without them (`false` when absent) are
    /// rebuilt at their next use, not trusted: one of them may hold a truncated file.
    #[serde(default)]
    verified: bool,
    /// Whether its packages were byte-compiled. An environment is published before that
    /// (`false`) so that its first run does not wait; [`EnvCache::complete`] compiles a copy
    /// off the hot path and publishes it in its place. Absent (`true`): built by a version
    /// that compiled before publishing.
    #[serde(default = "compiled_by_default")]
    compiled: bool,
}

fn compiled_by_default() -> bool {
    true
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ManifestInterpreter {
    executable: PathBuf,
    version: String,
    prefix: PathBuf,
    implementation: String,
}

/// A requirement set, normalised: sorted, deduplicated PEP 508 strings.
struct RequirementSet {
    lines: Vec<String>,
    pinned: bool,
}

impl RequirementSet {
    fn new(requirements: &[Requirement]) -> Self {
        let mut lines: Vec<String> = requirements.iter().map(ToString::to_string).collect();
        lines.sort();
        lines.dedup();
        Self {
            lines,
            pinned: requirements.iter().all(is_exact_pin),
        }
    }
}

/// True when the requirement pins one exact version with `==` (no wildcard). Same rule as
/// `snakebox_script::is_exact_pin`: ranges, `===`, URLs and bare names are not pins.
fn is_exact_pin(requirement: &Requirement) -> bool {
    match &requirement.version_or_url {
        Some(VersionOrUrl::VersionSpecifier(specifiers)) => specifiers
            .iter()
            .any(|specifier| *specifier.operator() == Operator::Equal),
        Some(VersionOrUrl::Url(_)) | None => false,
    }
}

/// The cache of built environments. `Send + Sync`: share it behind an `Arc`.
#[derive(Debug)]
pub struct EnvCache {
    config: CacheConfig,
    uv: Uv,
    installer: Arc<dyn UvRunner>,
    uv_env: UvEnvironment,
    install_timeout: Duration,
    /// How package code (compilation, builds) runs.
    build_settings: BuildSettings,
    /// One async lock per key: concurrent `ensure` calls for a key build once.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Manifests already read, by key.
    known: Mutex<HashMap<String, Arc<Manifest>>>,
    /// Live leases by build id.
    leases: Mutex<HashMap<String, Weak<Lease>>>,
    /// Publish new environments before byte-compiling them (set by a server that completes
    /// them in the background, [`EnvCache::defer_compilation`]).
    defer_compile: std::sync::atomic::AtomicBool,
    /// Background compilation, by key.
    compiles: Mutex<CompileBook>,
}

impl EnvCache {
    /// Open (creating its directories) the cache under `config.root`. `installer` runs uv for
    /// installs: pass the [`snakebox_sandbox::Sandbox`] (sandboxed, the default for serving) or
    /// [`crate::DirectUvRunner`] (on the host). uv's settings are taken from this process's
    /// environment now, through the allow-list in [`crate::EnvVars`].
    ///
    /// # Errors
    ///
    /// [`EnvError::Io`] when a directory cannot be created.
    pub fn new(
        config: CacheConfig,
        uv: Uv,
        installer: impl IntoUvRunner,
    ) -> Result<EnvCache, EnvError> {
        Self::with_uv_environment(config, uv, installer, UvEnvironment::from_process())
    }

    /// Like [`EnvCache::new`], with uv's allow-listed settings given explicitly.
    ///
    /// # Errors
    ///
    /// [`EnvError::Io`] when a directory cannot be created.
    pub fn with_uv_environment(
        config: CacheConfig,
        uv: Uv,
        installer: impl IntoUvRunner,
        uv_env: UvEnvironment,
    ) -> Result<EnvCache, EnvError> {
        let cache = EnvCache {
            config,
            uv,
            installer: installer.into_uv_runner(),
            uv_env,
            install_timeout: DEFAULT_INSTALL_TIMEOUT,
            build_settings: BuildSettings::default(),
            locks: Mutex::default(),
            known: Mutex::default(),
            leases: Mutex::default(),
            defer_compile: std::sync::atomic::AtomicBool::new(false),
            compiles: Mutex::default(),
        };
        cache.migrate_layout();
        cache.prepare_dirs()?;
        snakebox_sandbox::EgressProxy::remove_stale();
        Ok(cache)
    }

    /// Set the time limit of each uv step of a build (default [`DEFAULT_INSTALL_TIMEOUT`]).
    #[must_use]
    pub fn with_install_timeout(mut self, timeout: Duration) -> Self {
        self.install_timeout = timeout;
        self
    }

    /// Set how package code (bytecode compilation, sdist builds) runs: the run limits it gets
    /// and whether sdists may be built at all (default: the engine's default limits, wheels
    /// only).
    #[must_use]
    pub fn with_build_settings(mut self, settings: BuildSettings) -> Self {
        self.build_settings = settings;
        self
    }

    /// The settings in force.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// uv's settings and the install network settings, as every build uses them.
    pub fn uv_environment(&self) -> &UvEnvironment {
        &self.uv_env
    }

    /// uv's cache directory (under the data root; never visible to runs).
    pub fn uv_cache_dir(&self) -> PathBuf {
        self.installs_dir().join(UV_CACHE_DIR)
    }

    /// The install pipeline for environments of `interpreter` (shared with sessions), its
    /// steps' sandboxes attached to `cpu` (see [`UvInvocation::cpu`]).
    fn pipeline<'a>(
        &'a self,
        interpreter: &'a Interpreter,
        cpu: Option<&CpuShare>,
    ) -> InstallPipeline<'a> {
        InstallPipeline {
            uv: &self.uv,
            uv_env: &self.uv_env,
            interpreter,
            uv_cache: self.uv_cache_dir(),
            timeout: self.install_timeout,
            cpu: cpu.cloned(),
        }
    }

    /// The directory holding uv's cache and the builds (the downloader's one writable mount).
    fn installs_dir(&self) -> PathBuf {
        self.config.root.join(INSTALLS_DIR)
    }

    /// Move uv's cache from where earlier versions kept it (`<root>/uv-cache`) and remove
    /// their abandoned builds (`<root>/.tmp`).
    fn migrate_layout(&self) {
        let old_cache = self.config.root.join(OLD_UV_CACHE_DIR);
        if old_cache.is_dir() && !self.uv_cache_dir().exists() {
            let moved = fs_err::create_dir_all(self.installs_dir())
                .and_then(|()| fs_err::rename(&old_cache, self.uv_cache_dir()));
            if let Err(err) = moved {
                tracing::warn!(error = %err, "could not move uv's cache into installs-v1; it is filled again");
            }
        }
        let old_tmp = self.config.root.join(OLD_TMP_DIR);
        if old_tmp.is_dir()
            && let Err(err) = snakebox_fs::tree::remove(&old_tmp)
        {
            tracing::warn!(error = %err, path = %old_tmp.display(), "could not remove old build directories");
        }
    }

    /// The cache's directories, made (again) where missing, with their owners and modes: at
    /// start, and before each build, so that a directory removed while the server runs (an
    /// operator clearing `uv-cache`) does not fail every later build until a restart.
    fn prepare_dirs(&self) -> Result<(), EnvError> {
        create_dir(&self.config.root, "create the data directory")?;
        for dir in [
            self.envs_dir(),
            self.used_dir(),
            self.installs_dir(),
            self.uv_cache_dir(),
            self.tmp_dir(),
            self.trash_dir(),
        ] {
            create_dir(&dir, "create the cache directory")?;
        }
        // Installs may run as their own unprivileged uid: it owns uv's cache (and each build
        // directory), nothing else of ours. (The whole tree is walked only when its top is
        // not theirs yet: a one-time migration, or a cache made again.)
        let cache_owner = fs_err::metadata(self.uv_cache_dir())
            .map(|meta| (meta.uid(), meta.gid()))
            .ok();
        if let Some(ids) = self
            .installer
            .writer_ids()
            .filter(|ids| cache_owner != Some(*ids))
        {
            set_owner_tree(&self.uv_cache_dir(), ids, true).map_err(|source| EnvError::Io {
                action: "give uv's cache to the installer uid",
                path: self.uv_cache_dir(),
                source,
            })?;
        }
        // Runs (possibly as an unprivileged uid) must traverse to the environments.
        add_mode(&self.envs_dir(), 0o555).map_err(|source| EnvError::Io {
            action: "make the environments directory readable",
            path: self.envs_dir(),
            source,
        })
    }

    fn envs_dir(&self) -> PathBuf {
        self.config.root.join(ENVIRONMENTS_DIR)
    }

    fn used_dir(&self) -> PathBuf {
        self.config.root.join(LAST_USED_DIR)
    }

    fn tmp_dir(&self) -> PathBuf {
        self.installs_dir().join(BUILDS_DIR)
    }

    fn trash_dir(&self) -> PathBuf {
        self.config.root.join(TRASH_DIR)
    }

    /// The cache key of an interpreter + requirement set under the current index settings.
    pub fn key(&self, interpreter: &Interpreter, requirements: &[Requirement]) -> String {
        self.key_of(interpreter, &RequirementSet::new(requirements))
    }

    fn key_of(&self, interpreter: &Interpreter, set: &RequirementSet) -> String {
        let mut hasher = Sha256::new();
        let mut field = |name: &str, value: &str| {
            hasher.update(name.as_bytes());
            hasher.update(b"=");
            hasher.update(value.as_bytes());
            hasher.update(b"\0");
        };
        field("layout", ENVIRONMENTS_DIR);
        field("interpreter", &interpreter.executable.to_string_lossy());
        field("version", &interpreter.version.to_string());
        for line in &set.lines {
            field("requirement", line);
        }
        for setting in self.uv_env.index_settings() {
            field("index", &setting);
        }
        let digest = hasher.finalize();
        digest
            .iter()
            .take(16)
            .map(|byte| format!("{byte:02x}"))
            .collect()
    }

    /// Build (or reuse) the environment for this interpreter and requirement set. Concurrent
    /// calls for the same key build once; the others wait and reuse the result.
    ///
    /// # Errors
    ///
    /// [`EnvError::InstallFailed`] with uv's message when the requirements cannot be installed,
    /// [`EnvError::Timeout`], [`EnvError::VenvFailed`], [`EnvError::Sandbox`], [`EnvError::Io`].
    pub async fn ensure(
        &self,
        interpreter: &Interpreter,
        requirements: &[Requirement],
    ) -> Result<Environment, EnvError> {
        self.ensure_weighed(interpreter, requirements, None).await
    }

    /// [`EnvCache::ensure`], a build's sandboxes attached to `cpu`: the CPU share of whoever
    /// the build works for (see [`UvInvocation::cpu`]; `None`: the default weight).
    ///
    /// # Errors
    ///
    /// As [`EnvCache::ensure`].
    pub async fn ensure_weighed(
        &self,
        interpreter: &Interpreter,
        requirements: &[Requirement],
        cpu: Option<&CpuShare>,
    ) -> Result<Environment, EnvError> {
        let set = RequirementSet::new(requirements);
        let key = self.key_of(interpreter, &set);
        let lock = self.key_lock(&key);
        let _building = lock.lock().await;

        let dir = self.envs_dir().join(&key);
        let existing = self.existing(&key, &dir).await;
        if let Some(manifest) = &existing {
            if self.is_fresh(manifest) && manifest.verified {
                self.touch(&key);
                return Ok(self.environment(dir, Arc::clone(manifest), interpreter, true));
            }
            if manifest.verified {
                tracing::info!(%key, "re-resolving an unpinned requirement set");
            } else {
                tracing::info!(%key, "rebuilding an environment built before environments were verified");
            }
        }
        install::check_requirement_urls(requirements, &self.uv_env).await?;
        let manifest = Arc::new(
            self.build(&key, &dir, interpreter, &set, existing.as_deref(), cpu)
                .await?,
        );
        self.remember(&key, Arc::clone(&manifest));
        self.touch(&key);
        Ok(self.environment(dir, manifest, interpreter, false))
    }

    /// Cache warming: exactly [`EnvCache::ensure`]. The engine calls it at start for the default
    /// interpreter (and any configured requirement sets) so the first call does not wait.
    ///
    /// # Errors
    ///
    /// As [`EnvCache::ensure`].
    pub async fn warm(
        &self,
        interpreter: &Interpreter,
        requirements: &[Requirement],
    ) -> Result<Environment, EnvError> {
        self.ensure(interpreter, requirements).await
    }

    fn key_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(locks.entry(key.to_owned()).or_default())
    }

    fn remember(&self, key: &str, manifest: Arc<Manifest>) {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.to_owned(), manifest);
    }

    fn forget(&self, key: &str) {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }

    /// The manifest of the environment under `key`, when there is a usable one.
    async fn existing(&self, key: &str, dir: &Path) -> Option<Arc<Manifest>> {
        let cached = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned();
        if let Some(manifest) = cached {
            if dir.join("pyvenv.cfg").exists() {
                return Some(manifest);
            }
            self.forget(key);
            return None;
        }
        let manifest = read_manifest(dir).await?;
        if manifest.key != key || manifest.schema != MANIFEST_SCHEMA {
            tracing::warn!(%key, "ignoring an environment whose manifest does not match its key");
            return None;
        }
        let manifest = Arc::new(manifest);
        self.remember(key, Arc::clone(&manifest));
        Some(manifest)
    }

    fn is_fresh(&self, manifest: &Manifest) -> bool {
        manifest.pinned
            || now_secs().saturating_sub(manifest.created_at)
                < self.config.unpinned_freshness.as_secs()
    }

    fn environment(
        &self,
        root: PathBuf,
        manifest: Arc<Manifest>,
        interpreter: &Interpreter,
        reused: bool,
    ) -> Environment {
        let lease = {
            let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
            leases.retain(|_, lease| lease.strong_count() > 0);
            match leases.get(&manifest.build_id).and_then(Weak::upgrade) {
                Some(lease) => lease,
                None => {
                    let lease = Arc::new(Lease {
                        build_id: manifest.build_id.clone(),
                    });
                    leases.insert(manifest.build_id.clone(), Arc::downgrade(&lease));
                    lease
                }
            }
        };
        Environment {
            python: root.join("bin").join("python"),
            root,
            interpreter: interpreter.clone(),
            packages: manifest.packages.clone(),
            reused,
            key: manifest.key.clone(),
            requirements: manifest.requirements.clone(),
            compiled: manifest.compiled,
            lease,
        }
    }

    fn in_use(&self, build_id: &str) -> bool {
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(build_id)
            .is_some_and(|lease| lease.strong_count() > 0)
    }

    /// Record that the environment under `key` was handed out now (for LRU pruning).
    fn touch(&self, key: &str) {
        let path = self.used_dir().join(key);
        let result = fs_err::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .and_then(|file| file.file().set_modified(SystemTime::now()));
        if let Err(err) = result {
            tracing::warn!(error = %err, "could not record the last use of an environment");
        }
    }

    fn last_used(&self, key: &str, manifest: Option<&Manifest>) -> u64 {
        fs_err::metadata(self.used_dir().join(key))
            .ok()
            .and_then(|meta| meta.modified().ok())
            .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
            .map(|time| time.as_secs())
            .or(manifest.map(|m| m.created_at))
            .unwrap_or(0)
    }

    /// Build in `installs-v1/builds`, verify, then rename into place (replacing `previous`
    /// atomically if any). A build that fails, for lack of space included, leaves nothing
    /// behind: its directory is removed, and a later call builds afresh.
    async fn build(
        &self,
        key: &str,
        dir: &Path,
        interpreter: &Interpreter,
        set: &RequirementSet,
        previous: Option<&Manifest>,
        cpu: Option<&CpuShare>,
    ) -> Result<Manifest, EnvError> {
        let made = self.prepare_dirs().and_then(|()| {
            tempfile::Builder::new()
                .prefix("build-")
                .tempdir_in(self.tmp_dir())
                .map_err(|source| EnvError::Io {
                    action: "create a build directory in",
                    path: self.tmp_dir(),
                    source,
                })
        });
        let build = match made {
            Ok(dir) => BuildDir(dir.keep()),
            Err(err) => return Err(self.classify_failure(err, set)),
        };
        let result = self
            .build_in(&build.0, key, dir, interpreter, set, previous, cpu)
            .await;
        // Judged before the build directory is removed (that frees the space it took).
        let result = match result {
            Ok(manifest) => Ok(manifest),
            Err(err) => {
                let err = self.classify_failure(err, set);
                Err(self.clean_damaged(err, &build.0, interpreter, cpu).await)
            }
        };
        drop(build);
        result
    }

    /// A failed build's error, told as a lack of space when it was one: uv or the compiler
    /// said so, or (for failures that can be a silent short write) the data directory's file
    /// system is nearly full.
    fn classify_failure(&self, err: EnvError, set: &RequirementSet) -> EnvError {
        if matches!(err, EnvError::NoSpace { .. }) {
            return err;
        }
        let mut text = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            text.push('\n');
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        let silent_kind = matches!(
            err,
            EnvError::Incomplete { .. } | EnvError::Io { .. } | EnvError::VenvFailed { .. }
        );
        let available = crate::space::available_bytes(&self.tmp_dir());
        let low = available.is_some_and(|bytes| bytes < crate::space::LOW_SPACE_BYTES);
        if crate::space::says_no_space(&text) || (silent_kind && low) {
            return EnvError::NoSpace {
                step: format!("build the environment for `{}`", set.lines.join(", ")),
                path: self.config.root.clone(),
                available,
                source: UvStderr(text),
            };
        }
        err
    }

    /// After a verification failure (not for lack of space): remove uv's cached copies of the
    /// distributions whose installed files were damaged, so that the next build downloads
    /// them again instead of linking the same damaged files.
    async fn clean_damaged(
        &self,
        err: EnvError,
        build_dir: &Path,
        interpreter: &Interpreter,
        cpu: Option<&CpuShare>,
    ) -> EnvError {
        let EnvError::Incomplete {
            requirements,
            problems,
            packages,
            cache_cleaned: false,
        } = err
        else {
            return err;
        };
        let mut cache_cleaned = false;
        if !packages.is_empty() {
            let args = InstallPipeline::cache_clean_args(&packages);
            match self
                .run_uv("uv cache clean", args, build_dir, interpreter, false, cpu)
                .await
            {
                Ok(output) if output.success() => cache_cleaned = true,
                Ok(output) => tracing::warn!(
                    stderr = %String::from_utf8_lossy(&output.stderr),
                    "could not remove damaged packages from uv's cache"
                ),
                Err(err) => {
                    tracing::warn!(error = %err, "could not remove damaged packages from uv's cache");
                }
            }
        }
        EnvError::Incomplete {
            requirements,
            problems,
            packages,
            cache_cleaned,
        }
    }

    /// [`EnvCache::build`]'s steps, in `build_dir` (removed by the caller).
    #[allow(clippy::too_many_arguments)] // build's own arguments, and where it builds
    async fn build_in(
        &self,
        build_dir: &Path,
        key: &str,
        dir: &Path,
        interpreter: &Interpreter,
        set: &RequirementSet,
        previous: Option<&Manifest>,
        cpu: Option<&CpuShare>,
    ) -> Result<Manifest, EnvError> {
        let started = std::time::Instant::now();
        // Milliseconds of the download, compile and verify steps (for the log).
        let mut steps = [0_u128; 3];
        let build_dir = build_dir.to_path_buf();
        let build_id = build_dir.file_name().map_or_else(
            || key.to_owned(),
            |name| name.to_string_lossy().into_owned(),
        );
        let env_dir = build_dir.join("env");
        if let Some(ids) = self.installer.writer_ids() {
            set_owner_tree(&build_dir, ids, false).map_err(|source| EnvError::Io {
                action: "give the build directory to the installer uid",
                path: build_dir.clone(),
                source,
            })?;
        }

        // 1. The bare venv. `--relocatable` because it is renamed after it is built.
        let venv = self
            .run_uv(
                "uv venv",
                self.pipeline(interpreter, None).venv_args(&env_dir, true),
                &build_dir,
                interpreter,
                false,
                cpu,
            )
            .await?;
        if !venv.success() {
            return Err(EnvError::VenvFailed {
                path: env_dir,
                source: UvStderr::from_output(&venv.stderr),
            });
        }

        // 2. The requirements. Downloaded as wheels by trusted uv (no package code runs), then
        //    byte-compiled (package code: sandboxed as a run) because the environment is
        //    read-only when code runs. See the `install` module.
        let mut packages = Vec::new();
        let mut compiled = true;
        if !set.lines.is_empty() {
            let requirements_file = build_dir.join("requirements.txt");
            let mut text = set.lines.join("\n");
            text.push('\n');
            fs_err::tokio::write(&requirements_file, text)
                .await
                .map_err(|source| EnvError::Io {
                    action: "write the requirements file",
                    path: requirements_file.clone(),
                    source,
                })?;
            let python = venv_python(&env_dir);
            let package_identity = self.installer.package_identity();
            // Hard links share inodes with uv's cache: only safe when package code runs as
            // another uid than the files' owner. Without uid switching, copy.
            let link_mode = if package_identity.host_ids.is_some() {
                "hardlink"
            } else {
                "copy"
            };
            let step = std::time::Instant::now();
            let download_args = || {
                self.pipeline(interpreter, None).download_args(
                    DownloadTarget::FreshVenv(&python),
                    link_mode,
                    requirements_file_args(&requirements_file),
                )
            };
            // A pinned set is first installed from uv's cache alone, without the network:
            // its versions are fixed (and its environment, once built, is kept for good), so
            // what uv cached earlier serves as well as the index would, and the round trips
            // that revalidate every index page and wheel (most of the install's time when
            // everything is cached) are not paid. What the cache cannot satisfy goes online.
            let mut download = None;
            if set.pinned {
                let mut args = download_args();
                args.push("--offline".into());
                let offline = self
                    .run_uv(
                        "uv pip install --offline",
                        args,
                        &build_dir,
                        interpreter,
                        false,
                        cpu,
                    )
                    .await?;
                if offline.success() {
                    download = Some(offline);
                } else {
                    tracing::debug!(%key, "not all in uv's cache; installing online");
                }
            }
            let download = match download {
                Some(download) => download,
                None => {
                    self.run_uv(
                        "uv pip install",
                        download_args(),
                        &build_dir,
                        interpreter,
                        true,
                        cpu,
                    )
                    .await?
                }
            };
            if download.success() {
                steps[0] = step.elapsed().as_millis();
                if self.defers_compilation() {
                    // Compiled later, on a copy, off the first run's path (`complete`).
                    compiled = false;
                } else {
                    let step = std::time::Instant::now();
                    self.compile(&env_dir, &package_identity, interpreter, set, cpu)
                        .await?;
                    steps[1] = step.elapsed().as_millis();
                }
            } else if install::is_missing_wheel(&download.stderr) {
                if !self.build_settings.allow_sdist_builds {
                    return Err(EnvError::SdistBuildsDisabled {
                        requirements: set.lines.join(", "),
                        packages: install::packages_without_wheels(&download.stderr),
                        source: UvStderr::from_output(&download.stderr),
                    });
                }
                self.build_from_source(
                    &env_dir,
                    &requirements_file,
                    &package_identity,
                    interpreter,
                    set,
                    cpu,
                )
                .await?;
            } else {
                return Err(EnvError::InstallFailed {
                    requirements: set.lines.join(", "),
                    source: UvStderr::from_output(&download.stderr),
                });
            }
            packages = install::installed_packages(&env_dir);
        }

        // 3-4. Ours again, readable, measured, and verified against every RECORD.
        let step = std::time::Instant::now();
        let size_bytes = self.seal(&env_dir, set).await?;
        steps[2] = step.elapsed().as_millis();

        // 5. The manifest, written before the environment becomes visible.
        let manifest = Manifest {
            schema: MANIFEST_SCHEMA,
            key: key.to_owned(),
            build_id: build_id.clone(),
            requirements: set.lines.clone(),
            pinned: set.pinned,
            packages,
            interpreter: ManifestInterpreter {
                executable: interpreter.executable.clone(),
                version: interpreter.version.to_string(),
                prefix: interpreter.prefix.clone(),
                implementation: interpreter.implementation.clone(),
            },
            // Runs can read the manifest: never a credential in it.
            index_settings: self.uv_env.index_settings_redacted(),
            uv_version: self.uv.version.clone(),
            created_at: now_secs(),
            size_bytes,
            verified: true,
            compiled,
        };
        write_manifest(&env_dir, &manifest).await?;

        // 6. Into place, atomically.
        if !self.place(&env_dir, dir, previous)? {
            // Another process sharing this data root placed the same key first: use theirs.
            if let Some(theirs) = read_manifest(dir).await.filter(|m| m.key == key) {
                return Ok(theirs);
            }
            return Err(EnvError::Io {
                action: "read the environment another process built at",
                path: dir.to_path_buf(),
                source: std::io::Error::other("missing or unreadable manifest"),
            });
        }
        tracing::info!(%key, requirements = ?set.lines, elapsed_ms = started.elapsed().as_millis(), download_ms = steps[0], compile_ms = steps[1], verify_ms = steps[2], compiled, "built environment");
        Ok(manifest)
    }

    /// Publish new environments before they are byte-compiled (`true`), leaving their
    /// compilation to [`EnvCache::complete`], which the caller runs off the hot path for each
    /// environment [`EnvCache::take_for_compilation`] hands it. Off (the default), a build
    /// compiles before it publishes, as a one-shot command needs.
    pub fn defer_compilation(&self, defer: bool) {
        self.defer_compile
            .store(defer, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether new environments are published before they are compiled.
    pub fn defers_compilation(&self) -> bool {
        self.defer_compile
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `env` still needs compiling and nobody has taken it up in this process yet; if
    /// so it is now taken (counted as pending): call [`EnvCache::complete`] for it once.
    pub fn take_for_compilation(&self, env: &Environment) -> bool {
        if env.compiled {
            return false;
        }
        let mut book = self.compiles.lock().unwrap_or_else(PoisonError::into_inner);
        let taken = book.taken.insert(env.key.clone());
        if taken {
            book.stats.pending += 1;
        }
        taken
    }

    /// What became of background compilation so far.
    pub fn compile_stats(&self) -> CompileStats {
        self.compiles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stats
            .clone()
    }

    /// Byte-compile the environment published under `key` without its bytecode, off the hot
    /// path: a copy of it is made in a build directory (new directories, every file a hard
    /// link to the same, never-written inode), compiled there as package code in a run's
    /// sandbox exactly as a build compiles (which loads every `.pyc` it wrote), taken back,
    /// checked against every `RECORD` again, and published in the environment's place in one
    /// step (`RENAME_EXCHANGE`) with a manifest saying `compiled`. Runs never see the copy
    /// (they mount the published environment, read-only, and keep the one they mounted), so
    /// nothing a run does can end up in it. Returns whether a compiled copy was published
    /// (`false`: nothing to do, or the environment was replaced or removed meanwhile).
    ///
    /// `before_publish` is given the checked copy's directory just before it takes the
    /// environment's place (what it starts from the copy, a fork server say, is ready when
    /// runs see the copy); what it returns is handed to `after_publish` right after a publish,
    /// before the compilation is counted as completed ([`EnvCache::compile_stats`]): whoever
    /// sees the count sees what `after_publish` did (the fork servers of the copy in place).
    ///
    /// # Errors
    /// When the copy fails its checks or a step fails; the copy is then discarded and the
    /// published environment stays as it was (verified, not compiled).
    pub async fn complete<T, F, Fut>(
        &self,
        interpreter: &Interpreter,
        key: &str,
        before_publish: F,
        after_publish: impl FnOnce(T),
    ) -> Result<bool, EnvError>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let result = self
            .complete_copy(interpreter, key, before_publish)
            .await
            .map(|published| published.map(after_publish).is_some());
        let mut book = self.compiles.lock().unwrap_or_else(PoisonError::into_inner);
        book.stats.pending = book.stats.pending.saturating_sub(1);
        match &result {
            Ok(true) => book.stats.completed += 1,
            Ok(false) => {}
            Err(err) => {
                book.stats.failed += 1;
                book.stats.last_failure = Some(err.to_string());
            }
        }
        result
    }

    async fn complete_copy<T, F, Fut>(
        &self,
        interpreter: &Interpreter,
        key: &str,
        before_publish: F,
    ) -> Result<Option<T>, EnvError>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let started = std::time::Instant::now();
        let dir = self.envs_dir().join(key);
        let Some(published) = self.existing(key, &dir).await else {
            return Ok(None);
        };
        if published.compiled || !published.verified {
            return Ok(None);
        }
        self.prepare_dirs()?;
        let build = tempfile::Builder::new()
            .prefix("build-")
            .tempdir_in(self.tmp_dir())
            .map(|dir| BuildDir(dir.keep()))
            .map_err(io("create a build directory in", &self.tmp_dir()))?;
        let set = RequirementSet {
            lines: published.requirements.clone(),
            pinned: published.pinned,
        };
        let result = match self
            .compile_copy_in(&build.0, interpreter, &dir, &published, &set)
            .await
        {
            Ok(Some((copy, manifest))) => {
                let prepared = before_publish(copy.clone()).await;
                self.publish_copy(key, &dir, &published, &copy, manifest)
                    .await
                    .map(|placed| placed.then_some(prepared))
            }
            Ok(None) => Ok(None),
            Err(err) => Err(err),
        };
        if result.as_ref().is_ok_and(Option::is_some) {
            tracing::info!(%key, elapsed_ms = started.elapsed().as_millis(), "compiled environment published");
        }
        // Judged before the copy is removed (that frees the space it took).
        let result = result.map_err(|err| self.classify_failure(err, &set));
        drop(build);
        result
    }

    /// [`EnvCache::complete`]'s steps up to a sealed copy in `build_dir` (removed by the
    /// caller): the copy's directory and its manifest, or `None` when the environment
    /// changed meanwhile.
    async fn compile_copy_in(
        &self,
        build_dir: &Path,
        interpreter: &Interpreter,
        dir: &Path,
        published: &Arc<Manifest>,
        set: &RequirementSet,
    ) -> Result<Option<(PathBuf, Manifest)>, EnvError> {
        let env_dir = build_dir.join("env");
        let (from, to) = (dir.to_path_buf(), env_dir.clone());
        tokio::task::spawn_blocking(move || link_tree(&from, &to))
            .await
            .map_err(|err| {
                io("copy the environment for compiling to", &env_dir)(std::io::Error::other(err))
            })?
            .map_err(io("copy the environment for compiling to", &env_dir))?;
        // The copy is of the environment read above (not of one placed since).
        if read_manifest(&env_dir)
            .await
            .is_none_or(|copied| copied.build_id != published.build_id)
        {
            return Ok(None);
        }
        let identity = self.installer.package_identity();
        // The server's own work (deferred compilation): the default weight.
        self.compile(&env_dir, &identity, interpreter, set, None)
            .await?;
        let size_bytes = self.seal(&env_dir, set).await?;
        let manifest = Manifest {
            build_id: build_dir.file_name().map_or_else(
                || format!("{}-compiled", published.build_id),
                |name| name.to_string_lossy().into_owned(),
            ),
            size_bytes,
            compiled: true,
            ..(**published).clone()
        };
        write_manifest(&env_dir, &manifest).await?;
        Ok(Some((env_dir, manifest)))
    }

    /// The last of [`EnvCache::complete`]'s steps: the sealed `copy` in the place of the
    /// environment it was made from, unless that was replaced meanwhile (`false`).
    async fn publish_copy(
        &self,
        key: &str,
        dir: &Path,
        published: &Arc<Manifest>,
        copy: &Path,
        manifest: Manifest,
    ) -> Result<bool, EnvError> {
        let lock = self.key_lock(key);
        let _placing = lock.lock().await;
        let current = self.existing(key, dir).await;
        if current.is_none_or(|current| current.build_id != published.build_id) {
            return Ok(false);
        }
        if !self.place(copy, dir, Some(published))? {
            return Ok(false);
        }
        self.remember(key, Arc::new(manifest));
        Ok(true)
    }

    /// Steps 3 and 4 of a build (and of a compiled copy): the environment ours again (neither
    /// the installer uid nor package code may change it from now on), readable by any uid (the
    /// run sandbox may not be root), measured; then every installed file checked against its
    /// distribution's `RECORD` (host code reading files, executing nothing; compiled files
    /// were checked in the compile step). A damaged environment is never published.
    async fn seal(&self, env_dir: &Path, set: &RequirementSet) -> Result<u64, EnvError> {
        let walk_dir = env_dir.to_path_buf();
        let installer_ids = self.installer.writer_ids();
        let reclaim = installer_ids.map(|_| {
            (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            )
        });
        let size_bytes = tokio::task::spawn_blocking(move || {
            if let Some(ids) = reclaim {
                set_owner_tree_filtered(&walk_dir, ids, true, installer_ids)?;
            }
            make_readable_and_measure(&walk_dir)
        })
        .await
        .map_err(|err| EnvError::Io {
            action: "walk the new environment",
            path: env_dir.to_path_buf(),
            source: std::io::Error::other(err),
        })?
        .map_err(|source| EnvError::Io {
            action: "make the environment readable",
            path: env_dir.to_path_buf(),
            source,
        })?;
        let mismatches = InstallPipeline::verify(env_dir).await?;
        if !mismatches.is_empty() {
            return Err(EnvError::Incomplete {
                requirements: set.lines.join(", "),
                problems: mismatches.iter().map(ToString::to_string).collect(),
                packages: InstallPipeline::damaged_distributions(&mismatches),
                cache_cleaned: false,
            });
        }
        Ok(size_bytes)
    }

    /// Rename the finished build to `dir`. With a `previous` environment there, swap the two in
    /// one step and move the old one to the trash (deleted now unless in use, else by `prune`).
    ///
    /// Returns `false` when another process placed an environment under the key in the
    /// meantime (ours is then left in the build directory, to be deleted with it).
    fn place(
        &self,
        built: &Path,
        dir: &Path,
        previous: Option<&Manifest>,
    ) -> Result<bool, EnvError> {
        if !dir.exists() {
            return match fs_err::rename(built, dir) {
                Ok(()) => Ok(true),
                Err(_) if previous.is_none() && dir.join(MANIFEST_FILE).exists() => Ok(false),
                Err(source) => Err(io("move the new environment into", dir)(source)),
            };
        }
        let exchanged = nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            built,
            nix::fcntl::AT_FDCWD,
            dir,
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        );
        let old_id = previous.map_or_else(|| "unknown".to_owned(), |m| m.build_id.clone());
        let trash = self.trash_dir().join(format!("{old_id}-{}", now_nanos()));
        if exchanged.is_ok() {
            fs_err::rename(built, &trash)
                .map_err(io("move the replaced environment to", &trash))?;
        } else {
            // No RENAME_EXCHANGE on this file system: two renames, with a short gap.
            fs_err::rename(dir, &trash).map_err(io("move the replaced environment to", &trash))?;
            fs_err::rename(built, dir).map_err(io("move the new environment into", dir))?;
        }
        if !self.in_use(&old_id)
            && let Err(err) = snakebox_fs::tree::remove(&trash)
        {
            tracing::warn!(error = %err, "could not delete a replaced environment; prune will retry");
        }
        Ok(true)
    }

    async fn run_uv(
        &self,
        label: &str,
        args: Vec<OsString>,
        build_dir: &Path,
        interpreter: &Interpreter,
        network: bool,
        cpu: Option<&CpuShare>,
    ) -> Result<crate::uv::UvOutput, EnvError> {
        // One mount holding the build directory and uv's cache, so that uv can hard-link
        // (`installs-v1`: nothing else is in it).
        let step = self
            .pipeline(interpreter, cpu)
            .downloader(
                label,
                args,
                build_dir,
                vec![self.installs_dir()],
                network,
                self.installer.is_sandboxed(),
            )
            .map_err(io("start the egress proxy in", &std::env::temp_dir()))?;
        let mut output = self.installer.run(&step.invocation).await;
        if let Ok(output) = &mut output {
            let _refused = step.explain_refusals(output);
        }
        output
    }

    /// Byte-compile the environment's packages. This runs package code (the interpreter
    /// processes the environment's `.pth` files), so it runs as a run: `identity`, the run
    /// limits, no network, no credentials, uv's cache not mounted, the environment's files not
    /// writable (only new `__pycache__` entries can be made). A package that fails to compile
    /// is not an error (as with pip); a limit or the time limit is.
    async fn compile(
        &self,
        env_dir: &Path,
        identity: &PackageIdentity,
        interpreter: &Interpreter,
        set: &RequirementSet,
        cpu: Option<&CpuShare>,
    ) -> Result<(), EnvError> {
        let Some(output) = self
            .pipeline(interpreter, cpu)
            .compile(
                self.installer.as_ref(),
                env_dir,
                identity,
                self.build_settings.limits.clone(),
                None,
            )
            .await?
        else {
            return Ok(());
        };
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.success() && crate::space::says_no_space(&stderr) {
            return Err(EnvError::NoSpace {
                step: format!("compile the environment for `{}`", set.lines.join(", ")),
                path: self.config.root.clone(),
                available: crate::space::available_bytes(env_dir),
                source: UvStderr::from_output(&output.stderr),
            });
        }
        if output.exit_code == Some(crate::verify::DAMAGED_PYC_EXIT) {
            return Err(EnvError::Incomplete {
                requirements: set.lines.join(", "),
                problems: crate::verify::damaged_pycs(&stderr),
                packages: Vec::new(),
                cache_cleaned: false,
            });
        }
        if !output.success() {
            tracing::warn!(
                exit_code = ?output.exit_code,
                stderr = %stderr,
                "some files of the environment did not compile"
            );
        }
        Ok(())
    }

    /// Build the requirement set from source: the whole `uv pip install` runs as package code
    /// (see [`EnvCache::compile`]), offline, with a private uv cache in its scratch, local
    /// find-links directories as its only source, into a fresh venv.
    async fn build_from_source(
        &self,
        env_dir: &Path,
        requirements_file: &Path,
        identity: &PackageIdentity,
        interpreter: &Interpreter,
        set: &RequirementSet,
        cpu: Option<&CpuShare>,
    ) -> Result<(), EnvError> {
        let find_links = install::local_find_links(&self.uv_env.index_urls());
        if let Some(ids) = identity.host_ids {
            let walk_dir = env_dir.to_path_buf();
            tokio::task::spawn_blocking(move || set_owner_tree(&walk_dir, ids, true))
                .await
                .map_err(|err| {
                    io("give the environment to the build", env_dir)(std::io::Error::other(err))
                })?
                .map_err(io("give the environment to the build", env_dir))?;
        }
        let mut read_only = find_links.clone();
        read_only.push(requirements_file.to_path_buf());
        let invocation = self.pipeline(interpreter, cpu).package_code(
            "build from source (runs the packages' build code)",
            self.uv.path.clone(),
            install::build_args(
                venv_python(env_dir).as_os_str(),
                requirements_file,
                &find_links,
            ),
            env_dir,
            read_only,
            identity.identity,
            self.build_settings.limits.clone(),
        );
        let invocation = UvInvocation {
            env: install::build_env(),
            ..invocation
        };
        let output = self.installer.run(&invocation).await?;
        if !output.success() {
            return Err(EnvError::BuildFailed {
                requirements: set.lines.join(", "),
                source: UvStderr::from_output(&output.stderr),
            });
        }
        Ok(())
    }

    /// Counts and sizes of the cached environments.
    pub fn stats(&self) -> CacheStats {
        let entries = self.list_entries();
        CacheStats {
            root: self.config.root.clone(),
            environments: entries.len(),
            bytes: entries.iter().map(|e| e.bytes).sum(),
            uv_cache_dir: self.uv_cache_dir(),
            installs_sandboxed: self.installer.is_sandboxed(),
        }
    }

    fn list_entries(&self) -> Vec<Entry> {
        let Ok(dir) = fs_err::read_dir(self.envs_dir()) else {
            return Vec::new();
        };
        dir.filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
            .map(|entry| {
                let key = entry.file_name().to_string_lossy().into_owned();
                let manifest = fs_err::read(entry.path().join(MANIFEST_FILE))
                    .ok()
                    .and_then(|bytes| serde_json::from_slice::<Manifest>(&bytes).ok());
                Entry {
                    last_used: self.last_used(&key, manifest.as_ref()),
                    bytes: manifest.as_ref().map_or(0, |m| m.size_bytes),
                    build_id: manifest.map(|m| m.build_id),
                    path: entry.path(),
                    key,
                }
            })
            .collect()
    }

    /// Delete environments unused for longer than [`CacheConfig::max_age`], then the least
    /// recently used until the total is at most [`CacheConfig::max_bytes`]. Never one in use or
    /// being built. Also clears leftovers of interrupted builds and replaced environments.
    ///
    /// # Errors
    ///
    /// [`EnvError::Io`] when an environment cannot be moved out of place.
    pub async fn prune(&self) -> Result<PruneReport, EnvError> {
        let mut entries = self.list_entries();
        entries.sort_by_key(|e| e.last_used);
        let now = now_secs();
        let mut report = PruneReport {
            bytes_before: entries.iter().map(|e| e.bytes).sum(),
            ..PruneReport::default()
        };
        let mut total = report.bytes_before;
        let mut kept = Vec::new();

        for entry in entries {
            let reason = if entry.build_id.is_none() {
                Some(PruneReason::Unreadable)
            } else if now.saturating_sub(entry.last_used) > self.config.max_age.as_secs() {
                Some(PruneReason::Age)
            } else {
                None
            };
            match reason {
                Some(reason) => {
                    if self.remove(&entry).await? {
                        total = total.saturating_sub(entry.bytes);
                        report.removed.push(PrunedEnvironment {
                            key: entry.key,
                            bytes: entry.bytes,
                            reason,
                        });
                    } else {
                        report.skipped_in_use += 1;
                        kept.push(entry);
                    }
                }
                None => kept.push(entry),
            }
        }
        let mut left = Vec::new();
        for entry in kept {
            if total > self.config.max_bytes {
                if self.remove(&entry).await? {
                    total = total.saturating_sub(entry.bytes);
                    report.removed.push(PrunedEnvironment {
                        key: entry.key,
                        bytes: entry.bytes,
                        reason: PruneReason::Size,
                    });
                    continue;
                }
                report.skipped_in_use += 1;
            }
            left.push(entry);
        }
        report.kept = left.len();
        report.bytes_after = total;
        self.clear_leftovers().await;
        Ok(report)
    }

    fn is_leased(&self, entry: &Entry) -> bool {
        entry.build_id.as_deref().is_some_and(|id| self.in_use(id))
    }

    /// Move one environment out of place and delete it, unless it is in use or being built.
    async fn remove(&self, entry: &Entry) -> Result<bool, EnvError> {
        let lock = self.key_lock(&entry.key);
        let Ok(_guard) = lock.try_lock() else {
            return Ok(false);
        };
        if self.is_leased(entry) {
            return Ok(false);
        }
        let trash = self.trash_dir().join(format!(
            "{}-{}",
            entry.build_id.as_deref().unwrap_or("unreadable"),
            now_nanos()
        ));
        fs_err::rename(&entry.path, &trash).map_err(|source| EnvError::Io {
            action: "move a pruned environment to",
            path: trash.clone(),
            source,
        })?;
        self.forget(&entry.key);
        let _ = fs_err::remove_file(self.used_dir().join(&entry.key));
        delete_tree(trash).await;
        Ok(true)
    }

    /// Delete replaced environments no longer in use, and builds abandoned long ago.
    async fn clear_leftovers(&self) {
        if let Ok(dir) = fs_err::read_dir(self.trash_dir()) {
            for entry in dir.filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                let build_id = name.rsplit_once('-').map_or(name.as_str(), |(id, _)| id);
                if !self.in_use(build_id) {
                    delete_tree(entry.path()).await;
                }
            }
        }
        let abandoned_after = (self.install_timeout * 4).max(Duration::from_secs(3600));
        if let Ok(dir) = fs_err::read_dir(self.tmp_dir()) {
            for entry in dir.filter_map(Result::ok) {
                let old = entry
                    .metadata()
                    .ok()
                    .and_then(|meta| meta.modified().ok())
                    .and_then(|time| time.elapsed().ok())
                    .is_some_and(|age| age > abandoned_after);
                if old {
                    delete_tree(entry.path()).await;
                }
            }
        }
    }
}

/// One environment directory, as seen by `stats` and `prune`.
struct Entry {
    key: String,
    path: PathBuf,
    build_id: Option<String>,
    bytes: u64,
    last_used: u64,
}

async fn read_manifest(dir: &Path) -> Option<Manifest> {
    let bytes = fs_err::tokio::read(dir.join(MANIFEST_FILE)).await.ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(manifest) => Some(manifest),
        Err(err) => {
            tracing::warn!(error = %err, dir = %dir.display(), "unreadable environment manifest");
            None
        }
    }
}

/// A build directory, removed when dropped. Package code ran in it (bytecode compilation,
/// builds), so it may hold any tree: it is removed without recursion and without following
/// links ([`snakebox_fs::tree::remove`]), never by `remove_dir_all`.
struct BuildDir(PathBuf);

impl Drop for BuildDir {
    fn drop(&mut self) {
        if let Err(err) = snakebox_fs::tree::remove(&self.0) {
            tracing::warn!(error = %err, path = %self.0.display(), "could not delete a build directory; the next start retries");
        }
    }
}

async fn delete_tree(path: PathBuf) {
    let result = tokio::task::spawn_blocking(move || snakebox_fs::tree::remove(&path)).await;
    if let Ok(Err(err)) = result {
        tracing::warn!(error = %err, "could not delete a cache directory");
    }
}

/// An [`EnvError::Io`] maker for `map_err`.
fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> EnvError + use<> {
    let path = path.to_path_buf();
    move |source| EnvError::Io {
        action,
        path,
        source,
    }
}

fn create_dir(path: &Path, action: &'static str) -> Result<(), EnvError> {
    fs_err::create_dir_all(path).map_err(|source| EnvError::Io {
        action,
        path: path.to_path_buf(),
        source,
    })
}

/// `chown` `root` (and, when `recursive`, everything under it, without following symlinks) to
/// `ids`, skipping what already belongs to them.
fn set_owner_tree(root: &Path, ids: (u32, u32), recursive: bool) -> std::io::Result<()> {
    set_owner_tree_filtered(root, ids, recursive, None)
}

/// [`set_owner_tree`]; regular files with more than one link that belong to `shared_owner`
/// (an environment's hard links into uv's cache, owned by the installer) keep their owner, so
/// that uv can go on linking them (`fs.protected_hardlinks`); they are never writable by
/// anyone else.
fn set_owner_tree_filtered(
    root: &Path,
    (uid, gid): (u32, u32),
    recursive: bool,
    shared_owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = fs_err::symlink_metadata(&path)?;
        let shared = meta.is_file()
            && meta.nlink() > 1
            && shared_owner.is_some_and(|(u, g)| meta.uid() == u && meta.gid() == g);
        if !shared && (meta.uid() != uid || meta.gid() != gid) {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
        }
        if recursive && meta.is_dir() {
            for entry in fs_err::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(())
}

/// Write `manifest` into `env_dir` (world-readable). A file already there is replaced, never
/// written through: in a copy made for compiling it is a hard link to the published manifest.
async fn write_manifest(env_dir: &Path, manifest: &Manifest) -> Result<(), EnvError> {
    let manifest_path = env_dir.join(MANIFEST_FILE);
    let json = serde_json::to_vec_pretty(manifest).map_err(|source| EnvError::UvOutput {
        command: "serialize the manifest".to_owned(),
        source,
    })?;
    match fs_err::tokio::remove_file(&manifest_path).await {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            return Err(io("replace the environment manifest", &manifest_path)(err));
        }
        _ => {}
    }
    fs_err::tokio::write(&manifest_path, json)
        .await
        .map_err(|source| EnvError::Io {
            action: "write the environment manifest",
            path: manifest_path.clone(),
            source,
        })?;
    add_mode(&manifest_path, 0o444).map_err(|source| EnvError::Io {
        action: "make the manifest readable",
        path: manifest_path,
        source,
    })
}

/// Make `to` (which must not exist) a copy of the tree at `from` that shares its files:
/// directories made anew with the same modes, regular files hard-linked (the same inodes,
/// which nothing here writes), symbolic links copied, nothing else. `from` is a published
/// environment: ours, not writable by anyone else.
fn link_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut stack = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((source, target)) = stack.pop() {
        let meta = fs_err::symlink_metadata(&source)?;
        let kind = meta.file_type();
        if kind.is_dir() {
            fs_err::create_dir(&target)?;
            fs_err::set_permissions(
                &target,
                std::fs::Permissions::from_mode(meta.permissions().mode() & 0o777),
            )?;
            for entry in fs_err::read_dir(&source)? {
                let entry = entry?;
                stack.push((entry.path(), target.join(entry.file_name())));
            }
        } else if kind.is_file() {
            fs_err::hard_link(&source, &target)?;
        } else if kind.is_symlink() {
            fs_err::os::unix::fs::symlink(fs_err::read_link(&source)?, &target)?;
        }
    }
    Ok(())
}

/// `chmod a+<bits>` on one path.
fn add_mode(path: &Path, bits: u32) -> std::io::Result<()> {
    let meta = fs_err::metadata(path)?;
    let mode = meta.permissions().mode();
    if mode & bits != bits {
        fs_err::set_permissions(path, std::fs::Permissions::from_mode(mode | bits))?;
    }
    Ok(())
}

/// `chmod -R a+rX` (without following symlinks), returning the disk usage in bytes (each inode
/// counted once).
fn make_readable_and_measure(root: &Path) -> std::io::Result<u64> {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0_u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = fs_err::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        if seen.insert((meta.dev(), meta.ino())) {
            total += meta.blocks() * 512;
        }
        let mode = meta.permissions().mode();
        let wanted = if meta.is_dir() || mode & 0o111 != 0 {
            mode | 0o555
        } else {
            mode | 0o444
        } & !0o6022;
        if wanted != mode {
            fs_err::set_permissions(&path, std::fs::Permissions::from_mode(wanted))?;
        }
        if meta.is_dir() {
            for entry in fs_err::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(total)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn reqs(items: &[&str]) -> Vec<Requirement> {
        items
            .iter()
            .map(|s| Requirement::from_str(s).unwrap())
            .collect()
    }

    #[test]
    fn shared_types_are_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<EnvCache>();
        assert_send_sync::<Environment>();
    }

    #[test]
    fn a_copy_for_compiling_shares_every_file_and_copies_links() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("env");
        fs_err::create_dir_all(from.join("lib/site-packages/pkg")).unwrap();
        fs_err::write(from.join("lib/site-packages/pkg/__init__.py"), "X = 1\n").unwrap();
        fs_err::write(from.join(MANIFEST_FILE), "{}").unwrap();
        fs_err::os::unix::fs::symlink("lib", from.join("lib64")).unwrap();
        let to = dir.path().join("copy");
        link_tree(&from, &to).unwrap();
        let inode = |path: &Path| fs_err::metadata(path).unwrap().ino();
        for file in ["lib/site-packages/pkg/__init__.py", MANIFEST_FILE] {
            assert_eq!(inode(&from.join(file)), inode(&to.join(file)), "{file}");
        }
        assert_ne!(
            inode(&from.join("lib/site-packages/pkg")),
            inode(&to.join("lib/site-packages/pkg")),
            "directories are made anew"
        );
        assert_eq!(
            fs_err::read_link(to.join("lib64")).unwrap(),
            PathBuf::from("lib")
        );
    }

    #[tokio::test]
    async fn a_copys_manifest_is_replaced_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("env"), dir.path().join("copy"));
        fs_err::create_dir_all(&from).unwrap();
        fs_err::write(from.join(MANIFEST_FILE), "published").unwrap();
        link_tree(&from, &to).unwrap();
        let manifest = Manifest {
            schema: MANIFEST_SCHEMA,
            key: "k".into(),
            build_id: "b".into(),
            requirements: Vec::new(),
            pinned: true,
            packages: Vec::new(),
            interpreter: ManifestInterpreter {
                executable: PathBuf::from("/py"),
                version: "3.12.1".into(),
                prefix: PathBuf::from("/"),
                implementation: "CPython".into(),
            },
            index_settings: Vec::new(),
            uv_version: "0".into(),
            created_at: 0,
            size_bytes: 0,
            verified: true,
            compiled: true,
        };
        write_manifest(&to, &manifest).await.unwrap();
        assert_eq!(
            fs_err::read_to_string(from.join(MANIFEST_FILE)).unwrap(),
            "published"
        );
        let written: Manifest =
            serde_json::from_slice(&fs_err::read(to.join(MANIFEST_FILE)).unwrap()).unwrap();
        assert!(written.compiled);
        // A manifest written before environments were compiled after publishing: compiled.
        let mut old = serde_json::to_value(&manifest).unwrap();
        old.as_object_mut().unwrap().remove("compiled");
        assert!(serde_json::from_value::<Manifest>(old).unwrap().compiled);
    }

    #[test]
    fn requirement_sets_are_normalised_and_sorted() {
        let set = RequirementSet::new(&reqs(&[
            "Six==1.16.0",
            "attrs>=23",
            "six==1.16.0",
            "Foo_Bar[X]==1",
        ]));
        assert_eq!(set.lines, ["attrs>=23", "foo-bar[x]==1", "six==1.16.0"]);
        assert!(!set.pinned);
        assert!(
            RequirementSet::new(&reqs(&["six==1.16.0", "a==1.0; python_version < '3.12'"])).pinned
        );
        assert!(!RequirementSet::new(&reqs(&["six==1.*"])).pinned);
        assert!(!RequirementSet::new(&reqs(&["six"])).pinned);
        assert!(RequirementSet::new(&[]).pinned);
    }
}
