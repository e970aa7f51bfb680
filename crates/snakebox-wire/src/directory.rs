//! Which agent holds what: the [`Directory`] seam a front routes through, its static form
//! ([`StaticDirectory`], a list of agent URLs: `snakebox serve --agents`), and [`Routed`],
//! the [`EngineApi`] a front's faces hold, which sends each call to the agent the directory
//! names.
//!
//! Why it exists: a session lives in the memory of one agent, so every call on it must reach
//! that agent; one-shot runs may go to any. The directory decides both; how it knows is its
//! own matter (a static list here, Kubernetes claims in `snakebox-kube`, issue 35), so a new kind of
//! directory is a new implementation of the trait, with no edit to the routing.
//!
//! Failures are loud and local: when the agent that holds a session cannot be reached (or
//! breaks off a call), the session's calls answer that the session is lost, naming the agent
//! and what to do; other sessions and one-shot runs go on. A one-shot run or a new session
//! whose agent cannot be reached (nothing was sent) is given to the next agent.
//!
//! A front keeps no state of its own that a restart could lose: the map from session to agent
//! is rebuilt from the agents, a tenant at a time, the first time a session the front does not
//! know is named (each agent's `list_sessions` for that tenant; a tenant sees only its own).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand_core::{OsRng, RngCore};
use snakebox_engine::{
    Artifact, ArtifactContent, ArtifactDownload, Caller, CreateSession, EngineApi, EngineConfig,
    EngineError, EngineHost, EnvironmentReport, ErrorKind, ExecuteRequest, ExecutionResult,
    FileContent, FileList, FileWritten, InstallPackages, InstallStatus, ListFiles, LiveOutput,
    OpenArtifact, OutputSink, PackageList, ReadFile, RunCommand, RunQuery, RunRecord, SessionInfo,
    SessionList, StopReason, ToolCallAudit, ValidateScript, Validation, WriteFile,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::protocol;
use crate::remote::{RemoteEngine, RemoteError, run_ref, session_ref, unreachable_report};

/// An execution id made by the front, for a record no agent made (the call never reached
/// one, or was cancelled before its answer came): `exec-` and 128 random bits, as the
/// engine's own.
#[must_use]
pub fn front_execution_id() -> String {
    let mut id = [0_u8; 16];
    OsRng.fill_bytes(&mut id);
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("exec-{hex}")
}

/// Where a new session is to be made: the agents to try in turn, and what the directory
/// reserved for it (a claim) until the session is bound or abandoned.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The agents to try, the first preferred.
    pub agents: Vec<Arc<RemoteEngine>>,
    /// The directory's own handle on what it reserved (the Kubernetes directory: a claim's
    /// name); `None` when it reserved nothing (the static directory).
    pub ticket: Option<String>,
}

/// Where a front's calls go. Every method is async: a directory may have to ask (a list of
/// agents, the Kubernetes API) or to wait (a claim becoming Ready) before it can answer.
#[async_trait::async_trait]
pub trait Directory: Send + Sync {
    /// The agents a call that any may answer (a one-shot run, a validation, a report) should
    /// try in turn, starting with the one it should go to. May claim one (the Kubernetes
    /// directory's runner claim for the tenant).
    ///
    /// # Errors
    /// When no agent can be had (no claim became Ready in time, the API refused).
    async fn for_calls(&self, caller: &Caller) -> Result<Vec<Arc<RemoteEngine>>, EngineError>;

    /// Where `caller`'s new session is to be made.
    ///
    /// # Errors
    /// When no agent can be had for it.
    async fn place_session(
        &self,
        caller: &Caller,
        request: &CreateSession,
    ) -> Result<Placement, EngineError>;

    /// `session_id` was made on `agent` (one of `placement`'s) and lives there from now on.
    ///
    /// # Errors
    /// When the directory could not record it (the session is then deleted by the caller).
    async fn bind(
        &self,
        caller: &Caller,
        session_id: &str,
        agent: &Arc<RemoteEngine>,
        placement: Placement,
    ) -> Result<(), EngineError>;

    /// Making the session failed: release what `placement` reserved.
    async fn abandon(&self, caller: &Caller, placement: Placement);

