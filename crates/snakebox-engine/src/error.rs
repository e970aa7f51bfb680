//! Typed engine errors: what kind of failure it is, what went wrong, and how to fix it.
//!
//! Every fallible engine call returns an [`EngineError`]. Its [`ErrorKind`] is what a face
//! needs to answer in its own terms, decided here once: the MCP face turns it into a tool
//! result with `isError` (or a run's `status`), an HTTP face into a status code, the CLI into
//! an exit code. The message and the hint are written for the person or model that reads
//! them, never parsed.
//!
//! The errors of the rooms below (environments, sandboxes, scripts, confined files,
//! artifacts) become engine errors through one [`Hint`] trait, implemented for each of them
//! in this file: the only place that decides which of their failures are the caller's
//! (invalid), the host's (unavailable), or a bug (internal). `?` does the rest.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What kind of failure an [`EngineError`] is: the one fact a face maps to its own terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is wrong (an argument, the script's metadata, a path): fix the request.
    Invalid,
    /// The request names something that does not exist for this caller (a session, an
    /// artifact). Another caller's things are not found either.
    NotFound,
    /// What the request names is busy or in a state that forbids it now (an install already
    /// running in the session).
    Conflict,
    /// A cap of the server or the tenant is reached (sessions, disk): free some, or ask the
    /// operator for more.
    Quota,
    /// The server cannot do this here or now (no usable sandbox or uv, no such interpreter on
    /// this host, the server is stopping): an operator's matter, or retry later.
    Unavailable,
    /// The session lived in the memory of an engine agent that is gone (a deployment of
    /// fronts and agents, issue 35): its interpreter's state is lost; make a new session.
    SessionLost,
    /// The work was tried and failed for a reason outside the request's form: a dependency
    /// that cannot be installed (no wheel, the index unreachable, a failed build), a package's
    /// own code stopped by a limit.
    Failed,
    /// The caller (or the server stopping) cancelled the call.
    Cancelled,
    /// A fault of the host or a bug: the data directory unwritable, the store failing.
    Internal,
}

impl ErrorKind {
    /// The name used on the wire.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Invalid => "invalid",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Quota => "quota",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::SessionLost => "session_lost",
            ErrorKind::Failed => "failed",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Internal => "internal",
        }
    }
}

/// An error that stopped the execution before or around the script (not the script's own
/// exception, which is in `stderr`): the wire form of an [`EngineError`], or of a limit
/// the run reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorInfo {
    /// What went wrong.
    pub message: String,
    /// How to fix it, when we know (else `null`).
    pub hint: Option<String>,
    /// What kind of failure stopped the call (`invalid`, `not_found`, `conflict`, `quota`,
    /// `unavailable`, `failed`, `cancelled`, `internal`); `null` when the run itself ended it
    /// (a limit, a timeout: see `status`).
    pub kind: Option<crate::ErrorKind>,
}

/// A failure of an engine call: its kind, what went wrong, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{message}")]
pub struct EngineError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// What went wrong, with its causes (`what failed: because`).
    pub message: String,
    /// How to fix it, when there is something to say.
    pub hint: Option<String>,
}

impl EngineError {
    /// An error of `kind` with a message and no hint.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> EngineError {
        EngineError {
            kind,
            message: message.into(),
            hint: None,
        }
    }

    /// The same error with `hint`.
    #[must_use]
    pub fn with_hint(mut self, hint: impl Into<String>) -> EngineError {
        self.hint = Some(hint.into());
        self
    }

    /// The caller's request is wrong.
    pub fn invalid(message: impl Into<String>, hint: impl Into<String>) -> EngineError {
        EngineError::new(ErrorKind::Invalid, message).with_hint(hint)
    }

    /// A fault of the host or a bug.
    pub fn internal(message: impl Into<String>, hint: impl Into<String>) -> EngineError {
        EngineError::new(ErrorKind::Internal, message).with_hint(hint)
    }

    /// `err` (any error of the rooms below, or of this crate, that knows its [`Hint`]),
    /// introduced by `context` (`"Failed to start the session's interpreter"`).
    pub fn context<E: Hint>(context: &str, err: &E) -> EngineError {
        let mut error = EngineError::from_hinted(err);
        error.message = format!("{context}: {}", error.message);
        error
    }

    fn from_hinted<E: Hint>(err: &E) -> EngineError {
        EngineError {
            kind: err.kind(),
            message: describe(err),
            hint: err.hint(),
        }
    }

    /// The wire form (message, hint and kind).
    #[must_use]
    pub fn info(&self) -> ErrorInfo {
        ErrorInfo {
            message: self.message.clone(),
            hint: self.hint.clone(),
            kind: Some(self.kind),
        }
    }
}

impl From<EngineError> for ErrorInfo {
    fn from(error: EngineError) -> ErrorInfo {
        ErrorInfo {
            message: error.message,
            hint: error.hint,
            kind: Some(error.kind),
        }
    }
}

/// An error that knows what kind of failure it is for a caller of the engine, and how to fix
/// it. Implemented here for the errors of every room below, so `?` turns them into an
/// [`EngineError`].
pub trait Hint: std::error::Error {
    /// What kind of failure this is for the engine's caller.
    fn kind(&self) -> ErrorKind;
    /// How to fix it, when there is something to say.
    fn hint(&self) -> Option<String>;
}

impl<E: Hint> From<E> for EngineError {
    fn from(err: E) -> EngineError {
        EngineError::from_hinted(&err)
    }
}

