//! The front's side of the wire: [`RemoteEngine`], the [`EngineApi`] of one `snakebox agent`,
//! called over its internal HTTP API ([`crate::protocol`]).
//!
//! Why it exists: the faces hold an `Arc<dyn EngineApi>` and must not notice whether the
//! engine is in their process or behind a wire. Each call signs a fresh grant token with the
//! front's key ([`FrontKey`]): for this agent's name, the caller's tenant, the session the
//! call acts on, valid [`TOKEN_LIFETIME`] and once.
//!
//! Failures of the wire are kept apart from the engine's answers ([`RemoteError`]): an agent
//! that cannot be reached, or that broke off mid-answer, is what the front's directory turns
//! into "session lost" for the sessions it held ([`crate::directory`]); nothing else should.
//!
//! What is given up: a run cancelled from the front closes its connection (the agent cancels
//! the run); the front answers a `cancelled` record of its own, with its own execution id,
//! since the agent's record never arrives.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::TryStreamExt;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;
use snakebox_engine::{
    Artifact, ArtifactContent, ArtifactDownload, ArtifactHead, Caller, CreateSession, EngineApi,
    EngineError, EngineHost, EnvironmentReport, ErrorKind, ExecuteRequest, ExecutionResult,
    FileContent, FileList, FileWritten, InstallPackages, InstallStatus, ListFiles, LiveOutput,
    OpenArtifact, OutputSink, PackageList, ReadFile, RunCommand, RunQuery, RunRecord, SessionInfo,
    SessionList, ToolCallAudit, ValidateScript, Validation, WireExecution, WriteFile,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

use crate::protocol::{self, AgentRefusal, ArtifactLimit, ArtifactRef, Frame, RunRef, SessionRef};
use crate::token::FrontKey;

/// How long each call's token is valid: long enough for a call to reach an agent whose clock
/// is a few seconds apart, far below [`crate::MAX_LIFETIME`].
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(30);

/// How long connecting to an agent may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a call to an agent did not bring the engine's answer.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The agent could not be reached (nothing was sent).
    #[error("Could not reach the engine agent `{agent}` at `{url}`: {cause}")]
    Unreachable {
        /// The agent's name.
        agent: String,
        /// Its URL.
        url: String,
        /// What the connection said.
        cause: String,
    },
    /// The connection broke while the call was sent or answered (the agent may have died).
    #[error("The engine agent `{agent}` at `{url}` broke off the call: {cause}")]
    BrokenOff {
        /// The agent's name.
        agent: String,
        /// Its URL.
        url: String,
        /// What the connection said.
        cause: String,
    },
    /// The agent refused the call before running anything (a token or a body it does not
    /// accept).
    #[error("The engine agent `{agent}` refused the call ({status}): {message}")]
    Refused {
        /// The agent's name.
        agent: String,
        /// The HTTP status.
        status: u16,
        /// What it said.
        message: String,
        /// Its hint.
        hint: String,
    },
    /// The agent answered something this front cannot read (another version?).
    #[error("The engine agent `{agent}` answered something unreadable: {cause}")]
    Unreadable {
        /// The agent's name.
        agent: String,
        /// What was wrong with it.
        cause: String,
    },
    /// This front could not sign the call's token.
    #[error("Could not sign a token for the engine agent `{agent}`: {cause}")]
    Signing {
        /// The agent's name.
        agent: String,
        /// Why.
        cause: String,
    },
}

impl RemoteError {
    /// Nothing reached the agent: another agent may take the call instead.
    #[must_use]
    pub fn nothing_sent(&self) -> bool {
        matches!(self, RemoteError::Unreachable { .. })
    }

    /// The agent is gone (or going): what it held in memory may be lost.
    #[must_use]
    pub fn agent_gone(&self) -> bool {
        matches!(
            self,
            RemoteError::Unreachable { .. } | RemoteError::BrokenOff { .. }
        )
    }

    /// How to fix it.
    #[must_use]
    pub fn hint(&self) -> String {
        match self {
            RemoteError::Unreachable { .. } | RemoteError::BrokenOff { .. } => "check that the agent runs and that this front can reach its address (`curl URL/healthz`); retry".into(),
            RemoteError::Refused { hint, .. } => hint.clone(),
            RemoteError::Unreadable { .. } => "run the same snakebox version on the fronts and the agents".into(),
            RemoteError::Signing { .. } => "check the front's key (--front-key)".into(),
        }
    }

