//! The engine as the faces reach it: one API of requests and results that can cross a wire.
//!
//! Why it exists: a deployment that outgrows one host serves its faces (MCP, HTTP, the web
//! UI) from fronts and runs the engine in `snakebox agent`s on other hosts (DESIGN.md §7). The
//! faces must not notice. So they do not hold an [`Engine`]: they hold an
//! `Arc<dyn `[`EngineApi`]`>` for every call a tenant's request makes, which [`Engine`]
//! implements in this process today and a client of an agent will implement tomorrow, with
//! no edit to a face.
//!
//! What makes it wire-ready:
//! - **Every request, result and error is data.** Each one derives `Serialize` and
//!   `Deserialize` and comes back equal from JSON (the tests below, one per family, and
//!   `every_type_that_crosses_the_trait_is_serialisable` for the list of them). A call
//!   with one argument takes it plainly (a session id, a run id, an artifact URI: a path
//!   segment on a wire); a call with more takes one request type ([`ExecuteRequest`],
//!   [`CreateSession`], [`RunCommand`], [`InstallPackages`], [`WriteFile`], [`ReadFile`],
//!   [`ListFiles`], [`ValidateScript`], [`RunQuery`], [`OpenArtifact`]). [`EngineError`]
//!   crosses whole: kind, message and hint.
//! - **The caller is not in the request.** Each method takes the [`Caller`] beside its request,
//!   and `Caller` is deliberately not `Deserialize`: on a wire the tenant is who the
//!   authenticated connection says it is (a front's signed token, issue 35), never a field a
//!   body can set.
//! - **Output is a stream, cancellation is the caller going away.** The calls that run code
//!   ([`EngineApi::execute`], [`EngineApi::run_command`], [`EngineApi::install_packages`])
//!   take an optional [`OutputSink`]: each [`OutputChunk`] sent on it is one frame of the
//!   response stream, ahead of the final result frame (a run sends every chunk before it
//!   returns, so a sink's receiver sees them all before the result; an install still running
//!   when it answers streams on until it ends, and its receiver then closes). The runs take a
//!   [`CancellationToken`] (an install outlives its call by design and has none): over a
//!   wire, the server side cancels it when its caller closes the connection (or the front
//!   relays an MCP cancellation by closing it), so no separate cancel message exists for a
//!   call in flight. Cancelling a run *by id* from elsewhere (the web UI's button) is its own
//!   call, [`EngineApi::cancel_run`].
//! - **A download is a head and a byte stream** ([`ArtifactDownload`]): the head is data, the
//!   body an [`AsyncRead`](tokio::io::AsyncRead), a response body on a wire.
//! - **Results the tools shape differently stay whole on a wire.** [`ExecutionResult`]'s own
//!   serde form is the tool's structured content and leaves out its inline images and the
//!   compatibility tools' `result` variable; [`WireExecution`] is the form that carries
//!   them, and what a wire sends.
//!
//! What is not on the trait, and why: the process's own matters, which a front answers for
//! itself and never forwards — the settings the faces read ([`EngineConfig`]: the
//! deployment's, read by every process from the same configuration), readiness and gauges of
//! this process, and stopping it (`begin_shutdown`, `wait_idle`). They are [`EngineHost`], a
//! second small trait the faces hold beside the API ([`EngineHandle`] carries both). Warming,
//! pruning and shutdown proper are the binary's and never reach a face at all: they stay
//! [`Engine`]'s inherent methods.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::{
    Artifact, ArtifactContent, Caller, CreateSession, Engine, EngineConfig, EngineError,
    EnvironmentReport, ExecuteRequest, ExecutionResult, FileContent, FileList, FileWritten,
    InlineImage, InstallStatus, LiveOutput, OutputChunk, PackageList, RunQuery, RunRecord,
    SessionInfo, SessionList, StopReason, Validation, ValueRepr,
};