impl Hint for snakebox_env::EnvError {
    fn kind(&self) -> ErrorKind {
        use snakebox_env::EnvError as E;
        match self {
            E::UvNotFound { .. } | E::UvUnusable { .. } | E::Sandbox { .. } => {
                ErrorKind::Unavailable
            }
            E::InvalidPythonRequest { .. } | E::ForbiddenUrl { .. } => ErrorKind::Invalid,
            // The interpreter asked for is not on this host: the request may be fine elsewhere.
            E::NoMatchingInterpreter { .. } => ErrorKind::Unavailable,
            // The data directory's disk is full: nothing the request can change.
            E::NoSpace { .. } => ErrorKind::Unavailable,
            E::InstallFailed { .. }
            | E::PythonInstallFailed { .. }
            | E::Incomplete { .. }
            | E::SdistBuildsDisabled { .. }
            | E::BuildFailed { .. }
            | E::Timeout { .. }
            | E::LimitReached { .. } => ErrorKind::Failed,
            E::Spawn { .. } | E::VenvFailed { .. } | E::UvOutput { .. } | E::Io { .. } => {
                ErrorKind::Internal
            }
        }
    }
    fn hint(&self) -> Option<String> {
        snakebox_env::EnvError::hint(self)
    }
}

impl Hint for snakebox_sandbox::SandboxError {
    fn kind(&self) -> ErrorKind {
        use snakebox_sandbox::{SandboxError, SpawnError};
        match self {
            // The host cannot isolate (namespaces, seccomp, cgroups refused): the operator's.
            SandboxError::Namespace(_)
            | SandboxError::Seccomp(_)
            | SandboxError::Cgroup(_)
            | SandboxError::Docker(_) => ErrorKind::Unavailable,
            SandboxError::Spawn(SpawnError::NulByte { .. }) => ErrorKind::Invalid,
            SandboxError::Spawn(_) => ErrorKind::Internal,
        }
    }
    fn hint(&self) -> Option<String> {
        snakebox_sandbox::SandboxError::hint(self)
    }
}

impl Hint for snakebox_sandbox::SpawnError {
    fn kind(&self) -> ErrorKind {
        match self {
            snakebox_sandbox::SpawnError::NulByte { .. } => ErrorKind::Invalid,
            _ => ErrorKind::Internal,
        }
    }
    fn hint(&self) -> Option<String> {
        snakebox_sandbox::SpawnError::hint(self)
    }
}

impl Hint for snakebox_script::ScriptError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Invalid
    }
    fn hint(&self) -> Option<String> {
        snakebox_script::ScriptError::hint(self)
    }
}

impl Hint for snakebox_fs::FsError {
    fn kind(&self) -> ErrorKind {
        use snakebox_fs::FsError as E;
        match self {
            E::Path(_) | E::Symlink { .. } | E::NotAFile { .. } | E::NotADirectory { .. } => {
                ErrorKind::Invalid
            }
            E::NotFound { .. } => ErrorKind::NotFound,
            E::TooLarge { .. } => ErrorKind::Quota,
            E::Io { .. } => ErrorKind::Internal,
        }
    }
    fn hint(&self) -> Option<String> {
        use snakebox_fs::FsError as E;
        Some(
            match self {
                E::Path(path) => path.hint(),
                E::NotFound { .. } => "call list_files to see what the workspace holds",
                E::Symlink { .. } => {
                    "links are never followed; read or write the file at its own path"
                }
                E::NotAFile { .. } => "name a regular file (list_files shows each entry's kind)",
                E::NotADirectory { .. } => "name a directory, or leave `path` empty for the workspace",
                E::TooLarge { .. } => {
                    "read the file in a run (execute_python with the session_id) and print the part you need"
                }
                E::Io { .. } => "check the data directory's disk space and permissions",
            }
            .to_owned(),
        )
    }
}

/// An error and its causes on one line (`what failed: because: because`), so that a result
/// says why, not only what.
pub(crate) fn describe(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(cause_text.trim()) {
            text.push_str(": ");
            text.push_str(cause_text.trim());
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_error_is_the_callers() {
        let err = snakebox_script::parse("# /// script\n# dependencies = [\n").unwrap_err();
        let error = EngineError::from(err);
        assert_eq!(error.kind, ErrorKind::Invalid);
        assert!(error.hint.is_some());
    }

    #[test]
    fn a_missing_file_is_not_found_and_a_link_is_invalid() {
        let missing = snakebox_fs::FsError::NotFound { path: "a".into() };
        assert_eq!(EngineError::from(missing).kind, ErrorKind::NotFound);
        let link = snakebox_fs::FsError::Symlink { path: "a".into() };
        assert_eq!(EngineError::from(link).kind, ErrorKind::Invalid);
    }

    #[test]
    fn context_keeps_kind_and_hint() {
        let err = snakebox_sandbox::SpawnError::NulByte { value: "x".into() };
        let error = EngineError::context("Failed to start", &err);
        assert_eq!(error.kind, ErrorKind::Invalid);
        assert!(error.message.starts_with("Failed to start: "));
        assert!(error.hint.is_some());
    }

    #[test]
    fn wire_names_are_snake_case() {
        for kind in [
            ErrorKind::Invalid,
            ErrorKind::NotFound,
            ErrorKind::Conflict,
            ErrorKind::Quota,
            ErrorKind::Unavailable,
            ErrorKind::SessionLost,
            ErrorKind::Failed,
            ErrorKind::Cancelled,
            ErrorKind::Internal,
        ] {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, serde_json::json!(kind.as_str()));
        }
    }
}
