//! A session's interpreter as one long-lived container.
//!
//! Why: a session keeps its variables between calls, so its interpreter must outlive a call;
//! in the docker backend that is a container, made exactly like a one-shot run's
//! ([`super::DockerBackend::start_container`]: the same body, verified by inspecting it after
//! create), whose stdin is the request FIFO of a pooled container, held open by the server for
//! the container's whole life. The conversation is [`crate::LiveSandbox`]'s: a request line on
//! stdin, the answer on the control FIFO, output from the attach stream up to the request's
//! marker. Killing it (a timeout, a cancel, the session closed, reset or expired, the server
//! stopping) goes through the engine's API, and the container is removed with whatever it
//! held; the workspace is the session's directory on the host, bound in.

use std::os::fd::OwnedFd;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;

use super::{Container, ControlDir, DockerBackend, Prepared, usage::RunCgroup};
use crate::backend::SandboxFuture;
use crate::error::{DockerError, SandboxError, SpawnError};
use crate::live::{LiveChild, PipedLive, PipedParts, Reader, Writer};
use crate::supervise::AbortOnDrop;
use crate::supervise::Teardown;
use crate::{Policy, SandboxCommand};

/// Start a session's container (blocking, like [`super::pooled::prestart`]), as a live
/// sandbox whose conversation goes over its FIFOs and attach stream ([`PipedLive`]).
pub(crate) fn spawn(
    backend: &DockerBackend,
    policy: &Policy,
    command: &SandboxCommand,
) -> Result<PipedLive, SandboxError> {
    if !command.control_channel {
        return Err(DockerError::Unsupported {
            reason: "a long-lived container answers on its control channel".into(),
        }
        .into());
    }
    let prepared = super::block_on(backend.start_container(policy, command, true))??;
    let parts = into_parts(prepared)?;
    PipedLive::new(parts, &policy.limits)
}

fn into_parts(mut prepared: Prepared) -> Result<PipedParts, SandboxError> {
    // A container started with `pooled` has both FIFOs (dropping `prepared` removes it).
    let (Some(requests), Some(control)) = (prepared.request.take(), prepared.control_read.take())
    else {
        return Err(DockerError::Unsupported {
            reason: "the session's container has no request or control channel".into(),
        }
        .into());
    };
    // The guard's removal becomes the teardown's `release`.
    prepared.guard.armed = false;
    let oom = Arc::new(AtomicBool::new(false));
    let container = prepared.container.clone();
    let wait = {
        let (oom, container, wait) = (Arc::clone(&oom), container.clone(), prepared.wait);
        let limit = super::memory_limit(&prepared.body);
        let cgroup = prepared.guard.cgroup.clone();
        // The container's end, then whether the kernel killed it for memory (read before
        // anything removes it).
        prepared.container.handle.spawn(async move {
            let status = wait.await.map_err(std::io::Error::other)?;
            let engine_says = container
                .docker
                .inspect_container(&container.name, None)
                .await
                .is_ok_and(|state| state.state.and_then(|s| s.oom_killed) == Some(true));
            let peak = cgroup.as_ref().and_then(|c| c.usage().peak_memory_bytes);
            let code = status.as_ref().ok().and_then(ExitStatus::code);
            if super::usage::killed_for_memory(engine_says, code, limit, peak) {
                oom.store(true, Ordering::SeqCst);
            }
            status
        })
    };
    let teardown = Arc::new(LiveTeardown {
        container: container.clone(),
        oom,
        held: Mutex::new(Some(Held {
            control_hold: prepared.control_hold.take(),
            control: prepared.control.take(),
            cgroup: prepared.guard.cgroup.take(),
        })),
    });
    let requests = tokio::net::unix::pipe::Sender::from_owned_fd(requests).map_err(|source| {
        SpawnError::Descriptor {
            what: "request channel",
            source,
        }
    })?;
    Ok(PipedParts {
        child: Box::new(LiveContainer {
            container,
            wait: Some(wait),
            status: None,
            _pump: prepared.pump,
        }),
        teardown,
        requests: Some(Box::new(requests) as Writer),
        stdout: Some(Box::new(prepared.stdout) as Reader),
        stderr: Some(Box::new(prepared.stderr) as Reader),
        control: Some(control),
        info_task: None,
        // The container's init reports a death by signal N as 128 + N.
        shell_style_signals: true,
    })
}

/// The session container as the live sandbox's child.
struct LiveContainer {
    container: Container,
    wait: Option<tokio::task::JoinHandle<std::io::Result<ExitStatus>>>,
    status: Option<ExitStatus>,
    /// Copies the attach stream into the sandbox's readers while it lives.
    _pump: AbortOnDrop,
}

impl LiveChild for LiveContainer {
    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let Some(task) = self.wait.as_mut() else {
            return Err(std::io::Error::other(
                "the container's end was already read",
            ));
        };
        match task.now_or_never() {
            None => Ok(None),
            Some(result) => {
                self.wait = None;
                let status = result.map_err(std::io::Error::other)??;
                self.status = Some(status);
                Ok(Some(status))
            }
        }
    }

    fn start_kill(&mut self) -> std::io::Result<()> {
        self.container.kill();
        Ok(())
    }

    fn wait(&mut self) -> SandboxFuture<'_, std::io::Result<ExitStatus>> {
        Box::pin(async move {
            if let Some(status) = self.status {
                return Ok(status);
            }
            let Some(task) = self.wait.as_mut() else {
                return Err(std::io::Error::other(
                    "the container's end was already read",
                ));
            };
            let result = task.await;
            self.wait = None;
            let status = result.map_err(std::io::Error::other)??;
            self.status = Some(status);
            Ok(status)
        })
    }
}

/// What the container holds on the host until it is released.
struct Held {
    /// Our writer of the control FIFO: dropped once the container is dead, so that the reader
    /// sees end of file.
    control_hold: Option<OwnedFd>,
    control: Option<ControlDir>,
    cgroup: Option<RunCgroup>,
}

struct LiveTeardown {
    container: Container,
    oom: Arc<AtomicBool>,
    held: Mutex<Option<Held>>,
}

impl Teardown for LiveTeardown {
    fn kill_all(&self) {
        self.container.kill();
        if let Some(held) = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            held.control_hold = None;
        }
    }

    fn memory_exceeded(&self) -> bool {
        self.oom.load(Ordering::SeqCst)
    }

    /// Remove the container (killing it if it still runs), then its cgroup and control
    /// directory. In the background: it is called where nothing may wait.
    fn release(&self) {
        let Some(held) = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let container = self.container.clone();
        self.container.handle.spawn(async move {
            container.remove().await;
            if let Some(cgroup) = held.cgroup {
                cgroup.remove();
            }
            drop(held.control);
        });
    }
}