/// Where a call sends its output while it runs: one [`OutputChunk`] per frame of the
/// response stream on a wire.
pub type OutputSink = UnboundedSender<OutputChunk>;

/// A byte stream (an artifact's content): a response body on a wire.
pub type ByteStream = Pin<Box<dyn tokio::io::AsyncRead + Send>>;

/// Every call a face makes of the engine for a tenant's request. See the module
/// documentation for how each maps onto a wire.
#[async_trait::async_trait]
pub trait EngineApi: Send + Sync {
    /// Run a script: one-shot, or a cell of `request.session_id`'s interpreter. Always a
    /// record (a refusal is one, with its status and hint). `output` receives what the run
    /// prints while it runs; `cancel` stops it (on a wire: the caller went away).
    async fn execute(
        &self,
        caller: &Caller,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<OutputSink>,
    ) -> ExecutionResult;

    /// Run a shell command in a session's sandbox; as [`EngineApi::execute`].
    async fn run_command(
        &self,
        caller: &Caller,
        request: RunCommand,
        cancel: CancellationToken,
        output: Option<OutputSink>,
    ) -> ExecutionResult;

    /// Create a session.
    async fn create_session(
        &self,
        caller: &Caller,
        request: CreateSession,
    ) -> Result<SessionInfo, EngineError>;

    /// The caller's sessions.
    async fn list_sessions(&self, caller: &Caller) -> Result<SessionList, EngineError>;

    /// Delete one of the caller's sessions (a call running in it is stopped).
    async fn delete_session(&self, caller: &Caller, session_id: &str) -> Result<(), EngineError>;

