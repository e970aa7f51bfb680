//! The serve lifecycle: what a long-running server starts ([`Engine::start`]) and how it stops
//! ([`Engine::shutdown`]), shared by every entry point (stdio today, HTTP next).
//!
//! Stopping is three steps, in this order, each bounded:
//! 1. **Refuse and cancel** ([`Engine::begin_shutdown`]): new calls are refused with a clear
//!    error; every call in flight has its sandbox killed and is answered with status
//!    `cancelled` and a message saying the server is stopping.
//! 2. **Drain** ([`Engine::wait_idle`]): wait until every call in flight has returned its
//!    record, so the face can still send the replies.
//! 3. **Tear down** ([`Engine::shutdown`]): background tasks, the warm pool and fork servers,
//!    session interpreters, the sessions' disk image, this server's run directories (their
//!    scratch mounts and the runs-root mount) and its cgroups. What a deadline cut short is
//!    forced: cgroup members are SIGKILLed, mounts detached lazily.
//!
//! A call "in flight" is one that holds a [`Call`] (see [`Lifecycle::enter`]): the engine's
//! public entry points that start sandboxes take one first, so none can start after step 1.
//!
//! [`Calls`] is the service every call is admitted through: the lifecycle above, the calls
//! running now, the tenants' quotas, the sandbox slots and host-work threads, and the runs
//! table. The services that run code hold it (an `Arc`) instead of the engine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
#[cfg(test)]
use std::time::Instant;

use snakebox_sandbox::OutputChunk;
use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::tenants;
use crate::{Caller, EngineError, ErrorInfo, ErrorKind, ExecutionResult, Status, Tenant};

/// How often the environment cache is pruned while serving.
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// The bound on each teardown step that waits for something (a pool sandbox, an interpreter).
pub(crate) const STEP_DEADLINE: Duration = Duration::from_secs(5);

/// Why the server stops, for the replies of cancelled calls and for the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// SIGTERM (systemd, Docker, `kill`).
    Terminate,
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// The client closed the server's standard input.
    InputClosed,
    /// The embedding program asked (tests, a face with its own reasons).
    Requested,
}

impl StopReason {
    fn describe(self) -> &'static str {
        match self {
            StopReason::Terminate => "it received SIGTERM",
            StopReason::Interrupt => "it received SIGINT",
            StopReason::InputClosed => "its input was closed",
            StopReason::Requested => "it was asked to stop",
        }
    }
}

/// What [`Engine::shutdown`](crate::Engine::shutdown) did, for the log line that ends a
/// server.
#[derive(Debug, Default, Clone)]
pub struct ShutdownReport {
    /// Calls still running when the drain deadline passed (their sandboxes were killed).
    pub calls_cut_short: usize,
    /// Whether a teardown step hit its deadline and the rest was forced.
    pub forced: bool,
    /// How long the whole shutdown took.
    pub duration_ms: u64,
}

/// The engine's side of the lifecycle: the stop signal, the calls in flight, the background
/// tasks `start` spawned.
#[derive(Default)]
pub(crate) struct Lifecycle {
    /// Fired once by [`Engine::begin_shutdown`]; every call's token is a child of it.
    stop: CancellationToken,
    reason: Mutex<Option<StopReason>>,
    in_flight: AtomicUsize,
    idle: Notify,
    background: Mutex<Vec<JoinHandle<()>>>,
}

/// Admission: the one door every call passes, and what it holds while it runs. The stop
/// signal and the calls in flight ([`Lifecycle`], [`RunningCalls`]), the tenants' quotas of
/// calls per minute, the sandbox slots and host-work threads shared fairly between tenants,
/// and the runs table each tracked call is recorded in. Every service that admits a call or
/// takes a slot holds this (an `Arc`), and nothing more of the engine for it.
pub(crate) struct Calls {
    pub(crate) lifecycle: Lifecycle,
    running: RunningCalls,
    /// The runs table: every tracked call, recorded when admitted and when it returns.
    pub(crate) history: Arc<crate::history::History>,
    /// What each tenant holds of the server, against its quotas.
    tenants: crate::tenants::Tenants,
    /// `--max-concurrent-runs`: every sandbox that does work holds one while it runs (a run,
    /// a session call or command, an install or environment build, a validation compile), in
    /// the name of the tenant it works for, shared fairly between tenants
    /// ([`crate::tenants::FairSlots`]). Taken around one sandbox at a time, never while
    /// holding another, so none can wait on itself.
    pub(crate) runs: Arc<crate::tenants::FairSlots>,
    /// The server's own work on the host for a tenant's call (file tools, reads of the runs
    /// table and artifacts), on a bounded number of threads shared fairly between tenants.
    pub(crate) host: Arc<crate::host_work::HostWork>,
}