    /// The agent that holds `session_id` of `caller`, when the directory knows one.
    ///
    /// # Errors
    /// When the directory knows the session is lost (its claim was deleted, its pod
    /// replaced): the error says so, with what to do.
    async fn holder(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<Option<Arc<RemoteEngine>>, EngineError>;

    /// An agent listed `session_id` of `caller` (a session listing): remember where it is, if
    /// this directory learns that way.
    fn learned(&self, _caller: &Caller, _session_id: &str, _agent: &Arc<RemoteEngine>) {}

    /// `session_id` is gone (deleted by its caller).
    async fn unbind(&self, caller: &Caller, session_id: &str);

    /// Every agent that holds something of `caller`'s (its sessions, its one-shot runs), for
    /// listings and lookups by run id; nothing is claimed for this.
    async fn holding(&self, caller: &Caller) -> Vec<Arc<RemoteEngine>>;

    /// Whether calls can be placed, and if not, why (each problem with its hint). By
    /// default: ready when one of [`Directory::all`] is.
    async fn readiness(&self) -> (bool, Vec<String>) {
        agents_readiness(&self.all()).await
    }

    /// Every agent known now, for readiness.
    fn all(&self) -> Vec<Arc<RemoteEngine>>;
}

/// Ready when one of `agents` is; every other one's problems, with its name.
pub async fn agents_readiness(agents: &[Arc<RemoteEngine>]) -> (bool, Vec<String>) {
    let answers = futures::future::join_all(agents.iter().map(|agent| agent.readiness())).await;
    let mut ready = false;
    let mut problems = Vec::new();
    for (agent, answer) in agents.iter().zip(answers) {
        match answer {
            Ok((true, _)) => ready = true,
            Ok((false, said)) => problems.extend(
                said.into_iter()
                    .map(|problem| format!("engine agent `{}`: {problem}", agent.name())),
            ),
            Err(err) => problems.push(format!("{err}\nhint: {}", err.hint())),
        }
    }
    (ready, problems)
}

/// The error of a session no agent holds, as an engine says it.
#[must_use]
pub fn no_session(session_id: &str) -> EngineError {
    EngineError::new(ErrorKind::NotFound, format!("No session `{session_id}`")).with_hint(
        "call list_sessions to see the sessions that exist, or create_session to start one (sessions unused for a long time are deleted)",
    )
}

/// A fixed list of agents (`--agents`): one-shot runs and new sessions round-robin over
/// them; each session stays on the agent that created it.
pub struct StaticDirectory {
    agents: Vec<Arc<RemoteEngine>>,
    next: AtomicUsize,
    sessions: Mutex<HashMap<String, Arc<RemoteEngine>>>,
}

impl StaticDirectory {
    /// A directory of `agents` (at least one).
    ///
    /// # Errors
    /// When `agents` is empty.
    pub fn new(agents: Vec<RemoteEngine>) -> Result<StaticDirectory, EngineError> {
        if agents.is_empty() {
            return Err(EngineError::invalid(
                "no engine agents were given",
                "pass at least one agent: --agents http://HOST:PORT[,…]",
            ));
        }
        Ok(StaticDirectory {
            agents: agents.into_iter().map(Arc::new).collect(),
            next: AtomicUsize::new(0),
            sessions: Mutex::new(HashMap::new()),
        })
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<RemoteEngine>>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every agent, round-robin: starting one further each time.
    fn turn(&self) -> Vec<Arc<RemoteEngine>> {
        let start = self.next.fetch_add(1, Ordering::Relaxed) % self.agents.len();
        self.agents[start..]
            .iter()
            .chain(&self.agents[..start])
            .cloned()
            .collect()
    }
}

#[async_trait::async_trait]
impl Directory for StaticDirectory {
    async fn for_calls(&self, _caller: &Caller) -> Result<Vec<Arc<RemoteEngine>>, EngineError> {
        Ok(self.turn())
    }

    async fn place_session(
        &self,
        _caller: &Caller,
        _request: &CreateSession,
    ) -> Result<Placement, EngineError> {
        Ok(Placement {
            agents: self.turn(),
            ticket: None,
        })
    }

