//! Pre-started one-shot sandboxes (the engine's warm pool).
//!
//! A [`PendingRun`] is a sandbox started exactly like [`crate::Sandbox::run`] starts one (the
//! same bwrap argument list, seccomp programs, staging, cgroup and rlimits), whose command
//! waits for ONE request on its stdin, a private pipe from us. [`PendingRun::run`] sends the
//! request, closes the pipe (the command sees end of file after it), and from then on the run
//! is supervised exactly like a one-shot run: the wall-time limit starts when the request is
//! sent, output is drained and capped the same way, the run ends when the direct child ends,
//! and the whole tree is killed on timeout, cancellation or when the future is dropped.
//!
//! A pending run is used once. Dropping it unused kills its tree and frees its cgroup.
//!
//! [`PendingRun`] is the façade the engine holds; behind it is a backend's [`PendingHandle`]:
//! a process started by a process backend (bubblewrap, or none; [`ProcessPending`] here), a
//! container of the docker backend (see `crate::docker::pooled`), which keeps the same
//! promises through the engine's API, or a backend's elsewhere.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::backend::SandboxFuture;
use crate::error::SandboxError;
use crate::process::Started;
use crate::staging::Staged;
use crate::supervise::{Teardown, finish_status_task, outcome, setup_failure, supervise};
use crate::{Limits, Outcome, OutputChunk};

/// A started sandbox waiting for its one request; see the module documentation.
pub struct PendingRun {
    handle: Box<dyn PendingHandle>,
    /// Where a sandbox that never started is noted (set by [`crate::Sandbox::prestart`]).
    pub(crate) health: Option<Arc<crate::health::StartHealth>>,
    /// Its mounts and their staging: the request's files (the script is written after the
    /// start) are staged in before it is sent (set by [`crate::Sandbox::prestart`]).
    pub(crate) staged: Option<Staged>,
}

/// What a backend's pre-started sandbox does (see the module documentation): the seam behind
/// [`PendingRun`]. A backend elsewhere implements it and hands its handle to
/// [`PendingRun::new`]. Dropping the handle unused must kill whatever of it runs.
pub trait PendingHandle: Send + std::fmt::Debug {
    /// Whether the command is still waiting (it did not exit or get killed meanwhile).
    fn is_alive(&mut self) -> bool;

    /// How long ago it was started.
    fn age(&self) -> Duration;

    /// Attach its CPU to `share` until the returned attachment is dropped (see
    /// [`PendingRun::attach_cpu`]). By default inert: no cpu cgroup of ours.
    fn attach_cpu(&self, share: &crate::CpuShare) -> crate::CpuAttachment {
        let _ = share;
        crate::CpuAttachment::none()
    }

    /// Kill it unused and wait until it is gone (see [`PendingRun::discard`]).
    fn discard(self: Box<Self>) -> SandboxFuture<'static, ()>;

    /// Send `request` and supervise the run to its end (see [`PendingRun::run`]).
    fn run<'a>(
        self: Box<Self>,
        request: &'a [u8],
        wall_time: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> SandboxFuture<'a, Result<Outcome, SandboxError>>;
}

impl std::fmt::Debug for PendingRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.handle.fmt(f)
    }
}

impl PendingRun {
    /// The façade over a backend's pre-started sandbox.
    #[must_use]
    pub fn new(handle: Box<dyn PendingHandle>) -> PendingRun {
        PendingRun {
            handle,
            health: None,
            staged: None,
        }
    }

    /// Whether the command is still waiting (it did not exit or get killed meanwhile).
    pub fn is_alive(&mut self) -> bool {
        self.handle.is_alive()
    }

    /// How long ago it was started.
    #[must_use]
    pub fn age(&self) -> Duration {
        self.handle.age()
    }

    /// Attach its cgroup to `share` (see [`crate::CpuShare`]) until the returned attachment
    /// is dropped: from just before [`PendingRun::run`] to the run's end. Inert where there is
    /// no cpu cgroup of ours (a container, no cgroups); a weight that cannot be written leaves
    /// the default (logged).
    pub fn attach_cpu(&self, share: &crate::CpuShare) -> crate::CpuAttachment {
        self.handle.attach_cpu(share)
    }

    /// Kill the tree unused and wait until it is gone (then its cgroup is freed; a container
    /// is removed).
    pub async fn discard(self) {
        self.handle.discard().await;
    }