/// One call in flight: holds the engine open for its reply. Dropped when the call returns.
pub(crate) struct Call<'a> {
    /// Fires when the caller cancels or the server stops.
    pub(crate) token: CancellationToken,
    /// Ends the task that forwards the caller's cancellation.
    _forward: tokio_util::sync::DropGuard,
    _counted: InFlight<'a>,
}

/// What a running call has printed so far, for a live view (the web UI); at most
/// [`LIVE_MAX_BYTES`] of each stream are kept (the run's own result keeps its usual caps).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LiveOutput {
    /// Standard output so far.
    pub stdout: String,
    /// Standard error so far.
    pub stderr: String,
    /// Whether more was printed than is kept here.
    pub truncated: bool,
}

/// Bytes of each stream a live view keeps.
pub const LIVE_MAX_BYTES: usize = 1024 * 1024;

impl LiveOutput {
    fn push(&mut self, chunk: &OutputChunk) {
        let text = match chunk.stream {
            snakebox_sandbox::Stream::Stdout => &mut self.stdout,
            snakebox_sandbox::Stream::Stderr => &mut self.stderr,
        };
        if text.len() + chunk.text.len() > LIVE_MAX_BYTES {
            self.truncated = true;
            return;
        }
        text.push_str(&chunk.text);
    }
}

/// One tracked call running now.
struct Running {
    owner: crate::Caller,
    token: CancellationToken,
    live: Arc<Mutex<LiveOutput>>,
}

type RunningMap = Arc<Mutex<std::collections::HashMap<String, Running>>>;

/// The tracked calls running now, by execution id.
#[derive(Default)]
pub(crate) struct RunningCalls {
    calls: RunningMap,
}

/// Removes its call from [`RunningCalls`] when the call ends (or its future is dropped).
pub(crate) struct RunningGuard {
    calls: RunningMap,
    id: String,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        lock(&self.calls).remove(&self.id);
    }
}

impl RunningCalls {
    fn add(&self, id: &str, caller: &crate::Caller, token: &CancellationToken) -> RunningGuard {
        lock(&self.calls).insert(
            id.to_owned(),
            Running {
                owner: caller.clone(),
                token: token.clone(),
                live: Arc::default(),
            },
        );
        RunningGuard {
            calls: Arc::clone(&self.calls),
            id: id.to_owned(),
        }
    }

    /// Cancel `caller`'s running call `id`; whether there was one.
    fn cancel(&self, caller: &crate::Caller, id: &str) -> bool {
        let calls = lock(&self.calls);
        match calls.get(id) {
            Some(running) if running.owner == *caller => {
                running.token.cancel();
                true
            }
            _ => false,
        }
    }

    fn live(&self, id: &str) -> Option<Arc<Mutex<LiveOutput>>> {
        lock(&self.calls)
            .get(id)
            .map(|running| Arc::clone(&running.live))
    }

    fn live_of(&self, caller: &crate::Caller, id: &str) -> Option<LiveOutput> {
        let calls = lock(&self.calls);
        let running = calls.get(id).filter(|running| running.owner == *caller)?;
        Some(lock(&running.live).clone())
    }
}