    async fn bind(
        &self,
        _caller: &Caller,
        session_id: &str,
        agent: &Arc<RemoteEngine>,
        _placement: Placement,
    ) -> Result<(), EngineError> {
        self.sessions()
            .insert(session_id.to_owned(), Arc::clone(agent));
        Ok(())
    }

    async fn abandon(&self, _caller: &Caller, _placement: Placement) {}

    async fn holder(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<Option<Arc<RemoteEngine>>, EngineError> {
        if let Some(agent) = self.sessions().get(session_id) {
            return Ok(Some(Arc::clone(agent)));
        }
        // Not known here (a front started after the session was made): ask the agents for the
        // caller's sessions, and remember what they hold.
        let lists = futures::future::join_all(self.agents.iter().map(|agent| async move {
            let answer: Result<Result<SessionList, EngineError>, RemoteError> =
                agent.call(protocol::LIST_SESSIONS, caller, None, &()).await;
            (agent, answer)
        }))
        .await;
        let mut sessions = self.sessions();
        for (agent, answer) in lists {
            match answer {
                Ok(Ok(list)) => {
                    for session in list.sessions {
                        sessions.insert(session.session_id, Arc::clone(agent));
                    }
                }
                Ok(Err(err)) => {
                    tracing::warn!(agent = agent.name(), %err, "could not list an agent's sessions")
                }
                Err(err) => {
                    tracing::warn!(agent = agent.name(), %err, "could not list an agent's sessions")
                }
            }
        }
        Ok(sessions.get(session_id).cloned())
    }

    fn learned(&self, _caller: &Caller, session_id: &str, agent: &Arc<RemoteEngine>) {
        self.sessions()
            .insert(session_id.to_owned(), Arc::clone(agent));
    }

    async fn unbind(&self, _caller: &Caller, session_id: &str) {
        self.sessions().remove(session_id);
    }

    async fn holding(&self, _caller: &Caller) -> Vec<Arc<RemoteEngine>> {
        self.turn()
    }

    fn all(&self) -> Vec<Arc<RemoteEngine>> {
        self.agents.clone()
    }
}

/// How often a front asks its agents whether they are ready.
pub const READINESS_INTERVAL: Duration = Duration::from_secs(5);

/// The engine API of a front: each call to the agent its [`Directory`] names. It is the
/// front's [`EngineHost`] too: its settings are this process's, its readiness the agents'
/// (ready when one is), and stopping it cancels the calls it has in flight on the agents
/// (their clients get `cancelled` records) and waits for them to return.
pub struct Routed {
    directory: Arc<dyn Directory>,
    host: Arc<dyn EngineHost>,
    /// Cancelled when the front stops: the calls in flight are cancelled, new ones refused.
    stopping: CancellationToken,
    in_flight: AtomicUsize,
    idle: Notify,
    /// What the agents said last (`None`: not asked yet).
    readiness: Mutex<Option<Readiness>>,
}

/// The agents' readiness, as last asked.
#[derive(Debug, Clone)]
struct Readiness {
    /// At least one agent can run code.
    ready: bool,
    /// What every agent that cannot said, with its name.
    problems: Vec<String>,
}

/// One call in flight on a front, counted until it returns.
struct InFlight<'a>(&'a Routed);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Routed {
    /// Calls routed by `directory`; `host` is this process (its settings, and what a report
    /// says when no agent answers).
    #[must_use]
    pub fn new(directory: Arc<dyn Directory>, host: Arc<dyn EngineHost>) -> Routed {
        Routed {
            directory,
            host,
            stopping: CancellationToken::new(),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            readiness: Mutex::new(None),
        }
    }