    /// Reset one of the caller's sessions to the state it was created in.
    async fn reset_session(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<SessionInfo, EngineError>;

    /// Install packages into a session, waiting up to `request.wait` (a longer install goes
    /// on; [`EngineApi::list_packages`] reports it). `progress` receives uv's output.
    async fn install_packages(
        &self,
        caller: &Caller,
        request: InstallPackages,
        progress: Option<OutputSink>,
    ) -> Result<InstallStatus, EngineError>;

    /// A session's packages and the state of its last install.
    async fn list_packages(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<PackageList, EngineError>;

    /// Write a file into a session's workspace.
    async fn write_file(
        &self,
        caller: &Caller,
        request: WriteFile,
    ) -> Result<FileWritten, EngineError>;

    /// Read a file of a session's workspace.
    async fn read_file(
        &self,
        caller: &Caller,
        request: ReadFile,
    ) -> Result<FileContent, EngineError>;

    /// List (a directory of) a session's workspace.
    async fn list_files(
        &self,
        caller: &Caller,
        request: ListFiles,
    ) -> Result<FileList, EngineError>;

    /// Check a script without running it.
    async fn validate(
        &self,
        caller: &Caller,
        request: ValidateScript,
    ) -> Result<Validation, EngineError>;

    /// The environment as the caller may see it (`check_environment`).
    async fn report_for(&self, caller: &Caller) -> EnvironmentReport;

    /// The caller's runs that `query` selects, newest first.
    async fn list_runs(&self, caller: &Caller, query: RunQuery) -> Vec<RunRecord>;

    /// One of the caller's runs.
    async fn run_record(
        &self,
        caller: &Caller,
        execution_id: &str,
    ) -> Result<RunRecord, EngineError>;

    /// The result a finished run of the caller's returned, as the JSON the tool answered.
    async fn run_output(&self, caller: &Caller, execution_id: &str) -> Option<serde_json::Value>;

    /// What a run of the caller's still going has printed so far (`None`: not running here).
    async fn live_output(&self, caller: &Caller, execution_id: &str) -> Option<LiveOutput>;

    /// Cancel a run of the caller's by its id.
    async fn cancel_run(&self, caller: &Caller, execution_id: &str) -> Result<(), EngineError>;

    /// The caller's artifacts of its newest runs, at most `limit`.
    async fn list_artifacts(&self, caller: &Caller, limit: usize) -> Vec<Artifact>;

    /// One of the caller's artifacts by URI, whole.
    async fn read_artifact(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<ArtifactContent, EngineError>;

    /// One of the caller's artifacts as a stream, for a download.
    async fn open_artifact(
        &self,
        caller: &Caller,
        request: OpenArtifact,
    ) -> Result<ArtifactDownload, EngineError>;

    /// Record a tool call that is not a run (those the engine records itself) in the audit
    /// log: its tool and status.
    async fn audit_tool_call(&self, caller: &Caller, audit: ToolCallAudit);
}

/// The process's own matters, answered where the face runs and never forwarded (see the
/// module documentation).
#[async_trait::async_trait]
pub trait EngineHost: Send + Sync {
    /// The settings the deployment runs with.
    fn config(&self) -> &EngineConfig;

    /// The artifact store's retention rule, in words.
    fn artifact_retention(&self) -> String;

    /// The whole environment, every tenant's sessions listed (readiness, the operator).
    fn report(&self) -> EnvironmentReport;

    /// Publish this process's gauges to the metrics recorder.
    fn publish_gauges(&self);

    /// Refuse new calls and cancel those in flight.
    fn begin_shutdown(&self, reason: StopReason);

    /// Wait until every call in flight has returned, at most `deadline`: how many had not.
    async fn wait_idle(&self, deadline: Duration) -> usize;

    /// Do a face's `work` for `caller` as that tenant's host work in this process: on one of
    /// the bounded host-work threads, in the fair order, counted against the tenant's part
    /// (issue 32, item 1). For what a face does on its own for a call that costs in
    /// proportion to what the caller asked for: shaping a listing of thousands of entries,
    /// or a megabyte of output, into an answer. `action` names the work in the error.
    ///
    /// # Errors
    /// When the work panicked, or no host-work slot can be had (the server is stopping).
    async fn host_work(
        &self,
        caller: &Caller,
        action: &str,
        work: Box<dyn FnOnce() + Send>,
    ) -> Result<(), EngineError>;
}

/// What a face is handed: the API of tenants' calls and the process it runs in. Built from an
/// [`Engine`] (`Arc<Engine>` converts); [`EngineHandle::with_api`] puts another
/// implementation of the API in front (a wire, a test's loopback).
#[derive(Clone)]
pub struct EngineHandle {
    api: Arc<dyn EngineApi>,
    host: Arc<dyn EngineHost>,
}

impl EngineHandle {
    /// A handle of `api` and `host`.
    #[must_use]
    pub fn new(api: Arc<dyn EngineApi>, host: Arc<dyn EngineHost>) -> EngineHandle {
        EngineHandle { api, host }
    }

    /// This handle with its calls going to `api`.
    #[must_use]
    pub fn with_api(mut self, api: Arc<dyn EngineApi>) -> EngineHandle {
        self.api = api;
        self
    }

    /// The API of tenants' calls.
    #[must_use]
    pub fn api(&self) -> &Arc<dyn EngineApi> {
        &self.api
    }

    /// The process's own matters.
    #[must_use]
    pub fn host(&self) -> &Arc<dyn EngineHost> {
        &self.host
    }
}

impl From<Arc<Engine>> for EngineHandle {
    fn from(engine: Arc<Engine>) -> EngineHandle {
        EngineHandle {
            api: Arc::clone(&engine) as Arc<dyn EngineApi>,
            host: engine,
        }
    }
}

/// `run_command`: a shell command in a session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunCommand {
    /// The session.
    pub session_id: String,
    /// The command, for `/bin/sh -c`.
    pub command: String,
    /// Wall-time limit in seconds, as the caller gave it (`None`: the server's default).
    pub timeout_seconds: Option<f64>,
}

/// `install_packages`: packages into a session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallPackages {
    /// The session.
    pub session_id: String,
    /// PEP 508 requirements.
    pub packages: Vec<String>,
    /// How long to wait for the install before answering that it still runs (`None`: until
    /// it ends).
    pub wait: Option<Duration>,
}

/// `write_file`: a file into a session's workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFile {
    /// The session.
    pub session_id: String,
    /// Path relative to the workspace.
    pub path: String,
    /// The content, as text or base64 according to `encoding`.
    pub content: String,
    /// `utf-8` (`None`) or `base64`, as the caller wrote it.
    pub encoding: Option<String>,
}