impl Calls {
    /// The output sender a tracked call's run gets: every chunk is also kept in the call's
    /// live output ([`Engine::live_output`]), then passed on to `output` (the client's
    /// progress notifications) when there is one.
    pub(crate) fn live_tee(
        &self,
        id: &str,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Option<UnboundedSender<OutputChunk>> {
        let Some(live) = self.running.live(id) else {
            return output;
        };
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<OutputChunk>();
        tokio::spawn(async move {
            while let Some(chunk) = receiver.recv().await {
                lock(&live).push(&chunk);
                if let Some(output) = &output {
                    // The client may be gone; the run goes on and its live view with it.
                    let _ = output.send(chunk);
                }
            }
        });
        Some(sender)
    }

    /// What one of `caller`'s calls has printed so far, while it runs (`None` once it has
    /// ended, and for another caller's call, as for an id that never existed).
    #[must_use]
    pub(crate) fn live_output(&self, caller: &crate::Caller, id: &str) -> Option<LiveOutput> {
        self.running.live_of(caller, id)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Counts one call in [`Lifecycle::in_flight`] while it lives.
struct InFlight<'a>(&'a Lifecycle);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Lifecycle {
    fn stopping(&self) -> Option<StopReason> {
        if !self.stop.is_cancelled() {
            return None;
        }
        Some(
            self.reason
                .lock()
                .ok()
                .and_then(|reason| *reason)
                .unwrap_or(StopReason::Requested),
        )
    }

    /// Fires when the server begins to stop (for the engine's own background loops).
    pub(crate) fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Keep `tasks` (what `Engine::start` spawned) until [`Lifecycle::take_background`].
    pub(crate) fn keep_background(&self, tasks: impl IntoIterator<Item = JoinHandle<()>>) {
        if let Ok(mut kept) = self.background.lock() {
            kept.extend(tasks);
        }
    }

    /// The background tasks kept, taken (to abort them at shutdown).
    pub(crate) fn take_background(&self) -> Vec<JoinHandle<()>> {
        self.background
            .lock()
            .map(|mut tasks| std::mem::take(&mut *tasks))
            .unwrap_or_default()
    }

    /// Calls in flight now.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// See [`Engine::wait_idle`].
    async fn wait_idle(&self, deadline: Duration) -> usize {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let idle = self.idle.notified();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return 0;
            }
            if tokio::time::timeout_at(until, idle).await.is_err() {
                return self.in_flight.load(Ordering::SeqCst);
            }
        }
    }

    /// Admit a call, or refuse it when the server is stopping. The call's token fires on the
    /// caller's `cancel` or on shutdown, whichever comes first.
    pub(crate) fn enter(&self, cancel: &CancellationToken) -> Result<Call<'_>, EngineError> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let counted = InFlight(self);
        // Checked after counting ourselves in, so `wait_idle` cannot miss a call that races
        // with `begin_shutdown`: either it sees the count, or the call sees the stop.
        if let Some(reason) = self.stopping() {
            return Err(refused(reason));
        }
        let call_token = self.stop.child_token();
        let token = call_token.clone();
        let done = CancellationToken::new();
        let watch = done.clone();
        let caller = cancel.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::select! {
                    () = caller.cancelled() => token.cancel(),
                    () = watch.cancelled() => {}
                }
            });
        }
        Ok(Call {
            token: call_token,
            _forward: done.drop_guard(),
            _counted: counted,
        })
    }
}

/// The error of a call made while the server stops.
fn refused(reason: StopReason) -> EngineError {
    EngineError::new(
        ErrorKind::Unavailable,
        format!(
            "The server is stopping ({}) and takes no new calls",
            reason.describe()
        ),
    )
    .with_hint("call again once the server has been restarted")
}

impl Calls {
    pub(crate) fn new(
        lifecycle: Lifecycle,
        history: Arc<crate::history::History>,
        tenants: crate::tenants::Tenants,
        runs: Arc<crate::tenants::FairSlots>,
        host: crate::host_work::HostWork,
    ) -> Calls {
        Calls {
            lifecycle,
            running: RunningCalls::default(),
            history,
            tenants,
            runs,
            host: Arc::new(host),
        }
    }

    /// The tenant `caller` is for: what it may take of the server and keep in the stores,
    /// and which profiles it may name (the `[tenants]` defaults and its `[tenants.NAME]`).
    pub(crate) fn tenant(&self, caller: &Caller) -> Tenant {
        self.tenants.book().tenant(caller)
    }

