//! Persistent sessions: a workspace, a virtual environment and a live interpreter that last
//! across calls, addressed by a `session_id`.
//!
//! A session on the host is `<data>/sessions-v1/shares/<slot>/<id>/`, in its tenant's share
//! of the sessions' disk ([`disk`]):
//!
//! - `work/` — the workspace, mounted writable at `/work` (the working directory and `HOME`)
//!   and owned by the sandbox user; the file tools read and write here, confined (see
//!   [`files`]);
//! - `env/venv/` — the session's own virtual environment, made by `uv venv` from the
//!   session's interpreter. Installs run `uv pip install` into it through the **installer
//!   sandbox** (network on, the installer's uid, uv's shared cache writable), exactly like the
//!   environment cache builds its environments; user code sees the venv **read-only**, so it
//!   can import what was installed but cannot change it (packages are hard links into uv's
//!   cache: a writable venv would let a session poison the cache);
//! - `input/` — the session runner (`session_runner.py`), read-only at `/snakebox`.
//!
//! The interpreter is a [`LiveSandbox`] running the session runner, started on the first
//! call and kept between calls; it has the same isolation and limits as a one-shot run (its
//! memory and process limits hold for its whole life; the timeout is per call). A call that
//! times out, runs out of memory or kills the interpreter ends it: the next call starts a new
//! one and says so (`fresh_interpreter` and a note). Sessions are recorded in SQLite
//! ([`store`]); after a restart, a session's files and packages are there, its interpreter is
//! not.
//!
//! Calls to one session queue in order (a fair async mutex per session); calls to different
//! sessions run in parallel, each taking a run slot like one-shot runs. A background task
//! stops interpreters idle for `session_idle_stop` and deletes sessions unused for
//! `session_idle_delete`.
//!
//! The parts: this module holds the public types and small shared helpers;
//! [`manager`] the in-memory state of sessions, their lifecycle and the idle reaper;
//! [`interpreter`] the live interpreter and the calls that run in a session's sandbox;
//! [`install`] venvs and package installs; [`workspace`] the file tools over the confined
//! walk of [`files`]; [`store`] the SQLite record.

mod disk;
mod files;
mod image;
mod install;
mod interpreter;
mod manager;
mod store;
mod workspace;

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use self::files::FileEntry;
use self::manager::Manager;
use self::store::SessionRow;
pub(crate) use crate::config::SessionSettings;
use crate::result::{ErrorInfo, Package};
use crate::{EngineError, ErrorKind};
use crate::{Unavailable, ids};

/// The versioned directory of sessions under the data directory.
const SESSIONS_DIR: &str = "sessions-v1";
/// The session runner, embedded.
const SESSION_RUNNER: &str = include_str!("session_runner.py");
const RUNNER_NAME: &str = "session_runner.py";
/// Where the runner's directory and the workspace appear inside the sandbox.
const SANDBOX_INPUT_DIR: &str = "/snakebox";
const SANDBOX_WORK_DIR: &str = "/work";
/// Largest file the file tools read or write.
pub const MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;
/// Most entries `list_files` returns.
const MAX_LIST_ENTRIES: usize = 1000;

/// What `create_session` asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSession {
    /// Python version request (`3.12`); the server default when absent.
    pub python_version: Option<String>,
    /// Requirements installed at creation (PEP 508).
    pub dependencies: Vec<String>,
    /// A label for people.
    pub name: Option<String>,
    /// Network for the session's whole life: `Some(true)` asks for it (refused unless the
    /// server allows network), `Some(false)` declines it, `None` follows the server, exactly
    /// as for a one-shot run.
    pub network: Option<bool>,
    /// Narrow the server's network policy for the session's whole life to these names
    /// (each allowed by the server's policy), as `allowed_domains` of a one-shot run.
    pub allowed_domains: Vec<String>,
    /// The profile to hold the session to (default: the server's), all of it: network,
    /// packages, tenants, subprocesses, read-only /work, limits and imports.
    pub profile: Option<String>,
}

