//! Isolation for snakebox: run one command under a [`Policy`] and return what it did.
//!
//! This crate owns every host operation that confines untrusted code: the bubblewrap
//! argument list, the seccomp program, cgroup (v2, then v1) or rlimit limits, spawning with a
//! clean environment and no inherited descriptors, streaming capped output, and killing a
//! whole process tree. It knows nothing of MCP, uv or Python: callers describe *what* must be
//! visible and *how much* may be used; this crate decides *how* that is enforced and reports
//! honestly which limits are really in force.
//!
//! The one design decision that shapes it: the policy is data. A [`Policy`] is turned into an
//! ordered list of setup steps and then into argv by pure functions, so every decision can be
//! read top to bottom and snapshot-tested without spawning anything.
#![deny(missing_docs)]

mod backend;
mod capture;
mod cgroup;
mod child;
mod cpu_share;
mod docker;
mod egress;
mod error;
mod health;
mod host;
mod intercept;
mod live;
mod native;
mod netproxy;
mod none;
mod own_mounts;
mod pending;
mod process;
mod runtime;
mod scratch;
mod staging;
mod supervise;
mod watchdog;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

pub use crate::backend::{Backend, RunFuture, SandboxFuture};
pub use crate::cgroup::HostWorkGroup;
pub use crate::cpu_share::{CpuAttachment, CpuShare, CpuWeight};
pub use crate::docker::{
    DEFAULT_SOCKET as DOCKER_DEFAULT_SOCKET, RunImage, socket_path as docker_socket,
};
pub use crate::egress::{
    BRIDGE_PORT, EgressProxy, EgressRules, SOCKET_INSIDE, bridged_command, is_ip_literal,
};
pub use crate::error::{
    CgroupError, DockerError, FuseError, NamespaceError, SandboxError, SeccompError, SpawnError,
};
pub use crate::intercept::{EgressCa, Interceptor, RunSecrets, SecretGrant, SecretValue};
pub use crate::live::{Exchange, ExchangeEnd, LiveHandle, LiveSandbox};
pub use crate::native::forkserver::{ForkRun, ForkServer, ForkServerSpec, MAX_PREFORK};
pub use crate::native::fuse::{
    FuseMount, FuseServers, ImageLock, LOCK_WAIT as FUSE_LOCK_WAIT, lock_image,
    run_helper as run_fuse_helper,
};
pub use crate::native::seccomp::exec_deny_program;
pub use crate::netproxy::{
    Hello, Names, NetCaps, NetDecision, NetResolver, NetRules, Purpose, RunProxy, SOCKET_NAME,
    Upstream, check_parsers, client_hello_sni, is_public, name_matches, run_proxy_env,
};
pub use crate::own_mounts::{
    enter as enter_own_mount_namespace, entered as in_own_mount_namespace,
};
pub use crate::pending::{PendingHandle, PendingRun};
pub use crate::runtime::off_the_runtime;
pub use crate::scratch::ScratchDir;
pub use crate::staging::{HostDirStaging, Staging};
pub use crate::supervise::{CONTROL_MAX_BYTES, END_REPORT_TAG};

/// Which isolation mechanism runs the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// bubblewrap namespaces + our seccomp program + cgroup/rlimit limits.
    Native,
    /// No isolation at all. Only ever used when the operator asked for it explicitly.
    None,
    /// A container of a Docker engine per run, through the Engine API (runc, or gVisor's
    /// `runsc` as the runtime).
    Docker,
}

/// Resource limits for one run. `None` means "not limited".
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Wall-clock time after which the whole process tree is killed.
    pub wall_time: Duration,
    /// CPU time (all processes of the run).
    pub cpu_time: Option<Duration>,
    /// Memory (RSS + page cache charged to the run's cgroup; without a memory cgroup, the
    /// resident anonymous memory of its processes, sampled by the supervisor's watchdog).
    pub memory_bytes: Option<u64>,
    /// Processes and threads alive at once.
    pub max_processes: Option<u64>,
    /// Bytes of stdout + stderr kept, in total across both streams (head and tail kept).
    pub max_output_bytes: u64,
    /// Size of the writable scratch space (`/tmp` and the working directory).
    pub scratch_bytes: Option<u64>,
    /// Largest file the run may write.
    pub file_size_bytes: Option<u64>,
    /// Open file descriptors per process.
    pub open_files: Option<u64>,
    /// CPU bandwidth of the whole run, in thousandths of a core (`1500` = 1.5 cores), so one
    /// run cannot starve the others of CPU. Each run also gets its own CPU cgroup, so runs
    /// share the CPU by run, not by thread, each with the weight of its [`Policy::cpu`].
    pub cpu_millicores: Option<u64>,
}

