//! Persistent sessions: a workspace, a virtual environment and a live interpreter that last
//! across calls, addressed by a `session_id`.
//!
//! A session on the host is `<data>/sessions-v1/<id>/`:
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

mod files;
mod store;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::Serialize;
use snakebox_env::{Interpreter, Uv, UvEnvironment, UvInvocation};
use snakebox_sandbox::{
    BackendKind, ExchangeEnd, Identity, LiveSandbox, Mount, OutputChunk, Policy, Sandbox,
    SandboxCommand, Termination,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

pub use self::files::FileEntry;
use self::store::{SessionRow, Store};
use crate::result::{ErrorInfo, ExecutionResult, Package, Status};
use crate::{Engine, ExecuteRequest, Unavailable, ids};

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
/// Time limit of one uv step of a session install.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// The operator's settings for sessions.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    /// A session's interpreter idle this long is stopped (variables lost, files kept).
    pub idle_stop: Duration,
    /// A session unused this long is deleted with its files.
    pub idle_delete: Duration,
    /// Sessions that may exist at once.
    pub max_sessions: usize,
    /// Total bytes of all sessions' workspaces and environments.
    pub max_disk_bytes: u64,
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings {
            idle_stop: Duration::from_secs(15 * 60),
            idle_delete: Duration::from_secs(7 * 24 * 3600),
            max_sessions: 32,
            max_disk_bytes: 10 * 1024 * 1024 * 1024,
        }
    }
}

/// What `create_session` asks for.
#[derive(Debug, Clone, Default)]
pub struct CreateSession {
    /// Python version request (`3.12`); the server default when absent.
    pub python_version: Option<String>,
    /// Requirements installed at creation (PEP 508).
    pub dependencies: Vec<String>,
    /// A label for people.
    pub name: Option<String>,
}

/// One session, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
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
    /// Cells run so far.
    pub executions: u64,
}

/// `list_sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct SessionList {
    /// Every session, most recently used first.
    pub sessions: Vec<SessionInfo>,
    /// How many sessions may exist.
    pub max_sessions: usize,
    /// Bytes all sessions may use together.
    pub max_disk_bytes: u64,
    /// Bytes they use now (as last measured).
    pub used_disk_bytes: u64,
    /// Seconds after which an idle interpreter is stopped.
    pub idle_stop_seconds: u64,
    /// Seconds after which an unused session is deleted.
    pub idle_delete_seconds: u64,
}

/// Where a session's install is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct FileWritten {
    /// The session.
    pub session_id: String,
    /// Path relative to the workspace (the working directory of the session's code).
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// `list_files`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
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
    /// Why sessions are unavailable.
    pub problem: Option<String>,
}

/// The sessions of an engine (or why there are none).
pub(crate) struct Sessions {
    inner: Result<Arc<Manager>, Unavailable>,
}

impl Sessions {
    /// Open the session store under `data_dir` and start the idle reaper.
    pub(crate) fn open(data_dir: &Path, settings: SessionSettings) -> Sessions {
        let root = data_dir.join(SESSIONS_DIR);
        let opened = fs_err::create_dir_all(&root)
            .map_err(|err| err.to_string())
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                // Traversable by the sandbox users (their own directories are below).
                fs_err::set_permissions(&root, std::fs::Permissions::from_mode(0o711))
                    .map_err(|err| err.to_string())
            })
            .and_then(|()| {
                Store::open(&root.join("sessions.db")).map_err(|err| {
                    format!(
                        "Failed to open the session database `{}`: {err}",
                        root.join("sessions.db").display()
                    )
                })
            });
        let inner = match opened {
            Ok(store) => {
                let manager = Arc::new(Manager {
                    root,
                    store,
                    slots: Mutex::default(),
                    settings,
                });
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    handle.spawn(reap_loop(Arc::downgrade(&manager)));
                }
                Ok(manager)
            }
            Err(message) => Err(Unavailable {
                message,
                hint: Some("check that the data directory is writable (--data-dir)".into()),
            }),
        };
        Sessions { inner }
    }
}

impl Sessions {
    /// What `check_environment` says about sessions.
    pub(crate) fn report(&self, data_dir: &Path) -> SessionsReport {
        let defaults = SessionSettings::default();
        let mut report = SessionsReport {
            available: false,
            location: data_dir.join(SESSIONS_DIR).display().to_string(),
            count: 0,
            max_sessions: defaults.max_sessions,
            running_interpreters: 0,
            used_disk_bytes: 0,
            max_disk_bytes: defaults.max_disk_bytes,
            idle_stop_seconds: defaults.idle_stop.as_secs(),
            idle_delete_seconds: defaults.idle_delete.as_secs(),
            sessions: Vec::new(),
            problem: None,
        };
        let manager = match &self.inner {
            Ok(manager) => manager,
            Err(missing) => {
                report.problem = Some(missing.message.clone());
                return report;
            }
        };
        let settings = &manager.settings;
        report.max_sessions = settings.max_sessions;
        report.max_disk_bytes = settings.max_disk_bytes;
        report.idle_stop_seconds = settings.idle_stop.as_secs();
        report.idle_delete_seconds = settings.idle_delete.as_secs();
        let rows = match manager.store.list() {
            Ok(rows) => rows,
            Err(err) => {
                report.problem = Some(db_error(err).message);
                return report;
            }
        };
        let running = manager.running();
        report.available = true;
        report.count = rows.len();
        report.running_interpreters = running.values().filter(|r| **r).count();
        report.used_disk_bytes = rows.iter().map(|r| r.venv_bytes + r.work_bytes).sum();
        report.sessions = rows
            .iter()
            .take(50)
            .map(|row| SessionSummary {
                session_id: row.id.clone(),
                name: row.name.clone(),
                python_version: row.python_version.clone(),
                interpreter_running: running.get(&row.id) == Some(&true),
                size_bytes: row.venv_bytes + row.work_bytes,
                last_used_at: row.last_used_at,
            })
            .collect();
        report
    }
}

/// Everything about sessions that outlives one call.
struct Manager {
    root: PathBuf,
    store: Store,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    settings: SessionSettings,
}

/// The in-memory side of one session.
struct Slot {
    state: tokio::sync::Mutex<SlotState>,
    install: Mutex<InstallStatus>,
    installing: AtomicBool,
    /// Fired when the session is deleted or reset: running calls end now.
    doomed: Mutex<CancellationToken>,
    /// Last use (Unix seconds), for stopping idle interpreters.
    last_used: AtomicU64,
}

#[derive(Default)]
struct SlotState {
    interpreter: Option<LiveSandbox>,
    /// Cells run by the current interpreter.
    cells_in_interpreter: u64,
    /// Cells run in this session (all interpreters).
    cells: u64,
    /// Why the variables of earlier calls are gone, when they are.
    lost: Option<String>,
    deleted: bool,
}

impl SlotState {
    /// Stop the interpreter; remember why its variables are gone.
    async fn stop(&mut self, reason: &str) {
        if let Some(mut interpreter) = self.interpreter.take() {
            interpreter.kill().await;
        }
        if self.cells_in_interpreter > 0 {
            self.lost = Some(reason.to_owned());
        }
        self.cells_in_interpreter = 0;
    }
}

