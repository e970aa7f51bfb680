//! How the files the engine prepares reach a sandbox, and what it wrote comes back: the
//! [`Staging`] trait.
//!
//! Why it exists: the engine writes a run's directories (the script, the runner, input files,
//! the writable working directory), a session's workspace and environments as directories on
//! its own host, and every [`crate::Policy`] names them as host paths that the sandbox mounts
//! ([`crate::Mount`]). That is an assumption, that the sandbox shares the server's file
//! system, and this trait is its name. Today's behaviour is [`HostDirStaging`]: the mounts
//! are those very directories, so bringing files in or out is nothing, and a writable
//! directory's size is capped on the host ([`crate::ScratchDir`]). A backend whose sandboxes
//! run elsewhere (another host) returns a staging of its own from
//! [`crate::Backend::staging`], which copies the mounts in before a sandbox reads them and
//! the writable ones back before the engine reads them.
//!
//! The [`crate::Sandbox`] façade calls [`Staging::stage_in`] and [`Staging::stage_out`]
//! around every start, one-shot run, pre-started run and exchange with a long-lived sandbox,
//! so the engine never does; the engine calls [`Staging::cap`] and [`Staging::release_stale`]
//! for the run directories it makes and sweeps. Runs forked from a fork server
//! ([`crate::ForkServer`]) do not pass the façade: forking is a capability of a backend
//! whose sandboxes share the host's file system (the native one), and their files are
//! already where they are read.

use std::path::Path;

use crate::error::{SandboxError, SpawnError};
use crate::{Mount, ScratchDir};

/// How a sandbox's mounts are staged; see the module documentation. The methods block (they
/// are called where a sandbox's start blocks too); a staging that copies over a network keeps
/// them bounded.
pub trait Staging: Send + Sync + std::fmt::Debug {
    /// Cap `dir` (an existing, writable directory a sandbox will mount) at `size_bytes`,
    /// owned by `owner` (uid, gid) or by the server, until the returned guard is dropped
    /// . Where this host cannot cap it, the guard says so
    /// ([`ScratchDir::is_capped`]).
    ///
    /// # Errors
    /// When capping fails for a reason other than missing privilege.
    fn cap(
        &self,
        dir: &Path,
        size_bytes: u64,
        owner: Option<(u32, u32)>,
    ) -> Result<ScratchDir, SpawnError> {
        ScratchDir::cap(dir, size_bytes, owner)
    }

    /// Release what a cap (or another mount of a server) left at `dir` when its server died
    /// before it could (best effort).
    fn release_stale(&self, dir: &Path) {
        crate::scratch::release_stale_scratch(dir);
    }

    /// Before a sandbox reads `mounts` (its start, a pre-started run's request, a request to
    /// a long-lived sandbox): make them hold what the engine wrote into their host
    /// directories. Nothing where the sandbox mounts those very directories.
    ///
    /// # Errors
    /// When the files cannot be staged; the sandbox is then not started or asked.
    fn stage_in(&self, mounts: &[Mount]) -> Result<(), SandboxError> {
        let _ = mounts;
        Ok(())
    }

    /// After a sandbox had `mounts` (a run's end, an exchange's): bring what it wrote into
    /// the writable ones back into their host directories, before the engine reads them.
    /// Nothing where the sandbox wrote those very directories.
    ///
    /// # Errors
    /// When the files cannot be brought back.
    fn stage_out(&self, mounts: &[Mount]) -> Result<(), SandboxError> {
        let _ = mounts;
        Ok(())
    }
}

/// Today's staging: the sandbox mounts the engine's host directories themselves (see the
/// module documentation). Every backend of this crate uses it.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostDirStaging;

impl Staging for HostDirStaging {}

/// A staging and the mounts of one long-lived or pre-started sandbox, staged around each of
/// its requests by the [`crate::LiveSandbox`] and [`crate::PendingRun`] façades.
pub(crate) struct Staged {
    pub(crate) staging: std::sync::Arc<dyn Staging>,
    pub(crate) mounts: Vec<Mount>,
}

impl Staged {
    pub(crate) fn stage_in(&self) -> Result<(), SandboxError> {
        self.staging.stage_in(&self.mounts)
    }

    pub(crate) fn stage_out(&self) -> Result<(), SandboxError> {
        self.staging.stage_out(&self.mounts)
    }
}