    /// Ask every agent whether it is ready, now and then every [`READINESS_INTERVAL`] until
    /// the front stops (the first answers are in when this returns).
    pub async fn watch_readiness(self: &Arc<Self>) {
        self.poll_readiness().await;
        let routed = Arc::downgrade(self);
        let stopping = self.stopping.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stopping.cancelled() => return,
                    () = tokio::time::sleep(READINESS_INTERVAL) => {}
                }
                let Some(routed) = routed.upgrade() else {
                    return;
                };
                routed.poll_readiness().await;
            }
        });
    }

    async fn poll_readiness(&self) {
        let (ready, problems) = self.directory.readiness().await;
        *self
            .readiness
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Readiness { ready, problems });
    }

    /// Count a call in flight; refused when the front is stopping.
    fn admit(&self) -> Result<InFlight<'_>, EngineError> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(self);
        if self.stopping.is_cancelled() {
            return Err(EngineError::new(
                ErrorKind::Unavailable,
                "The front is stopping and takes no new calls",
            )
            .with_hint("call again in a moment (another front, or this one restarted)"));
        }
        Ok(guard)
    }

    /// A token cancelled when `cancel` is or the front stops, and the task that links them
    /// (ended by cancelling the token).
    fn linked(&self, cancel: CancellationToken) -> CancellationToken {
        let linked = self.stopping.child_token();
        let watch = linked.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => watch.cancel(),
                () = watch.cancelled() => {}
            }
        });
        linked
    }

    /// The first answer of the directory's agents for a call any may answer, in turn,
    /// passing over an agent that could not be reached (nothing was sent to it).
    async fn any<T, F, Fut>(
        &self,
        caller: &Caller,
        call: F,
    ) -> Result<(T, Arc<RemoteEngine>), EngineError>
    where
        F: Fn(Arc<RemoteEngine>) -> Fut,
        Fut: std::future::Future<Output = Result<T, RemoteError>>,
    {
        let agents = self.directory.for_calls(caller).await?;
        in_turn(agents, call)
            .await
            .map_err(RemoteError::into_engine)
    }

    /// A call on `session_id`: to the agent that holds it. An agent that is gone means the
    /// session is lost; a session no agent holds is not found, as for an id that never
    /// existed.
    async fn on_session<T, F, Fut>(
        &self,
        caller: &Caller,
        session_id: &str,
        call: F,
    ) -> Result<T, EngineError>
    where
        F: Fn(Arc<RemoteEngine>) -> Fut,
        Fut: std::future::Future<Output = Result<Result<T, EngineError>, RemoteError>>,
    {
        match self.directory.holder(caller, session_id).await? {
            Some(agent) => match call(Arc::clone(&agent)).await {
                Ok(answer) => answer,
                Err(err) if err.agent_gone() => Err(session_lost(session_id, &agent, &err)),
                Err(err) => Err(err.into_engine()),
            },
            None => Err(no_session(session_id)),
        }
    }

    /// For a run, an agent by run id: each agent in turn until one knows it.
    async fn on_run<T, F, Fut>(&self, caller: &Caller, call: F) -> Result<T, EngineError>
    where
        F: Fn(Arc<RemoteEngine>) -> Fut,
        Fut: std::future::Future<Output = Result<Result<T, EngineError>, RemoteError>>,
    {
        let mut last = None;
        for agent in self.directory.holding(caller).await {
            match call(agent).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(err)) if err.kind == ErrorKind::NotFound => last = Some(err),
                Ok(Err(err)) => return Err(err),
                Err(err) => {
                    tracing::warn!(%err, "an agent did not answer about a run");
                    last.get_or_insert(err.into_engine());
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            EngineError::new(ErrorKind::NotFound, "no such run").with_hint("list your runs")
        }))
    }

    /// An `Option` answer by run id: the first agent that has one.
    async fn on_run_maybe<T, F, Fut>(&self, caller: &Caller, call: F) -> Option<T>
    where
        F: Fn(Arc<RemoteEngine>) -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>, RemoteError>>,
    {
        for agent in self.directory.holding(caller).await {
            if let Ok(Some(answer)) = call(agent).await {
                return Some(answer);
            }
        }
        None
    }

    /// What every agent answers, from those that do.
    async fn every<T, F, Fut>(&self, caller: &Caller, call: F) -> Vec<T>
    where
        F: Fn(Arc<RemoteEngine>) -> Fut,
        Fut: std::future::Future<Output = Result<T, RemoteError>>,
    {
        let answers =
            futures::future::join_all(self.directory.holding(caller).await.into_iter().map(call))
                .await;
        answers
            .into_iter()
            .filter_map(|answer| {
                answer
                    .map_err(|err| tracing::warn!(%err, "an agent did not answer a listing"))
                    .ok()
            })
            .collect()
    }
}