/// The host side of one session.
struct SessionPaths {
    root: PathBuf,
    work: PathBuf,
    env: PathBuf,
    venv: PathBuf,
    input: PathBuf,
    tmp: PathBuf,
}

impl Manager {
    fn paths(&self, id: &str) -> SessionPaths {
        let root = self.root.join(id);
        SessionPaths {
            work: root.join("work"),
            env: root.join("env"),
            venv: root.join("env").join("venv"),
            input: root.join("input"),
            tmp: root.join("tmp"),
            root,
        }
    }

    fn row(&self, id: &str) -> Result<SessionRow, ErrorInfo> {
        if !valid_id(id) {
            return Err(no_session(id));
        }
        self.store
            .get(id)
            .map_err(db_error)?
            .ok_or_else(|| no_session(id))
    }

    /// The slot of an existing session (made on first use after a start).
    fn slot(&self, row: &SessionRow) -> Arc<Slot> {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slots
            .entry(row.id.clone())
            .or_insert_with(|| {
                Arc::new(Slot {
                    state: tokio::sync::Mutex::new(SlotState {
                        cells: row.executions,
                        // Cells ran before, in an interpreter this process never had.
                        lost: (row.executions > 0).then(|| {
                            "the server restarted since the session's last call".to_owned()
                        }),
                        ..SlotState::default()
                    }),
                    install: Mutex::new(InstallStatus {
                        session_id: row.id.clone(),
                        state: InstallState::None,
                        requested: Vec::new(),
                        started_at: None,
                        finished_at: None,
                        error: None,
                        log_tail: String::new(),
                        packages: packages_of(row),
                    }),
                    installing: AtomicBool::new(false),
                    doomed: Mutex::new(CancellationToken::new()),
                    last_used: AtomicU64::new(row.last_used_at),
                })
            })
            .clone()
    }

    /// Whether each session known in memory has a running interpreter.
    fn running(&self) -> HashMap<String, bool> {
        let slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slots
            .iter()
            .map(|(id, slot)| {
                let running = match slot.state.try_lock() {
                    Ok(mut state) => state
                        .interpreter
                        .as_mut()
                        .is_some_and(LiveSandbox::is_alive),
                    // Busy: a call is running in it.
                    Err(_) => true,
                };
                (id.clone(), running)
            })
            .collect()
    }

    fn forget(&self, id: &str) {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(id);
    }

    fn check_disk(&self) -> Result<(), ErrorInfo> {
        let used = self.store.total_bytes().map_err(db_error)?;
        if used >= self.settings.max_disk_bytes {
            return Err(ErrorInfo {
                message: format!(
                    "Sessions use {} of disk, at or over their limit of {}",
                    crate::execute::human_bytes(used),
                    crate::execute::human_bytes(self.settings.max_disk_bytes)
                ),
                hint: Some(
                    "delete files (run_command with `rm`) or whole sessions (delete_session); the operator can raise --sessions-max-disk".into(),
                ),
            });
        }
        Ok(())
    }