    /// Send `request`, close the request pipe, and supervise the run to its end, exactly like
    /// [`crate::Sandbox::run`]: `wall_time` counts from now; the whole tree is killed on
    /// timeout or when `cancel` fires, and the output printed before is returned.
    ///
    /// What the engine wrote into the sandbox's mounts is staged in first, and what the run
    /// wrote staged out after (see [`crate::Staging`]).
    ///
    /// # Errors
    /// When waiting for the process fails, or the run's files cannot be staged.
    pub async fn run(
        self,
        request: &[u8],
        wall_time: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Outcome, SandboxError> {
        if let Some(staged) = &self.staged {
            staged.stage_in()?;
        }
        let result = self.handle.run(request, wall_time, cancel, output).await;
        if let Some(health) = &self.health {
            health.note(result.as_ref().map(|_| ()));
        }
        let staged_out = self.staged.as_ref().map_or(Ok(()), Staged::stage_out);
        let outcome = result?;
        staged_out?;
        Ok(outcome)
    }
}

/// A process of a process backend waiting for its request on a private stdin pipe.
pub(crate) struct ProcessPending {
    child: Option<tokio::process::Child>,
    teardown: Arc<dyn Teardown>,
    control: Option<OwnedFd>,
    info_task: Option<tokio::task::JoinHandle<()>>,
    shell_style_signals: bool,
    limits: Limits,
    started: Instant,
    /// The cgroup's release was handed to a background task.
    released: bool,
}

impl std::fmt::Debug for ProcessPending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRun")
            .field(
                "pid",
                &self.child.as_ref().and_then(tokio::process::Child::id),
            )
            .field("age", &self.started.elapsed())
            .finish_non_exhaustive()
    }
}

impl ProcessPending {
    /// A freshly started process (see [`crate::process::Started::into_pending`]).
    pub(crate) fn new(started: Started, limits: &Limits) -> ProcessPending {
        ProcessPending {
            child: Some(started.child),
            teardown: started.teardown,
            control: started.control_read,
            info_task: started.info_task,
            shell_style_signals: started.shell_style_signals,
            limits: limits.clone(),
            started: Instant::now(),
            released: false,
        }
    }
}

impl PendingHandle for ProcessPending {
    fn is_alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    fn age(&self) -> Duration {
        self.started.elapsed()
    }

    fn attach_cpu(&self, share: &crate::CpuShare) -> crate::CpuAttachment {
        crate::supervise::attach_cpu(self.teardown.as_ref(), share, None)
    }

    fn discard(self: Box<Self>) -> SandboxFuture<'static, ()> {
        Box::pin(self.discard_process())
    }

    fn run<'a>(
        self: Box<Self>,
        request: &'a [u8],
        wall_time: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> SandboxFuture<'a, Result<Outcome, SandboxError>> {
        Box::pin(self.run_process(request, wall_time, cancel, output))
    }
}

impl ProcessPending {
    /// Kill the tree unused and wait until it is gone (then its cgroup is freed).
    async fn discard_process(mut self: Box<Self>) {
        if let Some(mut child) = self.child.take() {
            self.teardown.kill_all();
            let _ = child.start_kill();
            let _ = child.wait().await;
            self.teardown.kill_all();
        }
    }

    async fn run_process(
        mut self: Box<Self>,
        request: &[u8],
        wall_time: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Outcome, SandboxError> {
        let Some(mut child) = self.child.take() else {
            return Err(crate::error::SpawnError::Wait {
                pid: 0,
                source: std::io::ErrorKind::NotFound.into(),
            }
            .into());
        };
        let started = Instant::now();
        if let Some(mut stdin) = child.stdin.take() {
            // A command that died makes the write fail; supervision then sees it exit.
            if let Err(err) = async {
                stdin.write_all(request).await?;
                stdin.flush().await
            }
            .await
            {
                tracing::debug!(%err, "could not send the request to a pre-started sandbox");
            }
            drop(stdin);
        }
        let mut limits = self.limits.clone();
        limits.wall_time = wall_time;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let raw = supervise(
            child,
            stdout,
            stderr,
            self.control.take(),
            &limits,
            cancel,
            output,
            self.teardown.as_ref(),
            started,
        )
        .await;
        finish_status_task(self.info_task.take()).await;
        let memory_hit = self.teardown.memory_exceeded();
        let usage = self.teardown.usage();
        let raw = raw?;
        // Everything of the run is dead (supervision swept twice); removing its cgroup need
        // not hold up the result.
        let teardown = Arc::clone(&self.teardown);
        tokio::task::spawn_blocking(move || teardown.release());
        self.released = true;
        match setup_failure(&raw, self.teardown.as_ref()) {
            Some(err) => Err(err),
            None => Ok(outcome(
                raw,
                &limits,
                self.shell_style_signals,
                memory_hit,
                usage,
            )),
        }
    }
}

impl Drop for ProcessPending {
    fn drop(&mut self) {
        if let Some(task) = self.info_task.take() {
            task.abort();
        }
        if let Some(mut child) = self.child.take() {
            // Never used: nothing of it may outlive it. Its cgroup can only be removed once
            // the tree is gone, so that waits in the background when a runtime is there.
            self.teardown.kill_all();
            let _ = child.start_kill();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let teardown = Arc::clone(&self.teardown);
                runtime.spawn(async move {
                    let _ = child.wait().await;
                    teardown.kill_all();
                    teardown.release();
                });
                return;
            }
        }
        if !self.released {
            self.teardown.release();
        }
    }
}