/// The first answer of `agents` in turn, passing over an agent that could not be reached
/// (nothing was sent to it).
async fn in_turn<T, F, Fut>(
    agents: Vec<Arc<RemoteEngine>>,
    call: F,
) -> Result<(T, Arc<RemoteEngine>), RemoteError>
where
    F: Fn(Arc<RemoteEngine>) -> Fut,
    Fut: std::future::Future<Output = Result<T, RemoteError>>,
{
    let mut last = None;
    for agent in agents {
        match call(Arc::clone(&agent)).await {
            Ok(answer) => return Ok((answer, agent)),
            Err(err) if err.nothing_sent() => {
                tracing::warn!(agent = agent.name(), %err, "an agent could not be reached; trying the next");
                last = Some(err);
            }
            Err(err) => return Err(err),
        }
    }
    Err(last.unwrap_or_else(|| RemoteError::Unreachable {
        agent: "(none)".into(),
        url: String::new(),
        cause: "the directory names no agent".into(),
    }))
}

/// The error of a session whose agent is gone.
fn session_lost(session_id: &str, agent: &RemoteEngine, err: &RemoteError) -> EngineError {
    lost_session(
        session_id,
        &format!(
            "the engine agent `{}` that held it does not answer ({err})",
            agent.name()
        ),
    )
}

/// The error of a session that is lost, and `why`: its interpreter's state is gone, and what
/// to do.
#[must_use]
pub fn lost_session(session_id: &str, why: &str) -> EngineError {
    EngineError::new(
        ErrorKind::SessionLost,
        format!(
            "The session `{session_id}` is lost: {why}; its interpreter's state (variables, imports) is gone"
        ),
    )
    .with_hint(
        "create a new session and run its setup again (files survive only where the agent keeps them on a volume); other sessions and one-shot runs are not affected",
    )
}

/// A run's record when its call did not reach an engine's answer.
fn not_run(error: EngineError) -> ExecutionResult {
    ExecutionResult::not_run(front_execution_id(), error)
}

#[async_trait::async_trait]
impl EngineApi for Routed {
    async fn execute(
        &self,
        caller: &Caller,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<OutputSink>,
    ) -> ExecutionResult {
        let _call = match self.admit() {
            Ok(call) => call,
            Err(error) => return not_run(error),
        };
        let cancel = self.linked(cancel);
        let _unlink = cancel.clone().drop_guard();
        let session = request.session_id.clone();
        let run = |agent: Arc<RemoteEngine>| {
            let (request, cancel, output, session) =
                (&request, &cancel, output.clone(), session.clone());
            async move {
                agent
                    .run(
                        protocol::EXECUTE,
                        caller,
                        session.as_deref(),
                        request,
                        cancel,
                        output,
                    )
                    .await
                    .map(Ok)
            }
        };
        let answer = match &session {
            Some(session) => self.on_session(caller, session, run).await,
            None => self.any(caller, run).await.and_then(|(answer, _)| answer),
        };
        answer.unwrap_or_else(not_run)
    }

    async fn run_command(
        &self,
        caller: &Caller,
        request: RunCommand,
        cancel: CancellationToken,
        output: Option<OutputSink>,
    ) -> ExecutionResult {
        let _call = match self.admit() {
            Ok(call) => call,
            Err(error) => return not_run(error),
        };
        let cancel = self.linked(cancel);
        let _unlink = cancel.clone().drop_guard();
        self.on_session(caller, &request.session_id, |agent| {
            let (request, cancel, output) = (&request, &cancel, output.clone());
            async move {
                agent
                    .run(
                        protocol::RUN_COMMAND,
                        caller,
                        Some(&request.session_id),
                        request,
                        cancel,
                        output,
                    )
                    .await
                    .map(Ok)
            }
        })
        .await
        .unwrap_or_else(not_run)
    }