    /// Measure the workspace again (after a call that may have written to it).
    async fn remeasure(&self, id: &str) {
        let work = self.paths(id).work;
        let bytes = tokio::task::spawn_blocking(move || files::tree_bytes(&work))
            .await
            .unwrap_or(0);
        let _ = self.store.set_work_bytes(id, bytes);
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn new_session_id() -> String {
    let mut bytes = [0u8; 8];
    if fs_err::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_err()
    {
        bytes = u64::from_str_radix(&ids::execution_id()[..16], 16)
            .unwrap_or(0)
            .to_le_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("s-{hex}")
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn no_session(id: &str) -> ErrorInfo {
    ErrorInfo {
        message: format!("No session `{id}`"),
        hint: Some(
            "call list_sessions to see the sessions that exist, or create_session to start one (sessions unused for a long time are deleted)".into(),
        ),
    }
}

fn db_error(err: rusqlite::Error) -> ErrorInfo {
    ErrorInfo {
        message: format!("The session database failed: {err}"),
        hint: Some("check the data directory's disk space and permissions".into()),
    }
}

fn io_error(action: &str, err: &std::io::Error) -> ErrorInfo {
    ErrorInfo {
        message: format!("Failed to {action}: {err}"),
        hint: Some("check the data directory's disk space and permissions".into()),
    }
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

fn unavailable(missing: &Unavailable) -> ErrorInfo {
    ErrorInfo::from(missing)
}

/// Everything an install needs, owned, so it can go on after the call that asked for it.
#[derive(Clone)]
struct Installer {
    sandbox: Arc<Sandbox>,
    uv: Uv,
    uv_env: UvEnvironment,
    uv_cache: PathBuf,
    interpreter: Interpreter,
    env_dir: PathBuf,
    venv: PathBuf,
}

impl Installer {
    /// Run one uv step in the installer sandbox; uv's stderr goes to `progress`.
    async fn uv(
        &self,
        label: &str,
        args: Vec<std::ffi::OsString>,
        network: bool,
        progress: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<(Vec<u8>, String), ErrorInfo> {
        let mut read_only = vec![self.uv.dir().to_path_buf(), self.interpreter.prefix.clone()];
        if let Some(bin) = self.interpreter.executable.parent()
            && !bin.starts_with(&self.interpreter.prefix)
        {
            read_only.push(bin.to_path_buf());
        }
        if network {
            read_only.extend(
                ["SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE"]
                    .iter()
                    .filter_map(|name| self.uv_env.get(name))
                    .map(PathBuf::from)
                    .filter(|path| !path.starts_with("/etc/ssl") && path.exists()),
            );
        }
        let invocation = UvInvocation {
            program: self.uv.path.clone(),
            args,
            env: self.uv_env.for_uv(&self.uv_cache),
            cwd: self.env_dir.clone(),
            network,
            read_only,
            writable: vec![self.env_dir.clone(), self.uv_cache.clone()],
            timeout: INSTALL_TIMEOUT,
            label: label.to_owned(),
        };
        let command = SandboxCommand {
            program: invocation.program.clone(),
            args: invocation.args.clone(),
            control_channel: false,
        };
        let outcome = self
            .sandbox
            .run(
                &invocation.policy(),
                &command,
                CancellationToken::new(),
                progress,
            )
            .await
            .map_err(|err| ErrorInfo {
                message: format!("`{label}` could not start: {}", crate::describe(&err)),
                hint: err.hint(),
            })?;
        let stderr = outcome.stderr.text;
        match outcome.termination {
            Termination::TimedOut => Err(ErrorInfo {
                message: format!(
                    "`{label}` took longer than {} s and was stopped",
                    INSTALL_TIMEOUT.as_secs()
                ),
                hint: Some("install fewer packages at once".into()),
            }),
            _ if outcome.exit_code == Some(0) => Ok((outcome.stdout.text.into_bytes(), stderr)),
            _ => Err(ErrorInfo {
                message: format!("`{label}` failed: {}", stderr.trim()),
                hint: Some(
                    "check the package names and versions (PEP 508, e.g. \"pandas>=2.2\"), and that they exist for this Python version".into(),
                ),
            }),
        }
    }

    /// Make the empty venv.
    async fn create_venv(&self) -> Result<(), ErrorInfo> {
        self.uv(
            "uv venv",
            vec![
                "venv".into(),
                "--no-project".into(),
                "--python".into(),
                self.interpreter.executable.clone().into(),
                self.venv.clone().into(),
            ],
            false,
            None,
        )
        .await
        .map(|_| ())
    }

    /// Install `requirements`; returns what is installed afterwards, the venv's size and the
    /// end of uv's log.
    async fn install(
        &self,
        requirements: &[String],
        progress: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<(Vec<Package>, u64, String), ErrorInfo> {
        let python: std::ffi::OsString = self.venv.join("bin").join("python").into();
        let mut log = String::new();
        if !requirements.is_empty() {
            let mut args: Vec<std::ffi::OsString> = vec![
                "pip".into(),
                "install".into(),
                "--python".into(),
                python.clone(),
                "--link-mode".into(),
                "hardlink".into(),
                "--compile-bytecode".into(),
            ];
            args.extend(requirements.iter().map(Into::into));
            let (_, stderr) = self.uv("uv pip install", args, true, progress).await?;
            log = stderr;
        }
        let (listing, _) = self
            .uv(
                "uv pip list",
                vec![
                    "pip".into(),
                    "list".into(),
                    "--python".into(),
                    python,
                    "--format".into(),
                    "json".into(),
                ],
                false,
                None,
            )
            .await?;
        let mut packages: Vec<Package> = serde_json::from_slice::<Vec<serde_json::Value>>(&listing)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| {
                Some(Package {
                    name: p.get("name")?.as_str()?.to_owned(),
                    version: p.get("version")?.as_str()?.to_owned(),
                })
            })
            .collect();
        packages.sort_by(|a, b| a.name.cmp(&b.name));
        let venv = self.venv.clone();
        let bytes = tokio::task::spawn_blocking(move || make_readable(&venv))
            .await
            .unwrap_or(0);
        Ok((packages, bytes, tail(&log, 2000)))
    }
}

/// Let any uid read (and traverse) the venv; returns its size.
fn make_readable(root: &Path) -> u64 {
    use std::os::unix::fs::PermissionsExt;
    fn walk(path: &Path, total: &mut u64) {
        let Ok(meta) = path.symlink_metadata() else {
            return;
        };
        if meta.file_type().is_symlink() {
            return;
        }
        let mode = meta.permissions().mode();
        let want = if meta.is_dir() || mode & 0o111 != 0 {
            mode | 0o555
        } else {
            mode | 0o444
        };
        if want != mode {
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(want));
        }
        if meta.is_dir() {
            if let Ok(entries) = fs_err::read_dir(path) {
                for entry in entries.flatten() {
                    walk(&entry.path(), total);
                }
            }
        } else {
            *total += meta.len();
        }
    }
    let mut total = 0;
    walk(root, &mut total);
    total
}

fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
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

impl Engine {
    fn session_manager(&self) -> Result<&Arc<Manager>, ErrorInfo> {
        self.sessions.inner.as_ref().map_err(unavailable)
    }

    fn session_sandbox(&self) -> Result<&Arc<Sandbox>, ErrorInfo> {
        self.sandbox.as_ref().map_err(unavailable)
    }

    fn installer(
        &self,
        interpreter: &Interpreter,
        paths: &SessionPaths,
    ) -> Result<Installer, ErrorInfo> {
        let sandbox = self.session_sandbox()?;
        let uv = self.uv.as_ref().map_err(unavailable)?;
        let cache = self.cache.as_ref().map_err(unavailable)?;
        Ok(Installer {
            sandbox: Arc::clone(sandbox),
            uv: uv.clone(),
            uv_env: UvEnvironment::from_process(),
            uv_cache: cache.uv_cache_dir(),
            interpreter: interpreter.clone(),
            env_dir: paths.env.clone(),
            venv: paths.venv.clone(),
        })
    }

    /// The interpreter a session was made with (it must still exist on this host).
    fn session_interpreter(&self, row: &SessionRow) -> Result<&Interpreter, ErrorInfo> {
        self.interpreters
            .all()
            .iter()
            .find(|i| i.executable.as_os_str() == row.interpreter.as_str())
            .ok_or_else(|| ErrorInfo {
                message: format!(
                    "The interpreter of session `{}` (`{}`, Python {}) is no longer available on this host",
                    row.id, row.interpreter, row.python_version
                ),
                hint: Some(
                    "reinstall that Python, or delete the session and create a new one".into(),
                ),
            })
    }

    fn parse_requirements(packages: &[String]) -> Result<Vec<String>, ErrorInfo> {
        snakebox_script::merge_dependencies(None, packages)
            .map(|reqs| reqs.iter().map(ToString::to_string).collect())
            .map_err(|err| ErrorInfo {
                message: crate::describe(&err),
                hint: err.hint(),
            })
    }

    /// Directories and venv of a new (or reset) session; the create-time requirements
    /// installed. Returns what is installed and the venv's size.
    async fn build_session(
        &self,
        paths: &SessionPaths,
        interpreter: &Interpreter,
        requirements: &[String],
    ) -> Result<(Vec<Package>, u64), ErrorInfo> {
        let sandbox = self.session_sandbox()?;
        let user = sandbox.host_ids(Identity::Untrusted);
        let installer = sandbox.host_ids(Identity::Installer);
        (|| -> std::io::Result<()> {
            make_dir(&paths.root, 0o711, None)?;
            make_dir(&paths.work, 0o700, user)?;
            make_dir(&paths.tmp, 0o700, user)?;
            make_dir(&paths.input, 0o755, None)?;
            make_dir(&paths.env, 0o755, installer)?;
            Ok(())
        })()
        .map_err(|err| io_error("create the session's directories", &err))?;
        let installer = self.installer(interpreter, paths)?;
        installer.create_venv().await?;
        let (packages, bytes, _) = installer.install(requirements, None).await?;
        Ok((packages, bytes))
    }

    /// Create a session: a workspace, a venv with `dependencies`, and (on first use) a live
    /// interpreter.
    ///
    /// # Errors
    /// Invalid arguments, caps reached, no interpreter, a failed install.
    pub async fn create_session(&self, request: CreateSession) -> Result<SessionInfo, ErrorInfo> {
        let manager = self.session_manager()?;
        self.session_sandbox()?;
        if let Some(name) = &request.name
            && (name.len() > 200 || name.chars().any(char::is_control))
        {
            return Err(ErrorInfo {
                message:
                    "The session name must be at most 200 characters, without control characters"
                        .into(),
                hint: Some("use a short label such as \"sales-analysis\"".into()),
            });
        }
        let count = manager.store.count().map_err(db_error)?;
        if count >= manager.settings.max_sessions as u64 {
            return Err(ErrorInfo {
                message: format!(
                    "There are already {count} sessions, the most this server allows ({})",
                    manager.settings.max_sessions
                ),
                hint: Some("delete a session you no longer need (list_sessions, delete_session); the operator can raise --max-sessions".into()),
            });
        }
        manager.check_disk()?;
        let requirements = Self::parse_requirements(&request.dependencies)?;
        let interpreter = self.pick_interpreter(request.python_version.as_deref(), None)?;
        let id = new_session_id();
        let paths = manager.paths(&id);
        let built = self.build_session(&paths, interpreter, &requirements).await;
        let (packages, venv_bytes) = match built {
            Ok(built) => built,
            Err(err) => {
                let _ = fs_err::remove_dir_all(&paths.root);
                return Err(err);
            }
        };
        let now = now_secs();
        let row = SessionRow {
            id: id.clone(),
            name: request.name,
            interpreter: interpreter.executable.display().to_string(),
            python_version: interpreter.version.to_string(),
            base_requirements: requirements.clone(),
            requirements,
            packages: packages
                .iter()
                .map(|p| (p.name.clone(), p.version.clone()))
                .collect(),
            venv_bytes,
            work_bytes: 0,
            created_at: now,
            last_used_at: now,
            executions: 0,
        };
        if let Err(err) = manager.store.insert(&row) {
            let _ = fs_err::remove_dir_all(&paths.root);
            return Err(db_error(err));
        }
        tracing::info!(session = %id, python = %row.python_version, "session created");
        Ok(self.session_info(manager, &row, false))
    }

    fn session_info(&self, _manager: &Manager, row: &SessionRow, running: bool) -> SessionInfo {
        SessionInfo {
            session_id: row.id.clone(),
            name: row.name.clone(),
            python_version: row.python_version.clone(),
            created_at: row.created_at,
            last_used_at: row.last_used_at,
            requested_packages: row.requirements.clone(),
            packages: packages_of(row),
            size_bytes: row.venv_bytes + row.work_bytes,
            interpreter_running: running,
            executions: row.executions,
        }
    }

    /// Every session.
    ///
    /// # Errors
    /// When sessions are unavailable.
    pub async fn list_sessions(&self) -> Result<SessionList, ErrorInfo> {
        let manager = self.session_manager()?;
        let rows = manager.store.list().map_err(db_error)?;
        let running = manager.running();
        let sessions = rows
            .iter()
            .map(|row| self.session_info(manager, row, running.get(&row.id) == Some(&true)))
            .collect();
        Ok(SessionList {
            sessions,
            max_sessions: manager.settings.max_sessions,
            max_disk_bytes: manager.settings.max_disk_bytes,
            used_disk_bytes: manager.store.total_bytes().map_err(db_error)?,
            idle_stop_seconds: manager.settings.idle_stop.as_secs(),
            idle_delete_seconds: manager.settings.idle_delete.as_secs(),
        })
    }

    /// Delete a session: its interpreter (a running call ends now), files and packages.
    ///
    /// # Errors
    /// No such session.
    pub async fn delete_session(&self, id: &str) -> Result<(), ErrorInfo> {
        let manager = self.session_manager()?;
        let row = manager.row(id)?;
        delete(manager, &row.id).await
    }

    /// Reset a session to the state it was created in: a new interpreter, an empty workspace,
    /// only the packages given at creation. The id stays.
    ///
    /// # Errors
    /// No such session, a failed install.
    pub async fn reset_session(&self, id: &str) -> Result<SessionInfo, ErrorInfo> {
        let manager = self.session_manager()?;
        let row = manager.row(id)?;
        let interpreter = self.session_interpreter(&row)?;
        let slot = manager.slot(&row);
        replace_doomed(&slot);
        let mut state = slot.state.lock().await;
        state.stop("the session was reset").await;
        state.lost = None;
        state.cells = 0;
        let paths = manager.paths(&row.id);
        for dir in [&paths.work, &paths.env, &paths.tmp] {
            if dir.exists() {
                fs_err::remove_dir_all(dir)
                    .map_err(|err| io_error("clear the session's files", &err))?;
            }
        }
        let (packages, venv_bytes) = self
            .build_session(&paths, interpreter, &row.base_requirements)
            .await?;
        let now = now_secs();
        manager.store.reset(&row.id, now).map_err(db_error)?;
        let packages: Vec<(String, String)> = packages
            .iter()
            .map(|p| (p.name.clone(), p.version.clone()))
            .collect();
        manager
            .store
            .set_packages(&row.id, &row.base_requirements, &packages, venv_bytes)
            .map_err(db_error)?;
        drop(state);
        let row = manager.row(id)?;
        Ok(self.session_info(manager, &row, false))
    }

    /// Run code in a session's live interpreter (started first when there is none).
    pub async fn execute_in_session(
        &self,
        session_id: &str,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        let execution_id = ids::execution_id();
        let fail = |status: Status, error: ErrorInfo| {
            let mut result = ExecutionResult::not_run(execution_id.clone(), status, error);
            result.session_id = Some(session_id.to_owned());
            result
        };
        let setup = |error: ErrorInfo| fail(Status::SetupFailed, error);
        let manager = match self.session_manager() {
            Ok(manager) => manager,
            Err(error) => return setup(error),
        };
        let row = match manager.row(session_id) {
            Ok(row) => row,
            Err(error) => return fail(Status::InvalidRequest, error),
        };
        if request.script.len() > self.config.max_script_bytes || request.script.contains('\0') {
            return fail(
                Status::InvalidRequest,
                ErrorInfo {
                    message: format!(
                        "The code must be UTF-8 text without NUL characters, at most {} bytes",
                        self.config.max_script_bytes
                    ),
                    hint: Some("send shorter code; put large data in files (write_file)".into()),
                },
            );
        }
        // Input files: checked like a one-shot run's, written into the workspace below.
        let inputs = match crate::files::decode(&request.files) {
            Ok(inputs) => inputs,
            Err(error) => return fail(Status::InvalidRequest, error),
        };
        let mut notes = Vec::new();
        let timeout = match self.effective_timeout(request.timeout_seconds, &mut notes) {
            Ok(timeout) => timeout,
            Err((status, error)) => return fail(status, error),
        };
        if let Some(asked) = &request.python_version
            && !row.python_version.starts_with(asked.trim())
        {
            notes.push(format!(
                "python_version `{asked}` is ignored: session {session_id} runs Python {}",
                row.python_version
            ));
        }
        // Dependencies (argument or PEP 723 block) are installed into the session first.
        let block = match snakebox_script::parse(&request.script) {
            Ok(block) => block,
            Err(err) => {
                return fail(
                    Status::InvalidRequest,
                    ErrorInfo {
                        message: crate::describe(&err),
                        hint: err.hint(),
                    },
                );
            }
        };
        let requirements = match snakebox_script::merge_dependencies(
            block.as_ref().map(|b| &b.metadata),
            &request.dependencies,
        ) {
            Ok(reqs) => reqs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            Err(err) => {
                return fail(
                    Status::InvalidRequest,
                    ErrorInfo {
                        message: crate::describe(&err),
                        hint: err.hint(),
                    },
                );
            }
        };
        let setup_started = std::time::Instant::now();
        if !requirements.is_empty() {
            match self
                .install_packages(session_id, requirements.clone(), None, None)
                .await
            {
                Ok(status) if status.state == InstallState::Succeeded => {}
                Ok(status) => {
                    return setup(status.error.unwrap_or(ErrorInfo {
                        message: "Installing the dependencies failed".into(),
                        hint: None,
                    }));
                }
                Err(error) => return setup(error),
            }
        }
        let interpreter = match self.session_interpreter(&row) {
            Ok(interpreter) => interpreter.clone(),
            Err(error) => return setup(error),
        };
        let slot = manager.slot(&row);
        let doomed = slot
            .doomed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut state = slot.state.lock().await;
        if state.deleted || doomed.is_cancelled() {
            return fail(Status::InvalidRequest, no_session(session_id));
        }
        if let Err(error) = manager.check_disk() {
            return setup(error);
        }
        // The input files, then what the workspace holds before the call: only what the
        // call creates or changes becomes an artifact.
        let work = manager.paths(&row.id).work;
        let owner = self
            .session_sandbox()
            .ok()
            .and_then(|sandbox| sandbox.host_ids(Identity::Untrusted));
        let baseline = {
            let work = work.clone();
            tokio::task::spawn_blocking(move || {
                write_inputs(&work, &inputs, owner)
                    .map(|()| crate::artifacts::Baseline::snapshot(&work))
            })
            .await
            .unwrap_or_else(|err| {
                Err(io_error(
                    "write the input files",
                    &std::io::Error::other(err),
                ))
            })
        };
        let baseline = match baseline {
            Ok(baseline) => baseline,
            Err(error) => return fail(Status::InvalidRequest, error),
        };
        let Ok(_run_slot) = self.runs.acquire().await else {
            return setup(ErrorInfo {
                message: "The engine is shutting down".into(),
                hint: None,
            });
        };
        slot.last_used.store(now_secs(), Ordering::Relaxed);

        // The interpreter: the one still running, or a new one.
        let alive = state
            .interpreter
            .as_mut()
            .is_some_and(LiveSandbox::is_alive);
        let mut fresh = false;
        if !alive {
            if state.interpreter.is_some() {
                state.interpreter = None;
                if state.cells_in_interpreter > 0 {
                    state.lost = Some("the interpreter exited between calls".into());
                }
            }
            match self.start_interpreter(manager, &row.id, &interpreter) {
                Ok(live) => {
                    state.interpreter = Some(live);
                    state.cells_in_interpreter = 0;
                    fresh = true;
                }
                Err(error) => return setup(error),
            }
        }
        if fresh && let Some(reason) = state.lost.take() {
            notes.push(format!(
                "A new interpreter was started for this session because {reason}: variables, imports and functions from earlier calls are gone; files in the workspace and installed packages remain"
            ));
        }
        let setup_ms = ids::millis(setup_started.elapsed());

        // The call, cancelled by the client or by a delete/reset of the session.
        let call = doomed.child_token();
        let watcher = {
            let call = call.clone();
            tokio::spawn(async move {
                cancel.cancelled().await;
                call.cancel();
            })
        };
        let cell = state.cells + 1;
        let marker = format!("\x1esnakebox-end-{}\x1e", ids::execution_id());
        let request_line = serde_json::json!({
            "code": request.script,
            "marker": marker,
            "cell": cell,
        })
        .to_string()
            + "\n";
        let Some(live) = state.interpreter.as_mut() else {
            watcher.abort();
            return setup(ErrorInfo {
                message: "The session's interpreter could not be started".into(),
                hint: None,
            });
        };
        let exchange = live
            .exchange(
                request_line.as_bytes(),
                marker.as_bytes(),
                timeout,
                call,
                output,
            )
            .await;
        watcher.abort();
        state.cells = cell;
        state.cells_in_interpreter += 1;
        let _ = manager.store.touch(&row.id, now_secs(), true);

        let mut result = ExecutionResult::new(execution_id.clone(), Status::Ok);
        result.session_id = Some(session_id.to_owned());
        result.fresh_interpreter = fresh;
        result.python_version = Some(row.python_version.clone());
        result.requested_dependencies = requirements;
        result.resolved_dependencies = manager
            .store
            .get(&row.id)
            .ok()
            .flatten()
            .map(|r| packages_of(&r))
            .unwrap_or_default();
        result.environment_reused = true;
        result.timeout_seconds = timeout.as_secs();
        result.setup_ms = setup_ms;
        result.notes = notes;
        let exchange = match exchange {
            Ok(exchange) => exchange,
            Err(err) => {
                state.stop("the interpreter failed").await;
                result.status = Status::SetupFailed;
                result.error = Some(ErrorInfo {
                    message: crate::describe(&err),
                    hint: err.hint(),
                });
                return result;
            }
        };
        result.duration_ms = ids::millis(exchange.duration);
        result.stdout_truncated = exchange.stdout.truncated;
        result.stderr_truncated = exchange.stderr.truncated;
        result.stdout = exchange.stdout.text;
        result.stderr = exchange.stderr.text;
        let lost = "variables are lost; files in the workspace and installed packages remain, and the next call starts a new interpreter";
        match exchange.end {
            ExchangeEnd::Answered => {
                let exit_code = record_exit_code(&exchange.answer);
                result.exit_code = Some(exit_code);
                result.status = if exit_code == 0 {
                    Status::Ok
                } else {
                    Status::Error
                };
            }
            ExchangeEnd::TimedOut => {
                state.stop("the previous call timed out").await;
                result.status = Status::Timeout;
                result.timed_out = true;
                result.error = Some(ErrorInfo {
                    message: format!(
                        "The code ran longer than its timeout of {} s; the session's interpreter was stopped: {lost}",
                        timeout.as_secs()
                    ),
                    hint: Some("raise timeout_seconds (up to the server's --max-timeout) or make the code faster".into()),
                });
            }
            ExchangeEnd::Cancelled => {
                state.stop("the previous call was cancelled").await;
                result.status = Status::Cancelled;
                result.error = Some(ErrorInfo {
                    message: format!(
                        "The call was cancelled; the session's interpreter was stopped: {lost}"
                    ),
                    hint: None,
                });
            }
            ExchangeEnd::MemoryLimit => {
                state.stop("the previous call ran out of memory").await;
                result.status = Status::MemoryLimit;
                result.error = Some(ErrorInfo {
                    message: format!(
                        "The session's interpreter exceeded its memory limit of {} and was stopped: {lost}",
                        self.config
                            .memory_bytes
                            .map_or_else(|| "(unset)".to_string(), crate::execute::human_bytes)
                    ),
                    hint: Some("process the data in smaller pieces, or ask the operator to raise --memory-limit".into()),
                });
            }
            ExchangeEnd::Exited => {
                state
                    .stop("the interpreter exited during the previous call")
                    .await;
                result.status = Status::Error;
                result.exit_code = exchange.exit_code;
                let how = match (exchange.exit_code, exchange.signal) {
                    (_, Some(signal)) => format!("was killed by signal {signal}"),
                    (Some(code), None) => format!("exited with code {code}"),
                    (None, None) => "ended".to_owned(),
                };
                result.error = Some(ErrorInfo {
                    message: format!("The session's interpreter {how} during this call: {lost}"),
                    hint: Some(
                        "use exceptions or sys.exit() rather than os._exit() to stop a cell".into(),
                    ),
                });
            }
        }
        // Value, names, exception and figures from the record; files the call created or
        // changed in the workspace as artifacts (also after a timeout or a crash), exactly as
        // for a one-shot run.
        let rich = self
            .collect_rich(&execution_id, &work, baseline, &exchange.answer)
            .await;
        drop(state);
        rich.apply(&mut result);
        manager.remeasure(&row.id).await;
        result
    }

    /// The policy of a session's sandboxes (interpreter and commands) over its workspace.
    fn session_policy(
        &self,
        paths: &SessionPaths,
        interpreter: &Interpreter,
        timeout: Duration,
    ) -> (Policy, PathBuf) {
        let native = self.config.backend == BackendKind::Native;
        let (work, tmp, runner) = if native {
            (
                PathBuf::from(SANDBOX_WORK_DIR),
                PathBuf::from("/tmp"),
                PathBuf::from(SANDBOX_INPUT_DIR).join(RUNNER_NAME),
            )
        } else {
            (
                paths.work.clone(),
                paths.tmp.clone(),
                paths.input.join(RUNNER_NAME),
            )
        };
        let mut mounts = vec![
            Mount {
                host: paths.venv.clone(),
                dest: paths.venv.clone(),
                writable: false,
            },
            Mount {
                host: interpreter.prefix.clone(),
                dest: interpreter.prefix.clone(),
                writable: false,
            },
        ];
        if let Some(bin) = interpreter.executable.parent()
            && !bin.starts_with(&interpreter.prefix)
        {
            mounts.push(Mount {
                host: bin.to_path_buf(),
                dest: bin.to_path_buf(),
                writable: false,
            });
        }
        mounts.push(Mount {
            host: paths.input.clone(),
            dest: PathBuf::from(SANDBOX_INPUT_DIR),
            writable: false,
        });
        mounts.push(Mount {
            host: paths.work.clone(),
            dest: PathBuf::from(SANDBOX_WORK_DIR),
            writable: true,
        });
        let bin = paths.venv.join("bin");
        let env = vec![
            (
                "PATH".into(),
                format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()),
            ),
            ("VIRTUAL_ENV".into(), paths.venv.display().to_string()),
            ("HOME".into(), work.display().to_string()),
            ("TMPDIR".into(), tmp.display().to_string()),
            ("LANG".into(), "C.UTF-8".into()),
            ("LC_ALL".into(), "C.UTF-8".into()),
            ("PYTHONUNBUFFERED".into(), "1".into()),
            ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
            ("PYTHONIOENCODING".into(), "utf-8".into()),
            ("MPLBACKEND".into(), "Agg".into()),
        ];
        let mut limits = self.limits(timeout);
        // RLIMIT_CPU counts a process's whole life: for an interpreter that lives across
        // calls it would be a budget for the session, not a limit per call. Wall time per
        // call bounds the CPU instead.
        limits.cpu_time = None;
        (
            Policy {
                mounts,
                network: self.config.network,
                env,
                cwd: work,
                limits,
                identity: Identity::Untrusted,
            },
            runner,
        )
    }

    fn start_interpreter(
        &self,
        manager: &Manager,
        id: &str,
        interpreter: &Interpreter,
    ) -> Result<LiveSandbox, ErrorInfo> {
        let sandbox = self.session_sandbox()?;
        let paths = manager.paths(id);
        let runner_path = paths.input.join(RUNNER_NAME);
        (|| -> std::io::Result<()> {
            use std::os::unix::fs::PermissionsExt;
            make_dir(&paths.input, 0o755, None)?;
            make_dir(&paths.tmp, 0o700, sandbox.host_ids(Identity::Untrusted))?;
            fs_err::write(&runner_path, SESSION_RUNNER)?;
            fs_err::set_permissions(&runner_path, std::fs::Permissions::from_mode(0o644))?;
            // The one-shot runner: the session runner imports its execution core.
            let core = paths.input.join(crate::runner::FILE_NAME);
            fs_err::write(&core, crate::runner::SOURCE)?;
            fs_err::set_permissions(&core, std::fs::Permissions::from_mode(0o644))
        })()
        .map_err(|err| io_error("write the session runner", &err))?;
        let (policy, runner) = self.session_policy(&paths, interpreter, self.config.max_timeout);
        let command = SandboxCommand {
            program: paths.venv.join("bin").join("python"),
            args: vec!["-s".into(), runner.into_os_string()],
            control_channel: true,
        };
        sandbox.spawn(&policy, &command).map_err(|err| ErrorInfo {
            message: format!(
                "Failed to start the session's interpreter: {}",
                crate::describe(&err)
            ),
            hint: err.hint(),
        })
    }

    /// Install packages into a session. Waits up to `wait` (default: until done) and returns
    /// the install's state; an install still running then goes on, and `list_packages` reports
    /// it. uv's output goes to `progress` while it runs.
    ///
    /// # Errors
    /// No such session, invalid requirements, an install already running, disk full.
    pub async fn install_packages(
        &self,
        session_id: &str,
        packages: Vec<String>,
        wait: Option<Duration>,
        progress: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<InstallStatus, ErrorInfo> {
        let manager = self.session_manager()?;
        let row = manager.row(session_id)?;
        if packages.is_empty() {
            return Err(ErrorInfo {
                message: "No packages given".into(),
                hint: Some(
                    "pass PEP 508 specifiers, e.g. [\"pandas>=2.2\", \"six==1.16.0\"]".into(),
                ),
            });
        }
        let requirements = Self::parse_requirements(&packages)?;
        manager.check_disk()?;
        let interpreter = self.session_interpreter(&row)?;
        let installer = self.installer(interpreter, &manager.paths(&row.id))?;
        let slot = manager.slot(&row);
        if slot.installing.swap(true, Ordering::SeqCst) {
            return Err(ErrorInfo {
                message: format!("An install is already running in session `{session_id}`"),
                hint: Some("wait for it: list_packages shows its state".into()),
            });
        }
        {
            let mut status = slot
                .install
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            status.state = InstallState::Running;
            status.requested.clone_from(&requirements);
            status.started_at = Some(now_secs());
            status.finished_at = None;
            status.error = None;
            status.log_tail.clear();
        }
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let task_manager = Arc::clone(manager);
        let task_slot = Arc::clone(&slot);
        let id = row.id.clone();
        tokio::spawn(async move {
            let state = task_slot.state.lock().await;
            let outcome = if state.deleted {
                Err(no_session(&id))
            } else {
                installer.install(&requirements, progress).await
            };
            let mut all_requirements = task_manager
                .store
                .get(&id)
                .ok()
                .flatten()
                .map(|r| r.requirements)
                .unwrap_or_default();
            {
                let mut status = task_slot
                    .install
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                status.finished_at = Some(now_secs());
                match outcome {
                    Ok((packages, bytes, log)) => {
                        for requirement in &requirements {
                            if !all_requirements.contains(requirement) {
                                all_requirements.push(requirement.clone());
                            }
                        }
                        let pairs: Vec<(String, String)> = packages
                            .iter()
                            .map(|p| (p.name.clone(), p.version.clone()))
                            .collect();
                        let _ =
                            task_manager
                                .store
                                .set_packages(&id, &all_requirements, &pairs, bytes);
                        status.state = InstallState::Succeeded;
                        status.packages = packages;
                        status.log_tail = log;
                    }
                    Err(error) => {
                        status.state = InstallState::Failed;
                        status.error = Some(error);
                    }
                }
            }
            drop(state);
            task_slot.installing.store(false, Ordering::SeqCst);
            let _ = done_tx.send(());
        });
        match wait {
            Some(wait) => {
                let _ = tokio::time::timeout(wait, done_rx).await;
            }
            None => {
                let _ = done_rx.await;
            }
        }
        let status = slot
            .install
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Ok(status)
    }

    /// Installed packages and the state of the last install.
    ///
    /// # Errors
    /// No such session.
    pub async fn list_packages(&self, session_id: &str) -> Result<PackageList, ErrorInfo> {
        let manager = self.session_manager()?;
        let row = manager.row(session_id)?;
        let slot = manager.slot(&row);
        let install = slot
            .install
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Ok(PackageList {
            session_id: row.id.clone(),
            python_version: row.python_version.clone(),
            packages: packages_of(&row),
            requested_packages: row.requirements.clone(),
            install,
        })
    }

    /// Run a shell command in a sandbox over the session's workspace and environment (a
    /// separate short-lived sandbox with the same view and limits as the interpreter's).
    pub async fn run_command(
        &self,
        session_id: &str,
        command: &str,
        timeout_seconds: Option<i64>,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        let execution_id = ids::execution_id();
        let fail = |status: Status, error: ErrorInfo| {
            let mut result = ExecutionResult::not_run(execution_id.clone(), status, error);
            result.session_id = Some(session_id.to_owned());
            result
        };
        let manager = match self.session_manager() {
            Ok(manager) => manager,
            Err(error) => return fail(Status::SetupFailed, error),
        };
        let row = match manager.row(session_id) {
            Ok(row) => row,
            Err(error) => return fail(Status::InvalidRequest, error),
        };
        if command.trim().is_empty() || command.contains('\0') || command.len() > 64 * 1024 {
            return fail(
                Status::InvalidRequest,
                ErrorInfo {
                    message:
                        "The command must be non-empty text without NUL characters, at most 64 KiB"
                            .into(),
                    hint: Some("for example \"ls -la\" or \"python -m pip list\"".into()),
                },
            );
        }
        let mut notes = Vec::new();
        let timeout = match self.effective_timeout(timeout_seconds, &mut notes) {
            Ok(timeout) => timeout,
            Err((status, error)) => return fail(status, error),
        };
        let interpreter = match self.session_interpreter(&row) {
            Ok(interpreter) => interpreter.clone(),
            Err(error) => return fail(Status::SetupFailed, error),
        };
        let sandbox = match self.session_sandbox() {
            Ok(sandbox) => Arc::clone(sandbox),
            Err(error) => return fail(Status::SetupFailed, error),
        };
        let slot = manager.slot(&row);
        let doomed = slot
            .doomed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let state = slot.state.lock().await;
        if state.deleted || doomed.is_cancelled() {
            return fail(Status::InvalidRequest, no_session(session_id));
        }
        if let Err(error) = manager.check_disk() {
            return fail(Status::SetupFailed, error);
        }
        let Ok(_run_slot) = self.runs.acquire().await else {
            return fail(
                Status::SetupFailed,
                ErrorInfo {
                    message: "The engine is shutting down".into(),
                    hint: None,
                },
            );
        };
        slot.last_used.store(now_secs(), Ordering::Relaxed);
        let paths = manager.paths(&row.id);
        let (policy, _) = self.session_policy(&paths, &interpreter, timeout);
        let shell = SandboxCommand {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), command.into()],
            control_channel: false,
        };
        let call = doomed.child_token();
        let watcher = {
            let call = call.clone();
            tokio::spawn(async move {
                cancel.cancelled().await;
                call.cancel();
            })
        };
        let outcome = sandbox.run(&policy, &shell, call, output).await;
        watcher.abort();
        let _ = manager.store.touch(&row.id, now_secs(), false);
        drop(state);
        manager.remeasure(&row.id).await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(err) => {
                return fail(
                    Status::SetupFailed,
                    ErrorInfo {
                        message: crate::describe(&err),
                        hint: err.hint(),
                    },
                );
            }
        };
        let (status, error) = crate::execute::classify(&outcome, &self.config, timeout);
        let mut result = ExecutionResult::new(execution_id.clone(), status);
        result.session_id = Some(session_id.to_owned());
        result.exit_code = outcome.exit_code;
        result.stdout_truncated = outcome.stdout.truncated;
        result.stderr_truncated = outcome.stderr.truncated;
        result.stdout = outcome.stdout.text;
        result.stderr = outcome.stderr.text;
        result.timed_out = outcome.termination == Termination::TimedOut;
        result.duration_ms = ids::millis(outcome.duration);
        result.timeout_seconds = timeout.as_secs();
        result.python_version = Some(row.python_version.clone());
        result.resolved_dependencies = packages_of(&row);
        result.environment_reused = true;
        result.error = error;
        result.notes = notes;
        result
    }

    /// Write a file into a session's workspace (parents created).
    ///
    /// # Errors
    /// No such session, a path outside the workspace, too large, disk full.
    pub async fn write_file(
        &self,
        session_id: &str,
        path: &str,
        content: &str,
        encoding: Option<&str>,
    ) -> Result<FileWritten, ErrorInfo> {
        let manager = self.session_manager()?;
        let row = manager.row(session_id)?;
        let content = match encoding.map(str::to_ascii_lowercase).as_deref() {
            None | Some("utf-8" | "utf8" | "text") => content.as_bytes().to_vec(),
            Some("base64") => decode_base64(content).ok_or_else(|| ErrorInfo {
                message: "The content is not valid base64".into(),
                hint: Some("encode binary content with standard base64 (RFC 4648)".into()),
            })?,
            Some(other) => {
                return Err(ErrorInfo {
                    message: format!("Unknown encoding `{other}`"),
                    hint: Some("use \"utf-8\" (default) or \"base64\"".into()),
                });
            }
        };
        if content.len() as u64 > MAX_FILE_BYTES {
            return Err(ErrorInfo {
                message: format!(
                    "The content is {} bytes, more than the limit of {MAX_FILE_BYTES} bytes",
                    content.len()
                ),
                hint: Some(
                    "write large data in pieces, or download it from the session's code".into(),
                ),
            });
        }
        manager.check_disk()?;
        let owner = self.session_sandbox()?.host_ids(Identity::Untrusted);
        let work = manager.paths(&row.id).work;
        let slot = manager.slot(&row);
        let state = slot.state.lock().await;
        if state.deleted {
            return Err(no_session(session_id));
        }
        let rel = path.to_owned();
        let size = tokio::task::spawn_blocking(move || files::write(&work, &rel, &content, owner))
            .await
            .map_err(|err| io_error("write the file", &std::io::Error::other(err)))?
            .map_err(file_error)?;
        drop(state);
        let _ = manager.store.touch(&row.id, now_secs(), false);
        manager.remeasure(&row.id).await;
        Ok(FileWritten {
            session_id: row.id,
            path: path.to_owned(),
            size,
        })
    }

    /// Read a file from a session's workspace.
    ///
    /// # Errors
    /// No such session or file, a path outside the workspace, a symlink, too large.
    pub async fn read_file(&self, session_id: &str, path: &str) -> Result<FileContent, ErrorInfo> {
        let manager = self.session_manager()?;
        let row = manager.row(session_id)?;
        let work = manager.paths(&row.id).work;
        let rel = path.to_owned();
        let data = tokio::task::spawn_blocking(move || files::read(&work, &rel, MAX_FILE_BYTES))
            .await
            .map_err(|err| io_error("read the file", &std::io::Error::other(err)))?
            .map_err(file_error)?;
        let size = data.len() as u64;
        let (encoding, content) = match String::from_utf8(data) {
            Ok(text) => ("utf-8", text),
            Err(err) => ("base64", base64(err.as_bytes())),
        };
        Ok(FileContent {
            session_id: row.id,
            path: path.to_owned(),
            size,
            encoding: encoding.into(),
            content,
        })
    }

    /// List a directory of a session's workspace.
    ///
    /// # Errors
    /// No such session or directory, a path outside the workspace.
    pub async fn list_files(
        &self,
        session_id: &str,
        path: &str,
        depth: usize,
    ) -> Result<FileList, ErrorInfo> {
        let manager = self.session_manager()?;
        let row = manager.row(session_id)?;
        let work = manager.paths(&row.id).work;
        let rel = path.to_owned();
        let depth = depth.clamp(1, 10);
        let (entries, truncated) =
            tokio::task::spawn_blocking(move || files::list(&work, &rel, depth, MAX_LIST_ENTRIES))
                .await
                .map_err(|err| io_error("list the directory", &std::io::Error::other(err)))?
                .map_err(file_error)?;
        Ok(FileList {
            session_id: row.id,
            path: path.to_owned(),
            entries,
            truncated,
        })
    }
}

fn file_error(err: files::FileError) -> ErrorInfo {
    let hint = match &err {
        files::FileError::BadPath { .. } => {
            "paths are relative to the session's workspace (its working directory), e.g. \"data/input.csv\""
        }
        files::FileError::NotFound { .. } => "list_files shows what is there",
        files::FileError::Symlink { .. } => {
            "read the link's target by its own path inside the workspace"
        }
        files::FileError::TooLarge { .. } => "read large files in pieces from the session's code",
        _ => "list_files shows what is there",
    };
    ErrorInfo {
        message: err.to_string(),
        hint: Some(hint.into()),
    }
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(TABLE[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decode standard base64 (padding optional, whitespace ignored).
pub(crate) fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let mut acc: u32 = 0;
    let mut bits = 0;
    let mut padding = false;
    for c in text.bytes() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => {
                padding = true;
                continue;
            }
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return None,
        };
        if padding {
            return None;
        }
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    (bits < 6).then_some(out)
}

/// The exit code a cell's record reports (`exit()`, an exception); 1 when the record is
/// unreadable. Forgeable by the cell's code, which only changes its own call's status.
fn record_exit_code(answer: &[u8]) -> i32 {
    serde_json::from_slice::<serde_json::Value>(answer)
        .ok()
        .map_or(Some(1), |record| {
            record
                .get("exit_code")
                .and_then(serde_json::Value::as_i64)
                .and_then(|c| i32::try_from(c).ok())
        })
        .unwrap_or(0)
}

/// Write a call's input files (checked by [`crate::files::decode`]) into the workspace,
/// owned by the sandbox user, through the confined walk of the file tools.
fn write_inputs(
    work: &Path,
    inputs: &[crate::files::DecodedFile],
    owner: Option<(u32, u32)>,
) -> Result<(), ErrorInfo> {
    for input in inputs {
        let path = input.path();
        files::write(work, &path, &input.bytes, owner).map_err(|err| {
            let mut error = file_error(err);
            error.message = format!(
                "Input file `{path}` could not be written: {}",
                error.message
            );
            error
        })?;
    }
    Ok(())
}

fn replace_doomed(slot: &Slot) {
    let mut doomed = slot
        .doomed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    doomed.cancel();
    *doomed = CancellationToken::new();
}

/// Delete a session: running calls end, the interpreter stops, files and record go.
async fn delete(manager: &Manager, id: &str) -> Result<(), ErrorInfo> {
    let row = manager.row(id)?;
    let slot = manager.slot(&row);
    replace_doomed(&slot);
    let mut state = slot.state.lock().await;
    state.stop("the session was deleted").await;
    state.deleted = true;
    manager.store.delete(id).map_err(db_error)?;
    manager.forget(id);
    let root = manager.paths(id).root;
    drop(state);
    tokio::task::spawn_blocking(move || fs_err::remove_dir_all(root))
        .await
        .map_err(|err| io_error("delete the session's files", &std::io::Error::other(err)))?
        .map_err(|err| io_error("delete the session's files", &err))?;
    tracing::info!(session = %id, "session deleted");
    Ok(())
}

/// Stop idle interpreters and delete sessions unused for too long, until the manager goes.
async fn reap_loop(manager: Weak<Manager>) {
    let period = match manager.upgrade() {
        Some(m) => {
            (m.settings.idle_stop / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
        }
        None => return,
    };
    loop {
        tokio::time::sleep(period).await;
        let Some(manager) = manager.upgrade() else {
            return;
        };
        reap(&manager).await;
    }
}

async fn reap(manager: &Manager) {
    let now = now_secs();
    let slots: Vec<(String, Arc<Slot>)> = manager
        .slots
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .map(|(id, slot)| (id.clone(), Arc::clone(slot)))
        .collect();
    let idle_stop = manager.settings.idle_stop.as_secs();
    for (id, slot) in slots {
        let idle = now.saturating_sub(slot.last_used.load(Ordering::Relaxed));
        if idle < idle_stop {
            continue;
        }
        // A busy session is not idle; try again next time.
        if let Ok(mut state) = slot.state.try_lock()
            && state.interpreter.is_some()
        {
            state
                .stop(&format!(
                    "its interpreter was idle for more than {idle_stop} s and was stopped"
                ))
                .await;
            tracing::info!(session = %id, "stopped an idle interpreter");
        }
    }
    let idle_delete = manager.settings.idle_delete.as_secs();
    let Ok(rows) = manager.store.list() else {
        return;
    };
    for row in rows {
        if now.saturating_sub(row.last_used_at) < idle_delete {
            continue;
        }
        let busy = manager
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&row.id)
            .is_some_and(|slot| {
                slot.installing.load(Ordering::SeqCst) || slot.state.try_lock().is_err()
            });
        if !busy {
            match delete(manager, &row.id).await {
                Ok(()) => tracing::info!(session = %row.id, "deleted an unused session"),
                Err(err) => {
                    tracing::warn!(session = %row.id, error = %err.message, "could not delete an unused session")
                }
            }
        }
    }
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

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(&[0xff, 0x00, 0x80, 0x7f]), "/wCAfw==");
        for data in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            &[0xff, 0x00, 0x80, 0x7f],
        ] {
            assert_eq!(decode_base64(&base64(data)).as_deref(), Some(data));
        }
        assert_eq!(decode_base64("Zm9v\nYmFy").as_deref(), Some(&b"foobar"[..]));
        assert_eq!(decode_base64("Zm9v!"), None);
        assert_eq!(decode_base64("Zg==Zg"), None);
    }

    #[test]
    fn record_gives_the_exit_code() {
        assert_eq!(record_exit_code(br#"{"value":null,"exit_code":0}"#), 0);
        assert_eq!(record_exit_code(br#"{"exception":{},"exit_code":1}"#), 1);
        assert_eq!(record_exit_code(br#"{"exit_code":3}"#), 3);
        assert_eq!(record_exit_code(b"not json"), 1);
    }
}