    /// As the engine's error kind a face maps: an agent that cannot answer is `unavailable`.
    #[must_use]
    pub fn into_engine(self) -> EngineError {
        let hint = self.hint();
        let kind = match &self {
            RemoteError::Unreachable { .. }
            | RemoteError::BrokenOff { .. }
            | RemoteError::Refused { .. } => ErrorKind::Unavailable,
            RemoteError::Unreadable { .. } | RemoteError::Signing { .. } => ErrorKind::Internal,
        };
        EngineError::new(kind, self.to_string()).with_hint(hint)
    }
}

/// One engine agent, as a front calls it.
pub struct RemoteEngine {
    name: String,
    url: String,
    key: Arc<FrontKey>,
    client: Client<HttpConnector, Full<Bytes>>,
    /// This process: what `report_for` answers, not ready, when the agent does not.
    host: Arc<dyn EngineHost>,
}

impl std::fmt::Debug for RemoteEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteEngine")
            .field("name", &self.name)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl RemoteEngine {
    /// The agent named `name` (the name it was started with, `snakebox agent --name`) at
    /// `url` (`http://host:port`), called with tokens signed by `key`, from the process
    /// `host`.
    ///
    /// # Errors
    /// When `url` is not an `http://` URL.
    pub fn new(
        name: &str,
        url: &str,
        key: Arc<FrontKey>,
        host: Arc<dyn EngineHost>,
    ) -> Result<RemoteEngine, EngineError> {
        let url = url.trim_end_matches('/');
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(EngineError::invalid(
                format!("`{url}` is not an agent URL"),
                "write an agent as http://HOST:PORT (the internal API is plain HTTP on the agents' own network)",
            ));
        };
        if rest.is_empty() || rest.contains('/') {
            return Err(EngineError::invalid(
                format!("`{url}` is not an agent URL"),
                "write an agent as http://HOST:PORT, without a path",
            ));
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(RemoteEngine {
            name: name.into(),
            url: url.into(),
            key,
            client,
            host,
        })
    }

    /// The agent's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The agent's URL.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    fn unreachable(&self, cause: impl std::fmt::Display) -> RemoteError {
        RemoteError::Unreachable {
            agent: self.name.clone(),
            url: self.url.clone(),
            cause: cause.to_string(),
        }
    }

    fn broken(&self, cause: impl std::fmt::Display) -> RemoteError {
        RemoteError::BrokenOff {
            agent: self.name.clone(),
            url: self.url.clone(),
            cause: cause.to_string(),
        }
    }

    fn unreadable(&self, cause: impl std::fmt::Display) -> RemoteError {
        RemoteError::Unreadable {
            agent: self.name.clone(),
            cause: cause.to_string(),
        }
    }

    /// Send `body` to `route` for `caller` (on `session`): the response, when the agent took
    /// the call (`200`).
    async fn post(
        &self,
        route: &str,
        caller: &Caller,
        session: Option<&str>,
        body: &impl Serialize,
    ) -> Result<hyper::Response<Incoming>, RemoteError> {
        let token = self
            .key
            .sign(
                &self.name,
                caller.id(),
                session,
                TOKEN_LIFETIME,
                SystemTime::now(),
            )
            .map_err(|err| RemoteError::Signing {
                agent: self.name.clone(),
                cause: err.to_string(),
            })?;
        let json = serde_json::to_vec(body).map_err(|err| self.unreadable(err))?;
        let request = hyper::Request::post(format!("{}{route}", self.url))
            .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(json)))
            .map_err(|err| self.unreadable(err))?;
        let response = self.client.request(request).await.map_err(|err| {
            if err.is_connect() {
                self.unreachable(error_chain(&err))
            } else {
                self.broken(error_chain(&err))
            }
        })?;
        if response.status() == StatusCode::OK {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|err| self.broken(err))?
            .to_bytes();
        let (message, hint) = match serde_json::from_slice::<AgentRefusal>(&bytes) {
            Ok(refusal) => (refusal.message, refusal.hint),
            Err(_) => (
                String::from_utf8_lossy(&bytes).trim().to_owned(),
                "check that the URL is a snakebox agent's".to_owned(),
            ),
        };
        Err(RemoteError::Refused {
            agent: self.name.clone(),
            status,
            message,
            hint,
        })
    }

    /// The agent's `/readyz`: whether it can run code, and if not, why (also when it was
    /// started under another name than this front signs for: every call would be refused).
    ///
    /// # Errors
    /// When it does not answer (within 5 s).
    pub async fn readiness(&self) -> Result<(bool, Vec<String>), RemoteError> {
        let request = hyper::Request::get(format!("{}/readyz", self.url))
            .body(Full::new(Bytes::new()))
            .map_err(|err| self.unreadable(err))?;
        let answer = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let response = self.client.request(request).await.map_err(|err| {
                if err.is_connect() {
                    self.unreachable(error_chain(&err))
                } else {
                    self.broken(error_chain(&err))
                }
            })?;
            response
                .into_body()
                .collect()
                .await
                .map_err(|err| self.broken(err))
                .map(http_body_util::Collected::to_bytes)
        })
        .await
        .map_err(|_| self.unreachable("no answer to /readyz in time"))??;
        #[derive(serde::Deserialize)]
        struct Ready {
            ready: bool,
            #[serde(default)]
            problems: Vec<String>,
            agent: Option<String>,
        }
        let ready: Ready = serde_json::from_slice(&answer).map_err(|err| self.unreadable(err))?;
        if let Some(agent) = ready.agent.filter(|agent| *agent != self.name) {
            return Ok((
                false,
                vec![format!(
                    "it is named `{agent}`, and this front signs its calls for `{}`, so it refuses them\nhint: name it the same on both sides: `--agents {agent}={}` on the front, or `snakebox agent --name {}`",
                    self.name, self.url, self.name
                )],
            ));
        }
        Ok((ready.ready, ready.problems))
    }

    /// A call answered once: its answer.
    ///
    /// # Errors
    /// When the call did not bring the engine's answer.
    pub async fn call<T: DeserializeOwned>(
        &self,
        route: &str,
        caller: &Caller,
        session: Option<&str>,
        body: &impl Serialize,
    ) -> Result<T, RemoteError> {
        let response = self.post(route, caller, session, body).await?;
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|err| self.broken(err))?
            .to_bytes();
        serde_json::from_slice(&bytes).map_err(|err| self.unreadable(err))
    }

    /// A streamed call: its chunks to `output` as they come, then its answer. With `cancel`
    /// cancelled first, the connection is closed (the agent stops the call) and `None` is
    /// answered. A call whose answer came with chunks still to follow (an install going on)
    /// forwards them on in a task of its own until the stream ends.
    async fn stream<T: DeserializeOwned + Send>(
        &self,
        route: &str,
        caller: &Caller,
        session: Option<&str>,
        body: &impl Serialize,
        cancel: &CancellationToken,
        output: Option<OutputSink>,
    ) -> Result<Option<T>, RemoteError> {
        let response = tokio::select! {
            response = self.post(route, caller, session, body) => response?,
            () = cancel.cancelled() => return Ok(None),
        };
        let mut lines = frames(response);
        loop {
            let next = tokio::select! {
                next = lines.next_line() => next,
                () = cancel.cancelled() => return Ok(None),
            };
            let Some(text) = next.map_err(|err| self.broken(err))? else {
                return Err(self.broken("the answer ended before its result"));
            };
            match serde_json::from_str::<Frame<T>>(&text).map_err(|err| self.unreadable(err))? {
                Frame::Chunk(chunk) => {
                    if let Some(output) = &output {
                        let _ = output.send(chunk);
                    }
                }
                Frame::Result(answer) => {
                    if let Some(output) = output {
                        tokio::spawn(async move {
                            while let Ok(Some(text)) = lines.next_line().await {
                                if let Ok(Frame::<serde_json::Value>::Chunk(chunk)) =
                                    serde_json::from_str(&text)
                                {
                                    let _ = output.send(chunk);
                                }
                            }
                        });
                    }
                    return Ok(Some(answer));
                }
            }
        }
    }

    /// A run (`execute`, `run_command`) on this agent: its record, or a `cancelled` record of
    /// the front's own when `cancel` came first.
    ///
    /// # Errors
    /// When the call did not bring the engine's answer.
    pub async fn run(
        &self,
        route: &str,
        caller: &Caller,
        session: Option<&str>,
        body: &impl Serialize,
        cancel: &CancellationToken,
        output: Option<OutputSink>,
    ) -> Result<ExecutionResult, RemoteError> {
        let answer = self
            .stream::<WireExecution>(route, caller, session, body, cancel, output)
            .await?;
        Ok(answer.map_or_else(
            || {
                ExecutionResult::not_run(
                    crate::directory::front_execution_id(),
                    EngineError::new(ErrorKind::Cancelled, "the call was cancelled"),
                )
            },
            ExecutionResult::from,
        ))
    }

    /// `install_packages` on this agent.
    ///
    /// # Errors
    /// When the call did not bring the engine's answer.
    pub async fn install(
        &self,
        caller: &Caller,
        request: &InstallPackages,
        progress: Option<OutputSink>,
    ) -> Result<Result<InstallStatus, EngineError>, RemoteError> {
        let never = CancellationToken::new();
        let answer = self
            .stream::<Result<InstallStatus, EngineError>>(
                protocol::INSTALL_PACKAGES,
                caller,
                Some(&request.session_id),
                request,
                &never,
                progress,
            )
            .await?;
        answer.ok_or_else(|| self.broken("the install's answer did not come"))
    }

    /// `open_artifact` on this agent: the head, then the body as it streams.
    ///
    /// # Errors
    /// When the call did not bring the engine's answer.
    pub async fn open(
        &self,
        caller: &Caller,
        request: &OpenArtifact,
    ) -> Result<Result<ArtifactDownload, EngineError>, RemoteError> {
        let response = self
            .post(protocol::OPEN_ARTIFACT, caller, None, request)
            .await?;
        let mut reader = BufReader::new(body_reader(response));
        let mut first = String::new();
        reader
            .read_line(&mut first)
            .await
            .map_err(|err| self.broken(err))?;
        let head: Result<ArtifactHead, EngineError> =
            serde_json::from_str(&first).map_err(|err| self.unreadable(err))?;
        Ok(head.map(|head| ArtifactDownload {
            head,
            body: Box::pin(reader),
        }))
    }
}