/// One session, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionInfo {
    /// The id to pass as `session_id`.
    pub session_id: String,
    /// Its label, if it was given one.
    pub name: Option<String>,
    /// Full Python version of its interpreter.
    pub python_version: String,
    /// Creation time (Unix seconds).
    pub created_at: u64,
    /// Last call (Unix seconds).
    pub last_used_at: u64,
    /// Requirements asked for so far (creation and installs).
    pub requested_packages: Vec<String>,
    /// What is installed in its environment.
    pub packages: Vec<Package>,
    /// Bytes used by its workspace and environment (as last measured).
    pub size_bytes: u64,
    /// Whether its interpreter is running now (variables are kept only while it is).
    pub interpreter_running: bool,
    /// Whether its code has network now: taken at creation, and only while the server
    /// allows network.
    pub network: bool,
    /// The names its code may reach when narrowed at creation (`allowed_domains`); empty:
    /// the server's whole policy.
    pub allowed_domains: Vec<String>,
    /// Cells run so far.
    pub executions: u64,
    /// The profile it is held to; `standard` for
    /// sessions made before profiles.
    pub profile: String,
}

/// `list_sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionList {
    /// Every session, most recently used first.
    pub sessions: Vec<SessionInfo>,
    /// How many sessions may exist.
    pub max_sessions: usize,
    /// Bytes all sessions may use together.
    pub max_disk_bytes: u64,
    /// Bytes they use now (as last measured).
    pub used_disk_bytes: u64,
    /// Bytes your sessions may use together (your share of the sessions' disk).
    pub tenant_max_disk_bytes: u64,
    /// Bytes your sessions use of it.
    pub tenant_used_disk_bytes: u64,
    /// Seconds after which an idle interpreter is stopped.
    pub idle_stop_seconds: u64,
    /// Seconds after which an unused session is deleted.
    pub idle_delete_seconds: u64,
}

/// Where a session's install is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InstallState {
    /// No install was asked for since the server started.
    None,
    /// An install is running.
    Running,
    /// The last install finished and succeeded.
    Succeeded,
    /// The last install failed (see `error`).
    Failed,
}

/// The state of a session's last install.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InstallStatus {
    /// The session.
    pub session_id: String,
    /// none, running, succeeded or failed.
    pub state: InstallState,
    /// What this install asked for.
    pub requested: Vec<String>,
    /// Start (Unix seconds).
    pub started_at: Option<u64>,
    /// End (Unix seconds).
    pub finished_at: Option<u64>,
    /// Why it failed.
    pub error: Option<ErrorInfo>,
    /// The end of uv's output.
    pub log_tail: String,
    /// What is installed in the session now.
    pub packages: Vec<Package>,
}

/// `list_packages`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PackageList {
    /// The session.
    pub session_id: String,
    /// Its Python version.
    pub python_version: String,
    /// Installed packages.
    pub packages: Vec<Package>,
    /// Requirements asked for so far.
    pub requested_packages: Vec<String>,
    /// The last install (running, finished or none).
    pub install: InstallStatus,
}

/// `read_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileContent {
    /// The session.
    pub session_id: String,
    /// Path relative to the workspace.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// `utf-8` when the content is text, else `base64`.
    pub encoding: String,
    /// The content.
    pub content: String,
}

/// `write_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileWritten {
    /// The session.
    pub session_id: String,
    /// Path relative to the workspace (the working directory of the session's code).
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// `list_files`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileList {
    /// The session.
    pub session_id: String,
    /// The directory listed, relative to the workspace (`""` is the workspace).
    pub path: String,
    /// Entries, sorted, directories followed by their contents.
    pub entries: Vec<FileEntry>,
    /// Whether the listing was cut at its maximum size.
    pub truncated: bool,
}

/// One session, as `check_environment` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionSummary {
    /// The id to pass as `session_id`.
    pub session_id: String,
    /// Its label, if it was given one.
    pub name: Option<String>,
    /// Python version of its interpreter.
    pub python_version: String,
    /// Whether its interpreter is running now.
    pub interpreter_running: bool,
    /// Bytes used by its workspace and environment (as last measured).
    pub size_bytes: u64,
    /// Last call (Unix seconds).
    pub last_used_at: u64,
}