/// A host path made visible inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    /// Path on the host.
    pub host: PathBuf,
    /// Path inside the sandbox.
    pub dest: PathBuf,
    /// Whether the sandbox may write through this mount.
    pub writable: bool,
}

/// Everything the sandbox needs to know about one run, as data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Policy {
    /// Host paths visible inside (besides the minimal system view the backend provides).
    pub mounts: Vec<Mount>,
    /// Whether the run may use the network (shares the host network namespace when true).
    pub network: bool,
    /// The complete environment of the command (nothing else is inherited).
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox.
    pub cwd: PathBuf,
    /// Resource limits.
    pub limits: Limits,
    /// Whose code runs: decides the host uid the sandbox runs under (see [`Identity`]).
    pub identity: Identity,
    /// The CPU share the sandbox's cgroup is attached to for its whole life (see
    /// [`CpuShare`]); `None`: the kernel's default weight. Not data of the policy (never
    /// serialised): a handle to a weight its holder may change while the sandbox runs.
    #[serde(skip)]
    pub cpu: Option<CpuShare>,
}

/// Who a sandbox runs for. Each identity has its own host uid when the server is root, so that
/// what one writes the other cannot touch: the installer owns uv's cache and the environments
/// it is building; user code owns nothing that outlives its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Identity {
    /// Untrusted user code (host uid 65534 under a root server).
    Untrusted,
    /// The dependency installer (uv; host uid 65533 under a root server).
    Installer,
    /// Untrusted user code under a host uid of its own, leased for one run with
    /// [`Sandbox::lease_identity`]: per-uid kernel counters (inotify instances, pipe buffers,
    /// message queues, RLIMIT_NPROC) are then not shared with concurrent runs.
    Leased(u32),
}

/// First host uid leased to runs (and its gid): far above system and normal users' ids.
pub const LEASED_UID_BASE: u32 = 200_000;
/// How many leased uids exist; more concurrent runs than this share [`Identity::Untrusted`].
pub const LEASED_UIDS: u32 = 4096;

/// A host uid reserved for one run; returned to the pool when dropped. Keep it until the run's
/// processes are gone and its files removed.
#[derive(Debug)]
pub struct IdentityLease {
    identity: Identity,
    host_ids: Option<(u32, u32)>,
    pool: Option<std::sync::Arc<std::sync::Mutex<UidPool>>>,
}

impl IdentityLease {
    /// The identity to put in the run's [`Policy`].
    #[must_use]
    pub fn identity(&self) -> Identity {
        self.identity
    }

    /// The host uid/gid the run's sandbox will have (owner of its writable directories), or
    /// `None` when it runs as the server's own user.
    #[must_use]
    pub fn host_ids(&self) -> Option<(u32, u32)> {
        self.host_ids
    }
}

impl Drop for IdentityLease {
    fn drop(&mut self) {
        if let (Some(pool), Identity::Leased(uid)) = (&self.pool, self.identity) {
            pool.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .release(uid);
        }
    }
}

/// The leased uids not in use (lowest first, so ids are reused and stay few).
#[derive(Debug, Default)]
struct UidPool {
    in_use: std::collections::BTreeSet<u32>,
}

impl UidPool {
    fn lease(&mut self) -> Option<u32> {
        let uid =
            (LEASED_UID_BASE..LEASED_UID_BASE + LEASED_UIDS).find(|u| !self.in_use.contains(u))?;
        self.in_use.insert(uid);
        Some(uid)
    }
    fn release(&mut self, uid: u32) {
        self.in_use.remove(&uid);
    }
}

/// The command to run inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxCommand {
    /// Program path as seen inside the sandbox.
    pub program: PathBuf,
    /// Arguments (not including the program).
    pub args: Vec<OsString>,
    /// When true, the command gets a private result channel on file descriptor 3 (a pipe whose
    /// contents are returned in [`Outcome::control`]); stdout and stderr cannot forge it.
    pub control_channel: bool,
    /// When true, the command is the sandbox's init (pid 1 of its PID namespace, where the
    /// backend can make it so): it must reap every process the sandbox's others leave behind,
    /// and the kernel drops the signals they send it (SIGKILL included) unless it handles
    /// them. For snakebox's runner, whose reaper half reports how the run ended.
    pub init: bool,
}