    async fn create_session(
        &self,
        caller: &Caller,
        request: CreateSession,
    ) -> Result<SessionInfo, EngineError> {
        let _call = self.admit()?;
        let placement = self.directory.place_session(caller, &request).await?;
        let made = in_turn(placement.agents.clone(), |agent| {
            let request = &request;
            async move {
                agent
                    .call::<Result<SessionInfo, EngineError>>(
                        protocol::CREATE_SESSION,
                        caller,
                        None,
                        request,
                    )
                    .await
            }
        })
        .await
        .map_err(RemoteError::into_engine);
        let (info, agent) = match made {
            Ok((Ok(info), agent)) => (info, agent),
            Ok((Err(err), _)) | Err(err) => {
                self.directory.abandon(caller, placement).await;
                return Err(err);
            }
        };
        if let Err(err) = self
            .directory
            .bind(caller, &info.session_id, &agent, placement)
            .await
        {
            // A session the directory cannot find again would be an orphan: take it back.
            let deleted: Result<Result<(), EngineError>, RemoteError> = agent
                .call(
                    protocol::DELETE_SESSION,
                    caller,
                    Some(&info.session_id),
                    &session_ref(&info.session_id),
                )
                .await;
            if !matches!(deleted, Ok(Ok(()))) {
                tracing::warn!(session = %info.session_id, "could not delete a session the directory did not record");
            }
            return Err(err);
        }
        Ok(info)
    }

    /// Every agent holding something of the caller's lists its sessions; when none does (the
    /// Kubernetes directory before a tenant's first claim), the agent of its one-shot runs
    /// answers, so that the listing carries its limits.
    async fn list_sessions(&self, caller: &Caller) -> Result<SessionList, EngineError> {
        let mut agents = self.directory.holding(caller).await;
        if agents.is_empty() {
            agents = self.directory.for_calls(caller).await?;
        }
        let lists = futures::future::join_all(agents.into_iter().map(|agent| async move {
            let list: Result<SessionList, EngineError> = agent
                .call(protocol::LIST_SESSIONS, caller, None, &())
                .await?;
            Ok::<_, RemoteError>((agent, list))
        }))
        .await
        .into_iter()
        .filter_map(|answer| {
            answer
                .map_err(|err| tracing::warn!(%err, "an agent did not answer a listing"))
                .ok()
        });
        let mut merged: Option<SessionList> = None;
        for (agent, list) in lists {
            let list = list?;
            for session in &list.sessions {
                self.directory.learned(caller, &session.session_id, &agent);
            }
            match &mut merged {
                None => merged = Some(list),
                Some(merged) => {
                    merged.sessions.extend(list.sessions);
                    merged.used_disk_bytes += list.used_disk_bytes;
                    merged.tenant_used_disk_bytes += list.tenant_used_disk_bytes;
                }
            }
        }
        let mut merged = merged.ok_or_else(|| {
            EngineError::new(ErrorKind::Unavailable, "no engine agent answered")
                .with_hint("check that the agents run and that this front can reach them")
        })?;
        merged
            .sessions
            .sort_by_key(|session| std::cmp::Reverse(session.last_used_at));
        Ok(merged)
    }

    async fn delete_session(&self, caller: &Caller, session_id: &str) -> Result<(), EngineError> {
        let deleted = self
            .on_session(caller, session_id, |agent| async move {
                agent
                    .call(
                        protocol::DELETE_SESSION,
                        caller,
                        Some(session_id),
                        &session_ref(session_id),
                    )
                    .await
            })
            .await;
        if deleted.is_ok() {
            self.directory.unbind(caller, session_id).await;
        }
        deleted
    }