/// A response body as an `AsyncRead`.
fn body_reader(response: hyper::Response<Incoming>) -> impl tokio::io::AsyncRead + Send + Unpin {
    let stream = response
        .into_body()
        .into_data_stream()
        .map_err(std::io::Error::other);
    tokio_util::io::StreamReader::new(stream)
}

/// A streamed answer's lines.
fn frames(
    response: hyper::Response<Incoming>,
) -> tokio::io::Lines<BufReader<impl tokio::io::AsyncRead + Send + Unpin>> {
    BufReader::new(body_reader(response)).lines()
}

/// An error with its causes, on one line.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// A session's calls carry its id in the token.
fn session(id: &str) -> Option<&str> {
    Some(id)
}

#[async_trait::async_trait]
impl EngineApi for RemoteEngine {
    async fn execute(
        &self,
        caller: &Caller,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<OutputSink>,
    ) -> ExecutionResult {
        let session = request.session_id.clone();
        self.run(
            protocol::EXECUTE,
            caller,
            session.as_deref(),
            &request,
            &cancel,
            output,
        )
        .await
        .unwrap_or_else(|err| {
            ExecutionResult::not_run(crate::directory::front_execution_id(), err.into_engine())
        })
    }

    async fn run_command(
        &self,
        caller: &Caller,
        request: RunCommand,
        cancel: CancellationToken,
        output: Option<OutputSink>,
    ) -> ExecutionResult {
        self.run(
            protocol::RUN_COMMAND,
            caller,
            session(&request.session_id),
            &request,
            &cancel,
            output,
        )
        .await
        .unwrap_or_else(|err| {
            ExecutionResult::not_run(crate::directory::front_execution_id(), err.into_engine())
        })
    }