/// Captured bytes of one stream, after capping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Captured {
    /// Kept text (lossy UTF-8). When truncated, head and tail are kept around a marker line.
    pub text: String,
    /// Whether bytes were dropped.
    pub truncated: bool,
    /// Bytes the command actually wrote to this stream.
    pub total_bytes: u64,
}

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Termination {
    /// The command exited (or was killed by a signal it did not get from us).
    Exited,
    /// The wall-time limit was reached and the tree was killed.
    TimedOut,
    /// The caller cancelled the run and the tree was killed.
    Cancelled,
    /// The memory limit was reached (OOM kill or allocation failure detected).
    MemoryLimit,
    /// The CPU-time limit was reached.
    CpuLimit,
}

/// What a run used, as the host measured it from the run's cgroup. `None` where this host
/// cannot tell (no cgroup for it, or a kernel without the counter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ResourceUsage {
    /// The most memory the run's processes held at once (RSS and page cache charged to it).
    pub peak_memory_bytes: Option<u64>,
    /// CPU time of all the run's processes (cgroup v2 `cpu.stat`).
    pub cpu_time_ms: Option<u64>,
    /// How many times a `fork`/`clone` was refused at the process limit.
    pub process_limit_hits: Option<u64>,
}

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// Exit code when the command exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when it was killed by a signal.
    pub signal: Option<i32>,
    /// Why the run ended.
    pub termination: Termination,
    /// Standard output.
    pub stdout: Captured,
    /// Standard error.
    pub stderr: Captured,
    /// Bytes written to the control channel (fd 3), if one was requested.
    pub control: Vec<u8>,
    /// Wall-clock duration.
    pub duration: Duration,
    /// What it used, where the host measures it.
    pub usage: ResourceUsage,
}

// ---------------------------------------------------------------------------------------------
// The public entry point. (Contract fixed by the engine; bodies are filled in by the backends.)
// ---------------------------------------------------------------------------------------------

/// Operator-level settings of the sandbox (not per run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// The backend to use. `None` must have been asked for explicitly.
    pub backend: BackendKind,
    /// Explicit path to `bwrap`; found on `PATH` otherwise.
    pub bwrap_path: Option<PathBuf>,
    /// Where runs leave their per-run scratch directories on the host.
    pub scratch_root: PathBuf,
    /// The docker backend's runtime (`runsc` for gVisor); the engine's default when `None`.
    pub docker_runtime: Option<String>,
}

/// One stream chunk, sent while the run is going (for progress notifications).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    /// Which stream it came from.
    pub stream: Stream,
    /// The bytes, as lossy UTF-8.
    pub text: String,
}

/// An output stream of the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// How one limit is enforced on this host (for `check_environment`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitReport {
    /// Limit name, e.g. `memory`.
    pub name: String,
    /// Whether it is really enforced here.
    pub enforced: bool,
    /// The mechanism (`cgroup v1 memory.limit_in_bytes`, `RLIMIT_NPROC`, `bwrap tmpfs --size`, ...).
    pub mechanism: String,
}

/// What the backend is and whether it really isolates (for `check_environment`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendReport {
    /// Configured backend.
    pub backend: BackendKind,
    /// Whether runs are really isolated.
    pub isolation_active: bool,
    /// Human-readable details (bwrap path and version, namespaces, seccomp, uid).
    pub details: Vec<String>,
    /// Each limit and how it is enforced.
    pub limits: Vec<LimitReport>,
}

/// A configured sandbox backend. Cheap to share (`Arc<Sandbox>`); `run` may be called
/// concurrently. The one façade callers hold: what differs between backends is behind
/// [`Backend`].
#[derive(Debug)]
pub struct Sandbox {
    backend: Box<dyn Backend>,
    /// How the backend's sandboxes get the engine's files ([`Backend::staging`]).
    staging: std::sync::Arc<dyn Staging>,
    report: BackendReport,
    uids: std::sync::Arc<std::sync::Mutex<UidPool>>,
    health: std::sync::Arc<health::StartHealth>,
}

