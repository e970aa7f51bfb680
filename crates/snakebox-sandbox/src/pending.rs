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
//! Two kinds: a process started by a process backend (bubblewrap, or none), and a container
//! of the docker backend (see `crate::docker::pooled`), which keeps the same promises through
//! the engine's API.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::error::SandboxError;
use crate::process::Started;
use crate::supervise::{Teardown, finish_status_task, outcome, setup_failure, supervise};
use crate::{Limits, Outcome, OutputChunk};

/// A started sandbox waiting for its one request; see the module documentation.
pub struct PendingRun {
    kind: Kind,
    /// Where a sandbox that never started is noted (set by [`crate::Sandbox::prestart`]).
    pub(crate) health: Option<Arc<crate::health::StartHealth>>,
}

enum Kind {
    Process(Box<ProcessPending>),
    Docker(Box<crate::docker::PooledContainer>),
}

/// A process waiting for its request on a private stdin pipe.
struct ProcessPending {
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

impl std::fmt::Debug for PendingRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Process(p) => f
                .debug_struct("PendingRun")
                .field("pid", &p.child.as_ref().and_then(tokio::process::Child::id))
                .field("age", &p.started.elapsed())
                .finish_non_exhaustive(),
            Kind::Docker(c) => f
                .debug_struct("PendingRun")
                .field("container", &c.name())
                .field("age", &c.age())
                .finish_non_exhaustive(),
        }
    }
}

impl PendingRun {
    pub(crate) fn new(started: Started, limits: &Limits) -> PendingRun {
        PendingRun {
            kind: Kind::Process(Box::new(ProcessPending {
                child: Some(started.child),
                teardown: started.teardown,
                control: started.control_read,
                info_task: started.info_task,
                shell_style_signals: started.shell_style_signals,
                limits: limits.clone(),
                started: Instant::now(),
                released: false,
            })),
            health: None,
        }
    }

    /// A container of the docker backend, started and waiting for its request.
    pub(crate) fn container(pooled: crate::docker::PooledContainer) -> PendingRun {
        PendingRun {
            kind: Kind::Docker(Box::new(pooled)),
            health: None,
        }
    }

    /// Whether the command is still waiting (it did not exit or get killed meanwhile).
    pub fn is_alive(&mut self) -> bool {
        match &mut self.kind {
            Kind::Process(p) => p.is_alive(),
            Kind::Docker(c) => c.is_alive(),
        }
    }

    /// How long ago it was started.
    #[must_use]
    pub fn age(&self) -> Duration {
        match &self.kind {
            Kind::Process(p) => p.started.elapsed(),
            Kind::Docker(c) => c.age(),
        }
    }

    /// Attach its cgroup to `share` (see [`crate::CpuShare`]) until the returned attachment
    /// is dropped: from just before [`PendingRun::run`] to the run's end. Inert where there is
    /// no cpu cgroup of ours (a container, no cgroups); a weight that cannot be written leaves
    /// the default (logged).
    pub fn attach_cpu(&self, share: &crate::CpuShare) -> crate::CpuAttachment {
        match &self.kind {
            Kind::Process(p) => crate::supervise::attach_cpu(p.teardown.as_ref(), share, None),
            Kind::Docker(_) => crate::CpuAttachment::none(),
        }
    }

    /// Kill the tree unused and wait until it is gone (then its cgroup is freed; a container
    /// is removed).
    pub async fn discard(self) {
        match self.kind {
            Kind::Process(p) => p.discard().await,
            Kind::Docker(c) => c.discard().await,
        }
    }

    /// Send `request`, close the request pipe, and supervise the run to its end, exactly like
    /// [`crate::Sandbox::run`]: `wall_time` counts from now; the whole tree is killed on
    /// timeout or when `cancel` fires, and the output printed before is returned.
    ///
    /// # Errors
    /// When waiting for the process fails.
    pub async fn run(
        self,
        request: &[u8],
        wall_time: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Outcome, SandboxError> {
        let result = match self.kind {
            Kind::Process(p) => p.run(request, wall_time, cancel, output).await,
            Kind::Docker(c) => c.run(request, wall_time, cancel, output).await,
        };
        if let Some(health) = &self.health {
            health.note(result.as_ref().map(|_| ()));
        }
        result
    }
}

impl ProcessPending {
    fn is_alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Kill the tree unused and wait until it is gone (then its cgroup is freed).
    async fn discard(mut self) {
        if let Some(mut child) = self.child.take() {
            self.teardown.kill_all();
            let _ = child.start_kill();
            let _ = child.wait().await;
            self.teardown.kill_all();
        }
    }

    async fn run(
        mut self,
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