/// `read_file`: a file of a session's workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadFile {
    /// The session.
    pub session_id: String,
    /// Path relative to the workspace.
    pub path: String,
}

/// `list_files`: (a directory of) a session's workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListFiles {
    /// The session.
    pub session_id: String,
    /// Directory relative to the workspace (empty: its root).
    pub path: String,
    /// Levels to descend.
    pub depth: usize,
}

/// `validate_script`: a script checked without running it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidateScript {
    /// Python source, with or without a PEP 723 block.
    pub script: String,
    /// Extra requirements (PEP 508).
    pub dependencies: Vec<String>,
    /// Python version to check against (`None`: what a run would use).
    pub python_version: Option<String>,
    /// The profile whose import policy applies (`None`: the caller's default).
    pub profile: Option<String>,
    /// Modules the script may import (`None`: the profile's policy, if any).
    pub allowed_imports: Option<Vec<String>>,
}

/// An artifact to download: `path` of the run `execution_id` (decoded).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenArtifact {
    /// The run that produced it.
    pub execution_id: String,
    /// Its path relative to the run's working directory.
    pub path: String,
}

/// What a download needs to know before the bytes: a response's headers on a wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactHead {
    /// Path relative to the run's working directory.
    pub name: String,
    /// MIME type.
    pub mime_type: String,
    /// Its size in bytes (the store never changes a kept file).
    pub size: u64,
}

/// An artifact opened for a download: its head, then its bytes.
pub struct ArtifactDownload {
    /// Name, type and size.
    pub head: ArtifactHead,
    /// The content, from its start.
    pub body: ByteStream,
}

impl std::fmt::Debug for ArtifactDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArtifactDownload")
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

/// One tool call for the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToolCallAudit {
    /// The tool ran: `status` is `ok` or `error`.
    Answered {
        /// The tool's name.
        tool: String,
        /// `ok` or `error`.
        status: String,
    },
    /// The call was refused before it ran (an unknown tool, arguments that do not fit).
    /// Only the size and hash of `request` are kept, never what was sent.
    Refused {
        /// The tool's name as sent.
        tool: String,
        /// What was sent, as JSON.
        request: String,
    },
}

impl ToolCallAudit {
    /// The audit of a call of the tool `tool` that was answered (`is_error`: the tool could
    /// not do what was asked), or `None` when the engine records the call itself: the kind of
    /// request the tool makes ([`RequestKind::of_tool`]) decides, for every face, so a face
    /// reports what it answered and decides nothing.
    #[must_use]
    pub fn answered(tool: &str, is_error: bool) -> Option<ToolCallAudit> {
        RequestKind::of_tool(tool)
            .audited_as_tool_call()
            .then(|| ToolCallAudit::Answered {
                tool: tool.to_owned(),
                status: if is_error { "error" } else { "ok" }.to_owned(),
            })
    }
}

/// The kind of request a face's tool makes of the API, as far as the audit log tells them
/// apart: the calls that run code are recorded by the engine itself (a line when admitted,
/// one when finished, see `crate::audit`), every other tool call gets one line when
/// answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// Runs a script ([`EngineApi::execute`]), one-shot or in a session.
    Execute,
    /// Runs a command in a session ([`EngineApi::run_command`]).
    RunCommand,
    /// Any other request: sessions, packages, files, validation, listings, reports.
    Other,
}