impl Sandbox {
    /// Probe the backend. Fails closed: when `Native` cannot isolate, the error says what failed
    /// and its `hint()` how to fix it. Never falls back to `None` by itself.
    pub fn new(config: SandboxConfig) -> Result<Sandbox, SandboxError> {
        Ok(Sandbox::with_backend(backend_for(&config)?))
    }

    /// A sandbox of any [`Backend`] (tests hand in a recording one).
    #[must_use]
    pub fn with_backend(backend: Box<dyn Backend>) -> Sandbox {
        Sandbox {
            report: backend.report(),
            staging: backend.staging(),
            backend,
            uids: std::sync::Arc::default(),
            health: std::sync::Arc::default(),
        }
    }

    /// What the backend is, whether it isolates, and how each limit is enforced here.
    pub fn report(&self) -> BackendReport {
        self.report.clone()
    }

    /// When the last sandbox could not start and none has started since (the server's user
    /// out of processes or user namespaces, say): what failed and the hint. `check_environment`
    /// is then not ready.
    #[must_use]
    pub fn start_failure(&self) -> Option<(String, Option<String>)> {
        self.health.failure()
    }

    /// Kill and remove whatever cgroups of this server's runs are left (at shutdown, after
    /// the runs ended or were cut short). Best effort and bounded.
    pub fn remove_own_cgroups(&self) {
        self.backend.remove_own_cgroups();
    }

    /// A CPU cgroup for the server's host-work threads to join, where the backend has one
    /// ([`Backend::host_work_group`]).
    #[must_use]
    pub fn host_work_group(&self) -> Option<HostWorkGroup> {
        self.backend.host_work_group()
    }

    /// The configured backend (for reports).
    pub fn kind(&self) -> BackendKind {
        self.backend.kind()
    }

