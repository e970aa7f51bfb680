//! The internal HTTP API between a front and a `snakebox agent`, as data both sides share: the
//! route of each [`EngineApi`](snakebox_engine::EngineApi) method, the bodies of the calls
//! that take a bare id, the frames of a streamed answer, and the JSON a refusal carries.
//!
//! Why it is its own module: the agent ([`crate::agent`]) and its client
//! ([`crate::remote`]) must agree on every byte, so neither spells a route or a frame itself.
//!
//! The shape, for every call: `POST <route>` with `Authorization: Bearer <grant token>` and
//! the call's request as a JSON body (the engine's request types, [`snakebox_engine::api`]).
//! - A call that answers once answers `200` with its answer as JSON: a `Result` as
//!   `{"Ok": …}` or `{"Err": <EngineError>}`, any other answer as itself.
//! - A call that runs code ([`EXECUTE`], [`RUN_COMMAND`], [`INSTALL_PACKAGES`]) answers `200`
//!   with newline-delimited JSON [`Frame`]s: output chunks while it runs, then one result
//!   frame. An install still running when it answers streams its progress after the result,
//!   until it ends. The client closing the connection cancels the run.
//! - A download ([`OPEN_ARTIFACT`]) answers the artifact's head as JSON in the
//!   [`ARTIFACT_HEAD`] header and its bytes as the body; a refusal answers `{"Err": …}` as
//!   JSON without that header.
//! - A request whose token is missing or not valid for this agent is answered `401` with an
//!   [`AgentRefusal`]; a body that does not parse, `400`; nothing runs in either case.

use serde::{Deserialize, Serialize};
use snakebox_engine::{OutputChunk, WireExecution};

/// `execute`: [`snakebox_engine::ExecuteRequest`], streamed.
pub const EXECUTE: &str = "/v1/execute";
/// `run_command`: [`snakebox_engine::RunCommand`], streamed.
pub const RUN_COMMAND: &str = "/v1/run_command";
/// `install_packages`: [`snakebox_engine::InstallPackages`], streamed.
pub const INSTALL_PACKAGES: &str = "/v1/install_packages";
/// `create_session`: [`snakebox_engine::CreateSession`].
pub const CREATE_SESSION: &str = "/v1/create_session";
/// `list_sessions`: no body.
pub const LIST_SESSIONS: &str = "/v1/list_sessions";
/// `delete_session`: [`SessionRef`].
pub const DELETE_SESSION: &str = "/v1/delete_session";
/// `reset_session`: [`SessionRef`].
pub const RESET_SESSION: &str = "/v1/reset_session";
/// `list_packages`: [`SessionRef`].
pub const LIST_PACKAGES: &str = "/v1/list_packages";
/// `write_file`: [`snakebox_engine::WriteFile`].
pub const WRITE_FILE: &str = "/v1/write_file";
/// `read_file`: [`snakebox_engine::ReadFile`].
pub const READ_FILE: &str = "/v1/read_file";
/// `list_files`: [`snakebox_engine::ListFiles`].
pub const LIST_FILES: &str = "/v1/list_files";
/// `validate`: [`snakebox_engine::ValidateScript`].
pub const VALIDATE: &str = "/v1/validate";
/// `report_for`: no body.
pub const REPORT: &str = "/v1/report";
/// `list_runs`: [`snakebox_engine::RunQuery`].
pub const LIST_RUNS: &str = "/v1/list_runs";
/// `run_record`: [`RunRef`].
pub const RUN_RECORD: &str = "/v1/run_record";
/// `run_output`: [`RunRef`].
pub const RUN_OUTPUT: &str = "/v1/run_output";
/// `live_output`: [`RunRef`].
pub const LIVE_OUTPUT: &str = "/v1/live_output";
/// `cancel_run`: [`RunRef`].
pub const CANCEL_RUN: &str = "/v1/cancel_run";
/// `list_artifacts`: [`ArtifactLimit`].
pub const LIST_ARTIFACTS: &str = "/v1/list_artifacts";
/// `read_artifact`: [`ArtifactRef`].
pub const READ_ARTIFACT: &str = "/v1/read_artifact";
/// `open_artifact`: [`snakebox_engine::OpenArtifact`]; the head in [`ARTIFACT_HEAD`], the
/// bytes as the body.
pub const OPEN_ARTIFACT: &str = "/v1/open_artifact";
/// `audit_tool_call`: [`snakebox_engine::ToolCallAudit`].
pub const AUDIT_TOOL_CALL: &str = "/v1/audit_tool_call";

/// The header of a download's answer that carries its [`snakebox_engine::ArtifactHead`] as
/// JSON.
pub const ARTIFACT_HEAD: &str = "x-snakebox-artifact-head";

/// A call on one session by its id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRef {
    /// The session.
    pub session_id: String,
}

/// A call on one run by its id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRef {
    /// The run.
    pub execution_id: String,
}

/// An artifact by its URI.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRef {
    /// Its `snakebox://` URI.
    pub uri: String,
}

/// How many artifacts to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactLimit {
    /// At most this many.
    pub limit: usize,
}

/// One line of a streamed answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Frame<T> {
    /// Output the call printed (or an install's progress).
    Chunk(OutputChunk),
    /// The call's answer; for a run, after every chunk it printed.
    Result(T),
}

/// The answer frame of a run: its record whole.
pub type RunFrame = Frame<WireExecution>;

/// Why an agent refused a request before any engine call: the body of a `401` or `400`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRefusal {
    /// `unauthorized` or `bad_request`.
    pub error: String,
    /// What was wrong.
    pub message: String,
    /// How to fix it.
    pub hint: String,
}