impl RequestKind {
    /// The kind of request the tool named `tool` makes: snakebox's tools and those of the
    /// compatibility tool sets ([`crate::CompatToolSet`]).
    #[must_use]
    pub fn of_tool(tool: &str) -> RequestKind {
        match tool {
            "execute_python" | "execute_code" | "execute_python_code" => RequestKind::Execute,
            "run_command" | "execute_terminal_command" => RequestKind::RunCommand,
            _ => RequestKind::Other,
        }
    }

    /// Whether a call of this kind gets an audit line as a tool call when it is answered
    /// ([`ToolCallAudit::answered`]); a run's lines are the engine's own.
    #[must_use]
    pub const fn audited_as_tool_call(self) -> bool {
        matches!(self, RequestKind::Other)
    }
}

/// An [`ExecutionResult`] whole, as a wire carries it: the record (its fields, as the tool's
/// structured content has them) with what that leaves out, the inline images and the
/// compatibility tools' `result` variable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireExecution {
    /// The record.
    #[serde(flatten)]
    pub record: ExecutionResult,
    /// [`ExecutionResult::inline_images`].
    pub inline_images: Vec<InlineImage>,
    /// [`ExecutionResult::result_variable`].
    pub result_variable: Option<ValueRepr>,
}

impl From<ExecutionResult> for WireExecution {
    fn from(mut record: ExecutionResult) -> WireExecution {
        WireExecution {
            inline_images: std::mem::take(&mut record.inline_images),
            result_variable: record.result_variable.take(),
            record,
        }
    }
}

impl From<WireExecution> for ExecutionResult {
    fn from(wire: WireExecution) -> ExecutionResult {
        ExecutionResult {
            inline_images: wire.inline_images,
            result_variable: wire.result_variable,
            ..wire.record
        }
    }
}

#[async_trait::async_trait]
impl EngineApi for Engine {
    async fn execute(
        &self,
        caller: &Caller,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<OutputSink>,
    ) -> ExecutionResult {
        Engine::execute(self, caller, request, cancel, output).await
    }

    async fn run_command(
        &self,
        caller: &Caller,
        request: RunCommand,
        cancel: CancellationToken,
        output: Option<OutputSink>,
    ) -> ExecutionResult {
        Engine::run_command(
            self,
            caller,
            &request.session_id,
            &request.command,
            request.timeout_seconds,
            cancel,
            output,
        )
        .await
    }

    async fn create_session(
        &self,
        caller: &Caller,
        request: CreateSession,
    ) -> Result<SessionInfo, EngineError> {
        Engine::create_session(self, caller, request).await
    }

    async fn list_sessions(&self, caller: &Caller) -> Result<SessionList, EngineError> {
        Engine::list_sessions(self, caller).await
    }

    async fn delete_session(&self, caller: &Caller, session_id: &str) -> Result<(), EngineError> {
        Engine::delete_session(self, caller, session_id).await
    }

