//! What every backend whose sandbox is a local child process shares, written once.
//!
//! Such a backend (native: bubblewrap; none: the command itself) differs from another only in
//! how it starts the process ([`ProcessBackend::start`]); what a started process becomes is
//! the same for all of them: run to its end under the supervisor ([`Started::run`]), a
//! long-lived sandbox ([`Started::into_live`]) or a one-shot sandbox waiting for its request
//! ([`Started::into_pending`]). The provided methods of [`ProcessBackend`] chain the two, and
//! [`process_backend_methods`] writes a process backend's [`crate::Backend`] methods from them.
//!
//! This is a helper layer below the [`crate::Backend`] trait, not part of it: a backend whose
//! sandbox is not a local child (a container driven through an engine's API) implements
//! `Backend` directly and never names `tokio::process::Child`.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::{SandboxError, SpawnError};
use crate::live::{LiveSandbox, PipedLive};
use crate::pending::{PendingRun, ProcessPending};
use crate::supervise::{Teardown, finish_status_task, outcome, setup_failure, supervise};
use crate::{Limits, Outcome, OutputChunk, Policy, SandboxCommand};

/// A sandbox process that has just been started, with what its end needs.
pub(crate) struct Started {
    /// The direct child: its end is the end of the run.
    pub(crate) child: tokio::process::Child,
    /// Kills the whole tree, tells whether memory ran out, frees what the run held.
    pub(crate) teardown: Arc<dyn Teardown>,
    /// Our end of the command's control channel, when it has one.
    pub(crate) control_read: Option<OwnedFd>,
    /// A task that learns what the kill path needs after the start (native: the sandbox's
    /// pid 1); aborted once the run is over.
    pub(crate) info_task: Option<JoinHandle<()>>,
    /// Just before the process was spawned (the wall time counts from here).
    pub(crate) started: Instant,
    /// The direct child reports a signal death of the command as exit code `128 + signal`
    /// (bwrap does; a command run as is does not).
    pub(crate) shell_style_signals: bool,
}