/// Sessions, for `check_environment`: what exists, what runs, and the caps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionsReport {
    /// Whether sessions can be used (else `problem` says why).
    pub available: bool,
    /// Where sessions are kept.
    pub location: String,
    /// Live sessions (at most `max_sessions` may exist).
    pub count: usize,
    /// How many sessions may exist.
    pub max_sessions: usize,
    /// Interpreters running now (variables are kept only while they run).
    pub running_interpreters: usize,
    /// How many may run at once (the least recently used idle one is stopped past that).
    pub max_running_interpreters: usize,
    /// Bytes the sessions use together (as last measured).
    pub used_disk_bytes: u64,
    /// Bytes they may use together.
    pub max_disk_bytes: u64,
    /// Seconds after which an idle interpreter is stopped.
    pub idle_stop_seconds: u64,
    /// Seconds after which an unused session is deleted with its files.
    pub idle_delete_seconds: u64,
    /// The sessions, most recently used first (at most 50).
    pub sessions: Vec<SessionSummary>,
    /// How the disk is held: each tenant's share by the kernel while calls run (an image
    /// of its own), or only checked between calls, and why.
    pub disk_quota: String,
    /// Whether a write past a tenant's share fails while the call runs (`ENOSPC`), not only
    /// at the next call.
    pub disk_enforced_while_running: bool,
    /// Bytes one tenant's sessions may use (its share; in a tenant's report, its own, which
    /// is larger when its files did not fit a smaller one).
    pub tenant_max_disk_bytes: u64,
    /// Bytes the caller's sessions use of its share (absent in the operator's report).
    pub tenant_used_disk_bytes: Option<u64>,
    /// Bytes every tenant's share together reserves (at most `max_disk_bytes`; a
    /// server-wide total).
    pub reserved_disk_bytes: u64,
    /// Why sessions are unavailable.
    pub problem: Option<String>,
}

/// The sessions of an engine (or why there are none).
pub(crate) struct Sessions {
    inner: Result<Arc<Manager>, Unavailable>,
}

/// Sessions as a service: what creating sessions, running cells and commands in them,
/// installing into them and using their files needs (the settings, the sandbox and what each
/// sandbox is, the proxies, admission, the interpreter choice, the environment cache the
/// installs share, the artifact store cells keep files in), beside the sessions' own state
/// ([`Sessions`]).
pub(crate) struct SessionService {
    pub(crate) config: Arc<crate::EngineConfig>,
    pub(crate) sandbox: Result<Arc<snakebox_sandbox::Sandbox>, Unavailable>,
    pub(crate) calls: Arc<crate::lifecycle::Calls>,
    pub(crate) planner: Arc<crate::plan::Planner>,
    pub(crate) proxies: Arc<crate::network::Proxies>,
    pub(crate) sandboxes: Arc<crate::run::Sandboxes>,
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) artifacts: crate::artifacts::ArtifactStore,
    pub(crate) cache: Result<Arc<snakebox_env::EnvCache>, Unavailable>,
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn new_session_id() -> String {
    format!("s-{}", ids::random_hex())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn no_session(id: &str) -> EngineError {
    EngineError::new(ErrorKind::NotFound, format!("No session `{id}`")).with_hint(
        "call list_sessions to see the sessions that exist, or create_session to start one (sessions unused for a long time are deleted)",
    )
}

fn db_error(err: rusqlite::Error) -> EngineError {
    EngineError::internal(
        format!("The session database failed: {err}"),
        "check the data directory's disk space and permissions",
    )
}

/// Run blocking file-system work off the async threads; should it panic, that is `action`'s
/// error.
async fn blocking<R: Send + 'static>(
    action: &str,
    work: impl FnOnce() -> R + Send + 'static,
) -> Result<R, EngineError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| io_error(action, &std::io::Error::other(err)))
}

/// [`blocking`] for work that fails with an I/O error, also `action`'s error.
async fn blocking_io<R: Send + 'static>(
    action: &str,
    work: impl FnOnce() -> std::io::Result<R> + Send + 'static,
) -> Result<R, EngineError> {
    blocking(action, work)
        .await?
        .map_err(|err| io_error(action, &err))
}

fn io_error(action: &str, err: &std::io::Error) -> EngineError {
    EngineError::internal(
        format!("Failed to {action}: {err}"),
        "check the data directory's disk space and permissions",
    )
}

fn packages_of(row: &SessionRow) -> Vec<Package> {
    row.packages
        .iter()
        .map(|(name, version)| Package {
            name: name.clone(),
            version: version.clone(),
        })
        .collect()
}

fn unavailable(missing: &Unavailable) -> EngineError {
    missing.clone()
}

fn set_owner(path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    }
    Ok(())
}

fn make_dir(path: &Path, mode: u32, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs_err::create_dir_all(path)?;
    set_owner(path, owner)?;
    fs_err::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_before_they_touch_a_path() {
        assert!(valid_id(&new_session_id()));
        for bad in ["", "../x", "a/b", "A", "s-1 2", &"x".repeat(65)] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }
}