    async fn create_session(
        &self,
        caller: &Caller,
        request: CreateSession,
    ) -> Result<SessionInfo, EngineError> {
        flatten(
            self.call(protocol::CREATE_SESSION, caller, None, &request)
                .await,
        )
    }

    async fn list_sessions(&self, caller: &Caller) -> Result<SessionList, EngineError> {
        flatten(self.call(protocol::LIST_SESSIONS, caller, None, &()).await)
    }

    async fn delete_session(&self, caller: &Caller, session_id: &str) -> Result<(), EngineError> {
        flatten(
            self.call(
                protocol::DELETE_SESSION,
                caller,
                session(session_id),
                &session_ref(session_id),
            )
            .await,
        )
    }

    async fn reset_session(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<SessionInfo, EngineError> {
        flatten(
            self.call(
                protocol::RESET_SESSION,
                caller,
                session(session_id),
                &session_ref(session_id),
            )
            .await,
        )
    }

    async fn install_packages(
        &self,
        caller: &Caller,
        request: InstallPackages,
        progress: Option<OutputSink>,
    ) -> Result<InstallStatus, EngineError> {
        flatten(self.install(caller, &request, progress).await)
    }

    async fn list_packages(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<PackageList, EngineError> {
        flatten(
            self.call(
                protocol::LIST_PACKAGES,
                caller,
                session(session_id),
                &session_ref(session_id),
            )
            .await,
        )
    }

    async fn write_file(
        &self,
        caller: &Caller,
        request: WriteFile,
    ) -> Result<FileWritten, EngineError> {
        flatten(
            self.call(
                protocol::WRITE_FILE,
                caller,
                session(&request.session_id),
                &request,
            )
            .await,
        )
    }

    async fn read_file(
        &self,
        caller: &Caller,
        request: ReadFile,
    ) -> Result<FileContent, EngineError> {
        flatten(
            self.call(
                protocol::READ_FILE,
                caller,
                session(&request.session_id),
                &request,
            )
            .await,
        )
    }

    async fn list_files(
        &self,
        caller: &Caller,
        request: ListFiles,
    ) -> Result<FileList, EngineError> {
        flatten(
            self.call(
                protocol::LIST_FILES,
                caller,
                session(&request.session_id),
                &request,
            )
            .await,
        )
    }

    async fn validate(
        &self,
        caller: &Caller,
        request: ValidateScript,
    ) -> Result<Validation, EngineError> {
        flatten(self.call(protocol::VALIDATE, caller, None, &request).await)
    }

    async fn report_for(&self, caller: &Caller) -> EnvironmentReport {
        match self.call(protocol::REPORT, caller, None, &()).await {
            Ok(report) => report,
            Err(err) => unreachable_report(self.host.as_ref(), &err.into_engine()),
        }
    }

    async fn list_runs(&self, caller: &Caller, query: RunQuery) -> Vec<RunRecord> {
        let session = query.session_id.clone();
        self.call(protocol::LIST_RUNS, caller, session.as_deref(), &query)
            .await
            .unwrap_or_else(|err| {
                tracing::warn!(%err, "could not list runs");
                Vec::new()
            })
    }

    async fn run_record(
        &self,
        caller: &Caller,
        execution_id: &str,
    ) -> Result<RunRecord, EngineError> {
        flatten(
            self.call(protocol::RUN_RECORD, caller, None, &run_ref(execution_id))
                .await,
        )
    }

    async fn run_output(&self, caller: &Caller, execution_id: &str) -> Option<serde_json::Value> {
        self.call(protocol::RUN_OUTPUT, caller, None, &run_ref(execution_id))
            .await
            .ok()
            .flatten()
    }

    async fn live_output(&self, caller: &Caller, execution_id: &str) -> Option<LiveOutput> {
        self.call(protocol::LIVE_OUTPUT, caller, None, &run_ref(execution_id))
            .await
            .ok()
            .flatten()
    }

    async fn cancel_run(&self, caller: &Caller, execution_id: &str) -> Result<(), EngineError> {
        flatten(
            self.call(protocol::CANCEL_RUN, caller, None, &run_ref(execution_id))
                .await,
        )
    }

    async fn list_artifacts(&self, caller: &Caller, limit: usize) -> Vec<Artifact> {
        self.call(
            protocol::LIST_ARTIFACTS,
            caller,
            None,
            &ArtifactLimit { limit },
        )
        .await
        .unwrap_or_else(|err| {
            tracing::warn!(%err, "could not list artifacts");
            Vec::new()
        })
    }

    async fn read_artifact(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<ArtifactContent, EngineError> {
        flatten(
            self.call(
                protocol::READ_ARTIFACT,
                caller,
                None,
                &ArtifactRef { uri: uri.into() },
            )
            .await,
        )
    }

    async fn open_artifact(
        &self,
        caller: &Caller,
        request: OpenArtifact,
    ) -> Result<ArtifactDownload, EngineError> {
        flatten(self.open(caller, &request).await)
    }

    async fn audit_tool_call(&self, caller: &Caller, audit: ToolCallAudit) {
        if let Err(err) = self
            .call::<()>(protocol::AUDIT_TOOL_CALL, caller, None, &audit)
            .await
        {
            tracing::warn!(%err, "could not record a tool call in the agent's audit log");
        }
    }
}

/// The engine's answer, or the wire's failure as an engine error.
pub(crate) fn flatten<T>(
    answer: Result<Result<T, EngineError>, RemoteError>,
) -> Result<T, EngineError> {
    answer
        .map_err(RemoteError::into_engine)
        .and_then(|answer| answer)
}

pub(crate) fn session_ref(id: &str) -> SessionRef {
    SessionRef {
        session_id: id.into(),
    }
}

pub(crate) fn run_ref(id: &str) -> RunRef {
    RunRef {
        execution_id: id.into(),
    }
}

/// A report for a caller when no agent answered: this process's own (`host`), not ready,
/// saying why.
pub(crate) fn unreachable_report(host: &dyn EngineHost, err: &EngineError) -> EnvironmentReport {
    let mut report = host.report();
    report.ready = false;
    report.problems.push(match &err.hint {
        Some(hint) => format!("{}\nhint: {hint}", err.message),
        None => err.message.clone(),
    });
    report
}
