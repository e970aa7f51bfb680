//! The seam between "what a run needs" and "how it is isolated": the [`Backend`] trait.
//!
//! Callers (the engine) hold one [`crate::Sandbox`] and never name a backend: everything that
//! differs between bubblewrap (`native`), no isolation (`none`) and later ones (Docker, gVisor)
//! is a method here — how a command is run once, started long-lived or ahead of time, whether
//! runs can be forked from a pre-initialised helper, which host uid a sandbox of an identity
//! has, where a host directory the policy mounts is seen by the command, how the engine's
//! files reach its sandboxes ([`crate::Staging`]) and what the host needs before runs are
//! forked. What a backend starts ahead of time or long-lived is behind the traits
//! [`crate::PendingHandle`] and [`crate::LiveHandle`], which the [`crate::PendingRun`] and
//! [`crate::LiveSandbox`] façades own. A backend for tests (a recording fake, or one of its
//! own handles) implements the same traits and is handed to [`crate::Sandbox::with_backend`];
//! [`crate::Sandbox::new`] is the one place that picks a backend by its kind.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::error::{SandboxError, SpawnError};
use crate::staging::{HostDirStaging, Staging};
use crate::{
    BackendKind, BackendReport, ForkServer, ForkServerSpec, Identity, IdentityLease, LiveSandbox,
    Outcome, OutputChunk, PendingRun, Policy, SandboxCommand,
};

/// A boxed future of the seam's traits (object safe, `Send`).
pub type SandboxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The future of one [`Backend::run`].
pub type RunFuture<'a> = SandboxFuture<'a, Result<Outcome, SandboxError>>;

/// One way of isolating commands. See the module documentation; [`crate::Sandbox`] documents
/// what each operation promises (limits, kill path, output caps), which every backend keeps.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Which backend this is (for reports only: callers never branch on it).
    fn kind(&self) -> BackendKind;

    /// Whether it isolates, and how each limit is enforced here.
    fn report(&self) -> BackendReport;

    /// Run one command to its end (see [`crate::Sandbox::run`]).
    fn run<'a>(
        &'a self,
        policy: &'a Policy,
        command: &'a SandboxCommand,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> RunFuture<'a>;

    /// Start a long-lived sandbox (see [`crate::Sandbox::spawn`]).
    ///
    /// # Errors
    /// When the sandbox cannot be set up or started.
    fn spawn(&self, policy: &Policy, command: &SandboxCommand)
    -> Result<LiveSandbox, SandboxError>;

    /// Start a one-shot sandbox ahead of its request (see [`crate::Sandbox::prestart`]).
    ///
    /// # Errors
    /// When the sandbox cannot be set up or started.
    fn prestart(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<PendingRun, SandboxError>;

    /// Whether this backend can fork runs ([`Backend::start_fork_server`]) here.
    fn forks_runs(&self) -> bool {
        false
    }

    /// Start a fork server running as `lease`'s uid (an optional capability: backends
    /// without one refuse, and runs are started the other ways).
    ///
    /// # Errors
    /// When this backend cannot fork runs, or the fork server fails to start.
    fn start_fork_server(
        &self,
        spec: &ForkServerSpec,
        lease: IdentityLease,
    ) -> Result<ForkServer, SandboxError> {
        let _ = (spec, lease);
        Err(SpawnError::ForkServer {
            message: format!("the {} backend cannot fork runs", self.kind().name()),
            before_user_code: true,
        }
        .into())
    }

    /// The host uid and gid a sandbox of `identity` runs as, when it is not the server's.
    fn host_ids(&self, identity: Identity) -> Option<(u32, u32)> {
        let _ = identity;
        None
    }

    /// Kill and remove whatever this server's runs left of what the backend made for them
    /// (cgroups), at shutdown. Best effort and bounded; nothing for a backend that makes none.
    fn remove_own_cgroups(&self) {}

    /// A CPU cgroup for the server's host-work threads ([`crate::HostWorkGroup`]), where the
    /// backend's cgroups allow one; by default none (the threads stay where the server is).
    fn host_work_group(&self) -> Option<crate::HostWorkGroup> {
        None
    }

    /// Get the host ready for runs forked under `runs_dir`, this server's run directories
    /// (an optional capability of a backend that forks runs: the native backend mounts a
    /// tmpfs there, which its fork servers pass on to their runs). Called before any run
    /// starts; by default nothing is needed.
    ///
    /// # Errors
    /// When the host cannot be got ready; runs are then not forked.
    fn prepare_runs_root(&self, runs_dir: &Path) -> std::io::Result<()> {
        let _ = runs_dir;
        Ok(())
    }

    /// Undo [`Backend::prepare_runs_root`] at `runs_dir` (best effort; also at shutdown when
    /// it was never done).
    fn release_runs_root(&self, runs_dir: &Path) {
        let _ = runs_dir;
    }

    /// How this backend's sandboxes get the files the engine prepares on its host (see
    /// [`Staging`]): by default they mount the engine's host directories themselves.
    fn staging(&self) -> Arc<dyn Staging> {
        Arc::new(HostDirStaging)
    }

    /// Where the command sees a host directory that the policy mounts at `dest` (or, for
    /// scratch space such as `/tmp`, that the backend provides there): `dest` for a backend
    /// that mounts, `host` for one that runs in the host's file system view.
    fn path_inside(&self, host: &Path, dest: &Path) -> PathBuf;
}

impl BackendKind {
    /// The name used in flags and reports: `native`, `none`, `docker`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Native => "native",
            BackendKind::None => "none",
            BackendKind::Docker => "docker",
        }
    }

    /// Whether each run is a container of its own (what a caller asking for a container,
    /// such as IBM's `use_container`, gets): the docker backend's.
    #[must_use]
    pub fn runs_in_containers(self) -> bool {
        matches!(self, BackendKind::Docker)
    }

    /// Whether runs can be forked from a warm interpreter (the fork server): a backend whose
    /// sandboxes are processes of this host can; a container backend's warm pool is its
    /// containers instead.
    #[must_use]
    pub fn forks_runs(self) -> bool {
        !self.runs_in_containers()
    }
}