impl Started {
    /// Supervise the process to its end (see [`crate::Sandbox::run`]): the info task is
    /// aborted, the memory verdict read before the teardown releases what the run held (its
    /// cgroup), and the release happens only when supervision worked.
    pub(crate) async fn run(
        self,
        limits: &Limits,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Outcome, SandboxError> {
        let Started {
            mut child,
            teardown,
            control_read,
            info_task,
            started,
            shell_style_signals,
        } = self;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let raw = supervise(
            child,
            stdout,
            stderr,
            control_read,
            limits,
            cancel,
            output,
            teardown.as_ref(),
            started,
        )
        .await;
        finish_status_task(info_task).await;
        let memory_hit = teardown.memory_exceeded();
        let usage = teardown.usage();
        let raw = raw?;
        teardown.release();
        if let Some(err) = setup_failure(&raw, teardown.as_ref()) {
            return Err(err);
        }
        Ok(outcome(raw, limits, shell_style_signals, memory_hit, usage))
    }

    /// The process as a long-lived sandbox (see [`LiveSandbox`]).
    pub(crate) fn into_live(self, limits: &Limits) -> Result<LiveSandbox, SandboxError> {
        Ok(LiveSandbox::new(Box::new(PipedLive::process(
            self, limits,
        )?)))
    }

    /// The process as a one-shot sandbox waiting for its request (see [`PendingRun`]).
    pub(crate) fn into_pending(self, limits: &Limits) -> PendingRun {
        PendingRun::new(Box::new(ProcessPending::new(self, limits)))
    }
}

/// Spawn the prepared `command` (whose program is `program`, for the error), killed when the
/// child is dropped; with the instant just before the spawn, from which the wall time counts.
/// The fork happens on [`on_spawner_thread`], never on the calling thread.
pub(crate) fn spawn_child(
    command: std::process::Command,
    program: &std::path::Path,
) -> Result<(tokio::process::Child, Instant), SpawnError> {
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    let runtime = tokio::runtime::Handle::try_current().ok();
    let spawned = on_spawner_thread(move || {
        // tokio's child reaping belongs to the runtime, whichever thread forks.
        let _entered = runtime.as_ref().map(tokio::runtime::Handle::enter);
        let started = Instant::now();
        command.spawn().map(|child| (child, started))
    });
    spawned.map_err(|source| SpawnError::Start {
        program: program.to_path_buf(),
        source,
    })
}

/// A unit of work for the spawner thread.
type SpawnJob = Box<dyn FnOnce() + Send>;

/// Run `fork` on the one thread that forks every sandbox process, and wait for it.
///
/// Sandbox processes are started with `PR_SET_PDEATHSIG` = SIGKILL so that they die with the
/// server; the kernel sends it when the *thread* that forked them ends, not the process. A
/// tokio blocking-pool thread retires after 10 s without work, so a sandbox forked from one
/// (every pre-started sandbox, and any run started from `spawn_blocking`) was SIGKILLed about
/// 10 s later: a normal user's `time.sleep(25)` with a 20 s timeout ended at 10 s as "killed
/// by SIGKILL" every time, and a fork bomb stopped by a 10 s timeout was reported so in about
/// half the runs (issue 33). This thread lives as long as the server; where it cannot be
/// started, the fork happens here (and the old hazard with it).
fn on_spawner_thread<T: Send + 'static>(
    fork: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    static SPAWNER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<SpawnJob>>> =
        std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, inbox) = std::sync::mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("snakebox-spawner".into())
            .spawn(move || {
                for job in inbox {
                    // A job that panics drops its reply (its caller gets an error); the
                    // thread goes on serving the others.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            })
            .ok()
            .map(|_| jobs)
    });
    let Some(jobs) = spawner else {
        return fork();
    };
    let (reply, answer) = std::sync::mpsc::sync_channel(1);
    let job: SpawnJob = Box::new(move || {
        let _ = reply.send(fork());
    });
    jobs.send(job)
        .map_err(|_| std::io::Error::other("the spawner thread has ended"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread dropped the spawn"))?
}

/// A backend whose sandbox is a local child process: it says how to start one; running,
/// keeping and pre-starting it are provided.
pub(crate) trait ProcessBackend {
    /// Start `command` under `policy`. With `requests`, its stdin is a private pipe from us
    /// (a long-lived or pre-started sandbox reads its requests there); otherwise `/dev/null`.
    fn start(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
        requests: bool,
    ) -> Result<Started, SandboxError>;

    /// Run one command to its end (see [`crate::Sandbox::run`]).
    async fn run_process(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Outcome, SandboxError> {
        self.start(policy, command, false)?
            .run(&policy.limits, cancel, output)
            .await
    }

    /// Start a long-lived sandbox (see [`crate::Sandbox::spawn`]).
    fn spawn_process(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<LiveSandbox, SandboxError> {
        self.start(policy, command, true)?.into_live(&policy.limits)
    }

    /// Start a one-shot sandbox ahead of its request (see [`crate::Sandbox::prestart`]).
    fn prestart_process(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<PendingRun, SandboxError> {
        Ok(self
            .start(policy, command, true)?
            .into_pending(&policy.limits))
    }
}

/// The [`crate::Backend`] methods `run`, `spawn` and `prestart` of a [`ProcessBackend`], for
/// use inside its `impl Backend` block.
macro_rules! process_backend_methods {
    () => {
        fn run<'a>(
            &'a self,
            policy: &'a crate::Policy,
            command: &'a crate::SandboxCommand,
            cancel: tokio_util::sync::CancellationToken,
            output: Option<tokio::sync::mpsc::UnboundedSender<crate::OutputChunk>>,
        ) -> crate::backend::RunFuture<'a> {
            Box::pin(crate::process::ProcessBackend::run_process(
                self, policy, command, cancel, output,
            ))
        }

        fn spawn(
            &self,
            policy: &crate::Policy,
            command: &crate::SandboxCommand,
        ) -> Result<crate::LiveSandbox, crate::SandboxError> {
            crate::process::ProcessBackend::spawn_process(self, policy, command)
        }

        fn prestart(
            &self,
            policy: &crate::Policy,
            command: &crate::SandboxCommand,
        ) -> Result<crate::PendingRun, crate::SandboxError> {
            crate::process::ProcessBackend::prestart_process(self, policy, command)
        }
    };
}
pub(crate) use process_backend_methods;
