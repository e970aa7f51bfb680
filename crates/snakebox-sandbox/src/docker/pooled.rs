//! Containers started ahead of their request: the warm pool of the docker backend.
//!
//! Why: most of a cold run's time is the engine's (create, start, the runtime's setup) and
//! the interpreter's start, not the caller's code. A pooled container is made exactly like a
//! cold run's ([`super::DockerBackend::start_container`], the same body, verified by
//! inspecting it), started, and its command (the runner, interpreter up, own modules
//! imported) blocks reading its one request from its stdin: a FIFO in the run's own control
//! directory on the host, which only the server writes (the container has no stdin from the
//! engine, no network, and no other container sees that directory).
//!
//! When a call takes it, the container is inspected again (still running, every hardening
//! field still as asked), the request is written, and the run is supervised exactly like a
//! cold one from then on (the wall-time limit counts from the request). Our end of the FIFO
//! stays open until the run ends: "started" by the engine does not mean that the container's
//! shell has opened the FIFO yet, and a FIFO's data lives only while one of its ends is open,
//! so closing ours before that open lost the request and the run waited for it until its
//! timeout (a call that took a container just started; seen in the soak under docker). It serves that one run and is removed; one never used is removed when dropped
//! or discarded (at shutdown with the pool).

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::{DockerBackend, Prepared, verify};
use crate::backend::SandboxFuture;
use crate::error::{DockerError, SandboxError};
use crate::pending::PendingHandle;
use crate::{Limits, Outcome, OutputChunk, Policy, SandboxCommand};

/// A started container waiting for its request; see the module documentation.
pub(crate) struct PooledContainer {
    prepared: Prepared,
    limits: Limits,
    created: Instant,
}

/// Create and start a pooled container. Blocks the calling thread until it runs (the
/// engine's requests are driven by the server's runtime meanwhile, on another thread).
pub(crate) fn prestart(
    backend: &DockerBackend,
    policy: &Policy,
    command: &SandboxCommand,
) -> Result<PooledContainer, SandboxError> {
    let created = Instant::now();
    let prepared = super::block_on(backend.start_container(policy, command, true))??;
    Ok(PooledContainer {
        prepared,
        limits: policy.limits.clone(),
        created,
    })
}

impl std::fmt::Debug for PooledContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRun")
            .field("container", &self.prepared.container.name)
            .field("age", &self.created.elapsed())
            .finish_non_exhaustive()
    }
}

impl PendingHandle for PooledContainer {
    /// Whether its command still runs (it did not exit, or get killed, while it waited).
    fn is_alive(&mut self) -> bool {
        !self.prepared.wait.is_finished()
    }

    fn age(&self) -> Duration {
        self.created.elapsed()
    }

    fn discard(self: Box<Self>) -> SandboxFuture<'static, ()> {
        Box::pin(self.discard_container())
    }

    fn run<'a>(
        self: Box<Self>,
        request: &'a [u8],
        wall_time: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> SandboxFuture<'a, Result<Outcome, SandboxError>> {
        Box::pin(self.run_container(request, wall_time, cancel, output))
    }
}

impl PooledContainer {
    /// Remove it unused and wait until it is gone.
    async fn discard_container(mut self: Box<Self>) {
        self.prepared.container.remove().await;
        if let Some(cgroup) = self.prepared.guard.cgroup.take() {
            cgroup.remove();
        }
        self.prepared.guard.armed = false;
    }

    /// Check it again, send `request`, and supervise the run to its end (see the module
    /// documentation).
    async fn run_container(
        mut self: Box<Self>,
        request: &[u8],
        wall_time: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Outcome, SandboxError> {
        let container = self.prepared.container.clone();
        let inspected = container
            .docker
            .inspect_container(&container.name, None)
            .await
            .map_err(|source| DockerError::Request {
                what: "inspect the pre-started container",
                source,
            })?;
        verify(&self.prepared.body, &inspected)?;
        let running = inspected.state.as_ref().and_then(|s| s.running) == Some(true);
        if !running {
            return Err(DockerError::Unsupported {
                reason: "the pre-started container is no longer running".into(),
            }
            .into());
        }
        let started = Instant::now();
        // Held until the run ends (see the module documentation); the runner reads one line
        // and then takes /dev/null as its stdin, so it never waits for our end to close.
        let held = self.prepared.request.take();
        if let Some(fd) = &held {
            send(fd, request);
        }
        let mut limits = self.limits.clone();
        limits.wall_time = wall_time;
        let outcome = self.prepared.finish(&limits, cancel, output, started).await;
        drop(held);
        outcome
    }
}

/// Write the request into the FIFO (a request is a few bytes: far less than a pipe holds, so
/// the write does not wait). A container that died makes supervision see its end.
fn send(fd: &OwnedFd, request: &[u8]) {
    let mut left = request;
    while !left.is_empty() {
        match nix::unistd::write(fd, left) {
            Ok(n) => left = &left[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(err) => {
                tracing::debug!(%err, "could not send the request to a pre-started container");
                break;
            }
        }
    }
}