    /// Run one command. The whole tree is killed on wall-time timeout (within a second of
    /// `wall_time`) or when `cancel` fires, and the output printed before is returned. `output`,
    /// if given, receives chunks as they are produced (capped at `max_output_bytes` in total).
    pub async fn run(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Outcome, SandboxError> {
        self.staging.stage_in(&policy.mounts)?;
        let result = self.backend.run(policy, command, cancel, output).await;
        self.health.note(result.as_ref().map(|_| ()));
        let staged_out = self.staging.stage_out(&policy.mounts);
        let outcome = result?;
        staged_out?;
        Ok(outcome)
    }

    /// Start a long-lived sandbox: the same isolation and limits as [`Sandbox::run`] (memory
    /// and process limits hold for its whole life; `wall_time` is ignored here and given per
    /// request to [`LiveSandbox::exchange`]). The command's stdin is a private request pipe
    /// and, with `control_channel`, descriptor 3 carries its answers.
    ///
    /// # Errors
    /// Like [`Sandbox::run`], when the sandbox cannot be set up or started.
    pub fn spawn(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<LiveSandbox, SandboxError> {
        self.staging.stage_in(&policy.mounts)?;
        let mut live = self.backend.spawn(policy, command)?;
        live.health = Some(std::sync::Arc::clone(&self.health));
        live.staged = Some(self.staged(policy));
        Ok(live)
    }

    /// Start a one-shot sandbox ahead of time (the engine's warm pool): the same isolation and
    /// limits as [`Sandbox::run`], with the command's stdin a private pipe from which it reads
    /// its one request. [`PendingRun::run`] sends the request and supervises the run like
    /// [`Sandbox::run`] does, the wall-time limit counting from the request.
    ///
    /// # Errors
    /// Like [`Sandbox::run`], when the sandbox cannot be set up or started.
    pub fn prestart(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<PendingRun, SandboxError> {
        self.staging.stage_in(&policy.mounts)?;
        let mut pending = self.backend.prestart(policy, command)?;
        pending.health = Some(std::sync::Arc::clone(&self.health));
        pending.staged = Some(self.staged(policy));
        Ok(pending)
    }

    /// How the backend's sandboxes get the engine's files, and their size caps (see
    /// [`Staging`]): for the run directories the engine makes and sweeps.
    #[must_use]
    pub fn staging(&self) -> &dyn Staging {
        self.staging.as_ref()
    }

    /// What a long-lived or pre-started sandbox of `policy` stages around each request.
    fn staged(&self, policy: &Policy) -> staging::Staged {
        staging::Staged {
            staging: std::sync::Arc::clone(&self.staging),
            mounts: policy.mounts.clone(),
        }
    }

    /// Get the host ready for runs forked under `runs_dir` (see [`Backend::prepare_runs_root`]),
    /// before any run starts there.
    ///
    /// # Errors
    /// When the backend cannot get it ready; runs are then not forked.
    pub fn prepare_runs_root(&self, runs_dir: &std::path::Path) -> std::io::Result<()> {
        self.backend.prepare_runs_root(runs_dir)
    }

    /// Undo [`Sandbox::prepare_runs_root`] (best effort).
    pub fn release_runs_root(&self, runs_dir: &std::path::Path) {
        self.backend.release_runs_root(runs_dir);
    }

    /// Whether runs can be forked from a fork server here ([`Sandbox::start_fork_server`]):
    /// the native backend, under a root server or a normal user's server in a user and mount
    /// namespace of its own ([`enter_own_mount_namespace`]).
    #[must_use]
    pub fn forks_runs(&self) -> bool {
        self.backend.forks_runs()
    }

    /// Start a fork server for runs of one environment (see [`ForkServer`]), where the
    /// backend can fork runs ([`Sandbox::forks_runs`]): as a host uid leased for it under a
    /// root server, as the server's own uid (in a user namespace of its own) under a normal
    /// user's.
    ///
    /// # Errors
    /// When this sandbox cannot have one, or it fails to start.
    pub fn start_fork_server(&self, spec: &ForkServerSpec) -> Result<ForkServer, SandboxError> {
        self.backend.start_fork_server(spec, self.lease_identity())
    }

    /// The host uid and gid a sandbox of this identity runs as, when it differs from the
    /// server's: with the native backend under a root server, 65534 for user code and 65533
    /// for the installer. Writable mounts must be writable by it (for example
    /// `chown 65534:65534` the per-run work directory).
    #[must_use]
    pub fn host_ids(&self, identity: Identity) -> Option<(u32, u32)> {
        self.backend.host_ids(identity)
    }

    /// Where the command sees `host`, which a policy mounts at `dest` (or, for scratch space
    /// such as `/tmp`, which the backend provides at `dest`): see [`Backend::path_inside`].
    #[must_use]
    pub fn path_inside(&self, host: &std::path::Path, dest: &std::path::Path) -> PathBuf {
        self.backend.path_inside(host, dest)
    }

    /// Reserve a host uid of its own for one run of user code. Where uids are not switched
    /// (no native backend, or the server is not root) or all are taken, the lease is
    /// [`Identity::Untrusted`].
    #[must_use]
    pub fn lease_identity(&self) -> IdentityLease {
        let untrusted = || IdentityLease {
            identity: Identity::Untrusted,
            host_ids: self.host_ids(Identity::Untrusted),
            pool: None,
        };
        if self.host_ids(Identity::Untrusted).is_none() {
            return untrusted();
        }
        let leased = self
            .uids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .lease();
        match leased {
            Some(uid) => IdentityLease {
                identity: Identity::Leased(uid),
                host_ids: self.host_ids(Identity::Leased(uid)),
                pool: Some(std::sync::Arc::clone(&self.uids)),
            },
            None => untrusted(),
        }
    }
}

/// The backend `config` names, probed: the factory, and the one `match` on [`BackendKind`]
/// that picks behaviour. Everything else asks the [`Backend`] what it can do (its methods and
/// their defaults), so a backend is added here and in its own module only.
fn backend_for(config: &SandboxConfig) -> Result<Box<dyn Backend>, SandboxError> {
    Ok(match config.backend {
        BackendKind::None => Box::new(none::NoneBackend),
        BackendKind::Native => Box::new(native::NativeBackend::new(config)?),
        BackendKind::Docker => Box::new(docker::DockerBackend::new(config)?),
    })
}

#[cfg(test)]
mod uid_pool_tests {
    use super::{LEASED_UID_BASE, LEASED_UIDS, UidPool};

    #[test]
    fn leases_are_distinct_reused_after_release_and_bounded() {
        let mut pool = UidPool::default();
        let a = pool.lease().unwrap();
        let b = pool.lease().unwrap();
        assert_eq!((a, b), (LEASED_UID_BASE, LEASED_UID_BASE + 1));
        pool.release(a);
        assert_eq!(pool.lease(), Some(a));
        for _ in 2..LEASED_UIDS {
            assert!(pool.lease().is_some());
        }
        assert_eq!(pool.lease(), None, "no uid beyond the range");
    }
}