    async fn reset_session(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<SessionInfo, EngineError> {
        self.on_session(caller, session_id, |agent| async move {
            agent
                .call(
                    protocol::RESET_SESSION,
                    caller,
                    Some(session_id),
                    &session_ref(session_id),
                )
                .await
        })
        .await
    }

    async fn install_packages(
        &self,
        caller: &Caller,
        request: InstallPackages,
        progress: Option<OutputSink>,
    ) -> Result<InstallStatus, EngineError> {
        let _call = self.admit()?;
        self.on_session(caller, &request.session_id.clone(), |agent| {
            let (request, progress) = (&request, progress.clone());
            async move { agent.install(caller, request, progress).await }
        })
        .await
    }

    async fn list_packages(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<PackageList, EngineError> {
        self.on_session(caller, session_id, |agent| async move {
            agent
                .call(
                    protocol::LIST_PACKAGES,
                    caller,
                    Some(session_id),
                    &session_ref(session_id),
                )
                .await
        })
        .await
    }

    async fn write_file(
        &self,
        caller: &Caller,
        request: WriteFile,
    ) -> Result<FileWritten, EngineError> {
        self.on_session(caller, &request.session_id, |agent| {
            let request = &request;
            async move {
                agent
                    .call(
                        protocol::WRITE_FILE,
                        caller,
                        Some(&request.session_id),
                        request,
                    )
                    .await
            }
        })
        .await
    }

    async fn read_file(
        &self,
        caller: &Caller,
        request: ReadFile,
    ) -> Result<FileContent, EngineError> {
        self.on_session(caller, &request.session_id, |agent| {
            let request = &request;
            async move {
                agent
                    .call(
                        protocol::READ_FILE,
                        caller,
                        Some(&request.session_id),
                        request,
                    )
                    .await
            }
        })
        .await
    }

    async fn list_files(
        &self,
        caller: &Caller,
        request: ListFiles,
    ) -> Result<FileList, EngineError> {
        self.on_session(caller, &request.session_id, |agent| {
            let request = &request;
            async move {
                agent
                    .call(
                        protocol::LIST_FILES,
                        caller,
                        Some(&request.session_id),
                        request,
                    )
                    .await
            }
        })
        .await
    }

    async fn validate(
        &self,
        caller: &Caller,
        request: ValidateScript,
    ) -> Result<Validation, EngineError> {
        self.any(caller, |agent| {
            let request = &request;
            async move { agent.call(protocol::VALIDATE, caller, None, request).await }
        })
        .await
        .and_then(|(answer, _)| answer)
    }

    async fn report_for(&self, caller: &Caller) -> EnvironmentReport {
        match self
            .any(caller, |agent| async move {
                agent
                    .call::<EnvironmentReport>(protocol::REPORT, caller, None, &())
                    .await
            })
            .await
        {
            Ok((report, _)) => report,
            Err(err) => unreachable_report(self.host.as_ref(), &err),
        }
    }

    async fn list_runs(&self, caller: &Caller, query: RunQuery) -> Vec<RunRecord> {
        let session = query.session_id.clone();
        let lists = self
            .every(caller, |agent| {
                let (query, session) = (&query, session.clone());
                async move {
                    agent
                        .call::<Vec<RunRecord>>(
                            protocol::LIST_RUNS,
                            caller,
                            session.as_deref(),
                            query,
                        )
                        .await
                }
            })
            .await;
        let mut runs: Vec<RunRecord> = lists.into_iter().flatten().collect();
        runs.sort_by_key(|run| std::cmp::Reverse(run.started_at_ms));
        runs.truncate(query.limit);
        runs
    }

    async fn run_record(
        &self,
        caller: &Caller,
        execution_id: &str,
    ) -> Result<RunRecord, EngineError> {
        self.on_run(caller, |agent| async move {
            agent
                .call(protocol::RUN_RECORD, caller, None, &run_ref(execution_id))
                .await
        })
        .await
    }

    async fn run_output(&self, caller: &Caller, execution_id: &str) -> Option<serde_json::Value> {
        self.on_run_maybe(caller, |agent| async move {
            agent
                .call(protocol::RUN_OUTPUT, caller, None, &run_ref(execution_id))
                .await
        })
        .await
    }

    async fn live_output(&self, caller: &Caller, execution_id: &str) -> Option<LiveOutput> {
        self.on_run_maybe(caller, |agent| async move {
            agent
                .call(protocol::LIVE_OUTPUT, caller, None, &run_ref(execution_id))
                .await
        })
        .await
    }

    async fn cancel_run(&self, caller: &Caller, execution_id: &str) -> Result<(), EngineError> {
        self.on_run(caller, |agent| async move {
            agent
                .call(protocol::CANCEL_RUN, caller, None, &run_ref(execution_id))
                .await
        })
        .await
    }

    async fn list_artifacts(&self, caller: &Caller, limit: usize) -> Vec<Artifact> {
        let lists = self
            .every(caller, |agent| async move {
                agent
                    .call::<Vec<Artifact>>(
                        protocol::LIST_ARTIFACTS,
                        caller,
                        None,
                        &protocol::ArtifactLimit { limit },
                    )
                    .await
            })
            .await;
        let mut artifacts: Vec<Artifact> = lists.into_iter().flatten().collect();
        artifacts.truncate(limit);
        artifacts
    }

    async fn read_artifact(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<ArtifactContent, EngineError> {
        self.on_run(caller, |agent| async move {
            agent
                .call(
                    protocol::READ_ARTIFACT,
                    caller,
                    None,
                    &protocol::ArtifactRef { uri: uri.into() },
                )
                .await
        })
        .await
    }

    async fn open_artifact(
        &self,
        caller: &Caller,
        request: OpenArtifact,
    ) -> Result<ArtifactDownload, EngineError> {
        self.on_run(caller, |agent| {
            let request = &request;
            async move { agent.open(caller, request).await }
        })
        .await
    }

    /// Recorded by an agent that already holds something of the caller's. When none does (the
    /// Kubernetes directory before a tenant's first claim), by one a one-shot call would go
    /// to, after the answer (so that auditing a call never holds its answer back for a claim).
    async fn audit_tool_call(&self, caller: &Caller, audit: ToolCallAudit) {
        let agents = self.directory.holding(caller).await;
        if agents.is_empty() {
            let (directory, caller) = (Arc::clone(&self.directory), caller.clone());
            tokio::spawn(async move {
                match directory.for_calls(&caller).await {
                    Ok(agents) => record_audit(agents, &caller, &audit).await,
                    Err(err) => {
                        tracing::warn!(%err, "could not record a tool call in an agent's audit log");
                    }
                }
            });
            return;
        }
        record_audit(agents, caller, &audit).await;
    }
}

/// Record `audit` on the first of `agents` that takes it.
async fn record_audit(agents: Vec<Arc<RemoteEngine>>, caller: &Caller, audit: &ToolCallAudit) {
    let sent = in_turn(agents, |agent| async move {
        agent
            .call::<()>(protocol::AUDIT_TOOL_CALL, caller, None, audit)
            .await
    })
    .await;
    if let Err(err) = sent {
        tracing::warn!(%err, "could not record a tool call in an agent's audit log");
    }
}

#[async_trait::async_trait]
impl EngineHost for Routed {
    fn config(&self) -> &EngineConfig {
        self.host.config()
    }

    fn artifact_retention(&self) -> String {
        self.host.artifact_retention()
    }

    /// This process's report, ready when an agent is (as last asked), with every agent's
    /// problems.
    fn report(&self) -> EnvironmentReport {
        let mut report = self.host.report();
        let readiness = self
            .readiness
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match readiness {
            None => {
                report.ready = false;
                report.problems =
                    vec!["the engine agents have not been asked yet\nhint: wait a moment".into()];
            }
            Some(readiness) => {
                report.ready = readiness.ready;
                report.problems = readiness.problems;
            }
        }
        report
    }

    fn publish_gauges(&self) {
        self.host.publish_gauges();
    }

    fn begin_shutdown(&self, reason: StopReason) {
        self.stopping.cancel();
        self.host.begin_shutdown(reason);
    }

    async fn wait_idle(&self, deadline: Duration) -> usize {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let idle = self.idle.notified();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                break;
            }
            if tokio::time::timeout_at(until, idle).await.is_err() {
                return self.in_flight.load(Ordering::SeqCst);
            }
        }
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        self.host.wait_idle(left).await
    }

    /// The front's own host work (shaping its answers) runs on the front's threads, in the
    /// caller's fair part of them, as on one host.
    async fn host_work(
        &self,
        caller: &Caller,
        action: &str,
        work: Box<dyn FnOnce() + Send>,
    ) -> Result<(), EngineError> {
        self.host.host_work(caller, action, work).await
    }
}