    async fn reset_session(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<SessionInfo, EngineError> {
        Engine::reset_session(self, caller, session_id).await
    }

    async fn install_packages(
        &self,
        caller: &Caller,
        request: InstallPackages,
        progress: Option<OutputSink>,
    ) -> Result<InstallStatus, EngineError> {
        Engine::install_packages(
            self,
            caller,
            &request.session_id,
            request.packages,
            request.wait,
            progress,
        )
        .await
    }

    async fn list_packages(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<PackageList, EngineError> {
        Engine::list_packages(self, caller, session_id).await
    }

    async fn write_file(
        &self,
        caller: &Caller,
        request: WriteFile,
    ) -> Result<FileWritten, EngineError> {
        Engine::write_file(
            self,
            caller,
            &request.session_id,
            &request.path,
            &request.content,
            request.encoding.as_deref(),
        )
        .await
    }

    async fn read_file(
        &self,
        caller: &Caller,
        request: ReadFile,
    ) -> Result<FileContent, EngineError> {
        Engine::read_file(self, caller, &request.session_id, &request.path).await
    }

    async fn list_files(
        &self,
        caller: &Caller,
        request: ListFiles,
    ) -> Result<FileList, EngineError> {
        Engine::list_files(
            self,
            caller,
            &request.session_id,
            &request.path,
            request.depth,
        )
        .await
    }

    async fn validate(
        &self,
        caller: &Caller,
        request: ValidateScript,
    ) -> Result<Validation, EngineError> {
        Engine::validate(
            self,
            caller,
            &request.script,
            &request.dependencies,
            request.python_version.as_deref(),
            request.profile.as_deref(),
            request.allowed_imports.as_deref(),
        )
        .await
    }

    async fn report_for(&self, caller: &Caller) -> EnvironmentReport {
        Engine::report_for(self, caller)
    }

    async fn list_runs(&self, caller: &Caller, query: RunQuery) -> Vec<RunRecord> {
        Engine::list_runs(self, caller, query).await
    }

    async fn run_record(
        &self,
        caller: &Caller,
        execution_id: &str,
    ) -> Result<RunRecord, EngineError> {
        Engine::run_record(self, caller, execution_id).await
    }

    async fn run_output(&self, caller: &Caller, execution_id: &str) -> Option<serde_json::Value> {
        Engine::run_output(self, caller, execution_id).await
    }

    async fn live_output(&self, caller: &Caller, execution_id: &str) -> Option<LiveOutput> {
        Engine::live_output(self, caller, execution_id)
    }

    async fn cancel_run(&self, caller: &Caller, execution_id: &str) -> Result<(), EngineError> {
        Engine::cancel_run(self, caller, execution_id)
    }

    async fn list_artifacts(&self, caller: &Caller, limit: usize) -> Vec<Artifact> {
        Engine::list_artifacts(self, caller, limit).await
    }

    async fn read_artifact(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<ArtifactContent, EngineError> {
        Engine::read_artifact(self, caller, uri).await
    }

    async fn open_artifact(
        &self,
        caller: &Caller,
        request: OpenArtifact,
    ) -> Result<ArtifactDownload, EngineError> {
        let opened =
            Engine::open_artifact(self, caller, &request.execution_id, &request.path).await?;
        Ok(ArtifactDownload {
            head: ArtifactHead {
                name: opened.name,
                mime_type: opened.mime_type,
                size: opened.size,
            },
            body: Box::pin(tokio::fs::File::from_std(opened.file)),
        })
    }

    async fn audit_tool_call(&self, caller: &Caller, audit: ToolCallAudit) {
        match audit {
            ToolCallAudit::Answered { tool, status } => {
                Engine::audit_tool_call(self, caller, &tool, &status);
            }
            ToolCallAudit::Refused { tool, request } => {
                Engine::audit_refused_call(self, caller, &tool, &request);
            }
        }
    }
}

#[async_trait::async_trait]
impl EngineHost for Engine {
    fn config(&self) -> &EngineConfig {
        Engine::config(self)
    }

    fn artifact_retention(&self) -> String {
        self.artifact_store().retention()
    }

    fn report(&self) -> EnvironmentReport {
        Engine::report(self)
    }

    fn publish_gauges(&self) {
        Engine::publish_gauges(self);
    }

    fn begin_shutdown(&self, reason: StopReason) {
        Engine::begin_shutdown(self, reason);
    }

    async fn wait_idle(&self, deadline: Duration) -> usize {
        Engine::wait_idle(self, deadline).await
    }

    async fn host_work(
        &self,
        caller: &Caller,
        action: &str,
        work: Box<dyn FnOnce() + Send>,
    ) -> Result<(), EngineError> {
        self.calls.on_host(caller, action, work).await
    }
}

#[cfg(test)]
mod tests;