    /// A slot of `--max-concurrent-runs` for one sandbox working for `caller` (see
    /// [`Calls::runs`]).
    /// A call cancelled while it waits gets `cancelled`.
    pub(crate) async fn sandbox_slot(
        &self,
        caller: &Caller,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<tenants::Slot, EngineError> {
        let share = self.runs.share(caller);
        tokio::select! {
            slot = share.slot() => slot,
            () = cancel.cancelled() => Err(EngineError::new(
                ErrorKind::Cancelled,
                "The call was cancelled while it waited for a sandbox slot",
            )),
        }
    }

    /// `caller`'s claim on the sandbox slots, for work that goes on after its call (an
    /// install) to hold in its name.
    pub(crate) fn share(&self, caller: &Caller) -> tenants::Share {
        self.runs.share(caller)
    }

    /// Do `work` on the host for `caller`, on the bounded, fairly shared host-work threads
    /// ([`crate::host_work::HostWork`]).
    ///
    /// # Errors
    /// When the work panicked.
    pub(crate) async fn on_host<R: Send + 'static>(
        &self,
        caller: &Caller,
        action: &str,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, EngineError> {
        self.host.run(caller, action, work).await
    }

    /// A slot for the server's own background work (warming, compilation).
    pub(crate) async fn server_slot(&self) -> Result<tenants::Slot, EngineError> {
        self.runs.server_share().slot().await
    }

    /// Step 1 of stopping: refuse new calls and cancel those in flight (each is answered with
    /// status `cancelled`). Idempotent; the first reason is kept.
    pub(crate) fn begin_shutdown(&self, reason: StopReason) {
        if let Ok(mut kept) = self.lifecycle.reason.lock() {
            kept.get_or_insert(reason);
        }
        if !self.lifecycle.stop.is_cancelled() {
            tracing::info!("stopping: {}", reason.describe());
        }
        self.lifecycle.stop.cancel();
    }

    /// Record a call of a tool that runs no code in the audit log (runs are recorded by
    /// [`Engine::execute`] and the session calls themselves): when, tenant, tool, status.
    pub(crate) fn audit_tool_call(&self, caller: &crate::Caller, tool: &str, status: &str) {
        self.history.tool_call(caller, tool, status, None);
    }

    /// Record a call of any tool refused before it ran (an unknown tool, arguments that do
    /// not fit): the tool's name (cut at 200 bytes) and, of `request` (what was sent, as
    /// JSON), only its size and SHA-256.
    pub(crate) fn audit_refused_call(&self, caller: &crate::Caller, tool: &str, request: &str) {
        self.history.tool_call(
            caller,
            tool,
            "refused",
            Some(crate::history::RequestDigest::of(request)),
        );
    }

    /// Whether [`Engine::begin_shutdown`] was called.
    #[must_use]
    pub(crate) fn is_stopping(&self) -> bool {
        self.lifecycle.stop.is_cancelled()
    }

    /// Step 2: wait until no call is in flight, at most `deadline`. Returns how many calls
    /// were still running when it gave up.
    pub(crate) async fn wait_idle(&self, deadline: Duration) -> usize {
        self.lifecycle.wait_idle(deadline).await
    }

    /// Run one call as a call in flight: refused with `refuse`'s result while the server
    /// stops, cancelled when it starts stopping (or the caller cancels: `run` gets the token
    /// of both), and then saying why in its result.
    ///
    /// The call gets its execution id here, and is recorded in the runs table when it is
    /// admitted and when it returns (see [`crate::history`]).
    pub(crate) async fn tracked<Fut>(
        &self,
        caller: &crate::Caller,
        start: crate::history::RunStart,
        cancel: &CancellationToken,
        refuse: impl FnOnce(String, EngineError) -> ExecutionResult,
        run: impl FnOnce(String, CancellationToken) -> Fut,
    ) -> ExecutionResult
    where
        Fut: std::future::Future<Output = ExecutionResult>,
    {
        let execution_id = crate::ids::execution_id();
        let call = match self.enter(cancel) {
            Ok(call) => call,
            Err(error) => return refuse(execution_id, error),
        };
        let kind = start.kind;
        let ticket = self.history.started(&execution_id, caller, start);
        let _running = self.running.add(&execution_id, caller, &call.token);
        // The tenant's quota of calls per minute: a call past it is refused. (Its share of the
        // sandbox slots is taken by each sandbox the call starts: `Calls::sandbox_slot`.)
        let mut result = match self.tenants.admit(caller) {
            Ok(()) => run(execution_id, call.token.clone()).await,
            Err(error) => refuse(execution_id, error),
        };
        self.mark_stopped(&call, &mut result);
        // What the run's path observed itself (blocked imports) comes first.
        let derived = result.derive_events();
        result.events.extend(derived);
        self.history.finished(&ticket, &result);
        crate::telemetry::run_finished(kind, &result);
        result
    }

    /// Cancel one of `caller`'s calls that is running now, by its execution id (a one-shot
    /// run, a session cell or a command): its sandbox is stopped and its call answers
    /// `cancelled`, as when its client cancels it.
    ///
    /// # Errors
    /// `not_found` for an id that is not one of `caller`'s running calls (another caller's
    /// included, answered exactly as an id that never existed, or one that has ended).
    pub(crate) fn cancel_run(&self, caller: &crate::Caller, id: &str) -> Result<(), EngineError> {
        if self.running.cancel(caller, id) {
            return Ok(());
        }
        Err(
            EngineError::new(ErrorKind::NotFound, format!("No running run `{id}`"))
                .with_hint("it has ended (or never existed): list the runs to see how it ended"),
        )
    }

    /// A record of a call cut short by shutdown says so: status `cancelled` and why.
    fn mark_stopped(&self, call: &Call<'_>, result: &mut ExecutionResult) {
        let Some(reason) = self.lifecycle.stopping() else {
            return;
        };
        if !call.token.is_cancelled() || !matches!(result.status, Status::Cancelled) {
            return;
        }
        let session = if result.session_id.is_some() {
            "; the session's files and installed packages are kept, its variables are lost"
        } else {
            ""
        };
        result.error = Some(ErrorInfo {
            kind: Some(ErrorKind::Cancelled),
            message: format!(
                "The server is stopping ({}), so the call was cancelled; output printed before that is kept{session}",
                reason.describe()
            ),
            hint: Some("call again once the server has been restarted".into()),
        });
    }

    /// Refuse a call that starts work (a session, an install) while the server stops.
    pub(crate) fn refuse_if_stopping(&self) -> Result<(), EngineError> {
        self.lifecycle
            .stopping()
            .map_or(Ok(()), |reason| Err(refused(reason)))
    }

    /// Admit a call (see [`Lifecycle::enter`]).
    pub(crate) fn enter(&self, cancel: &CancellationToken) -> Result<Call<'_>, EngineError> {
        self.lifecycle.enter(cancel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_are_refused_after_stop_and_cancelled_during_it() {
        let lifecycle = Lifecycle::default();
        let caller = CancellationToken::new();
        let call = lifecycle.enter(&caller).unwrap();
        assert!(!call.token.is_cancelled());
        lifecycle.stop.cancel();
        assert!(call.token.is_cancelled());
        let refused = lifecycle.enter(&caller).err().unwrap();
        assert!(refused.message.contains("stopping"), "{}", refused.message);
        assert_eq!(lifecycle.in_flight.load(Ordering::SeqCst), 1);
        drop(call);
        assert_eq!(lifecycle.in_flight.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn wait_idle_returns_when_the_last_call_ends_and_is_bounded() {
        let lifecycle = Arc::new(Lifecycle::default());
        let caller = CancellationToken::new();
        // Nothing in flight: at once.
        assert_eq!(lifecycle.wait_idle(Duration::from_secs(5)).await, 0);
        // A call that never returns: the deadline, then the count of calls cut short.
        let stuck = lifecycle.enter(&caller).unwrap();
        let started = Instant::now();
        assert_eq!(lifecycle.wait_idle(Duration::from_millis(100)).await, 1);
        assert!(started.elapsed() < Duration::from_secs(2));
        // A call that returns while we wait: woken by it, long before the deadline.
        let waiter = Arc::clone(&lifecycle);
        let waiting = tokio::spawn(async move { waiter.wait_idle(Duration::from_secs(30)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(stuck);
        let left = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(left, 0);
    }

    #[tokio::test]
    async fn the_callers_cancel_reaches_the_call() {
        let lifecycle = Lifecycle::default();
        let caller = CancellationToken::new();
        let call = lifecycle.enter(&caller).unwrap();
        caller.cancel();
        tokio::time::timeout(Duration::from_secs(5), call.token.cancelled())
            .await
            .unwrap();
        assert!(!lifecycle.stop.is_cancelled());
    }
}
