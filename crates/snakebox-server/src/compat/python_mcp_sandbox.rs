//! The tool set of python-mcp-sandbox (`create_sandbox`, `list_sandboxes`,
//! `execute_python_code`, `install_package_in_sandbox`, `check_package_installation_status`,
//! `execute_terminal_command`, `upload_file_to_sandbox`), served when the operator names it
//! (`serve --compat-tools python-mcp-sandbox`), so that its README's prompt ("use
//! list_sandboxes, then create_sandbox, ...") keeps working word for word.
//!
//! Its sandboxes are snakebox sessions and its `sandbox_id` a `session_id`; the answers keep
//! its keys (`stdout`, `stderr`, `exit_code`, `files`, `file_links`; `success`, `status`,
//! `message` of an install). Two things it did differently are translated, not copied:
//! - `file_links`: over HTTP, each file's signed, expiring download URL (a plain GET, no key;
//!   served as a download, not yet shown inline as its links were); on stdio there is no HTTP
//!   server, so each is the file's `snakebox://artifacts/...` resource URI, which the client
//!   reads with `resources/read`.
//! - `upload_file_to_sandbox(local_file_path)`: its server read any file of its host. Here it
//!   reads only files under the directories the operator allows (`--upload-dirs`), resolved
//!   with symlinks followed and checked again on the file actually opened, so a link out of
//!   them, `..`, or a swap while it opens reads nothing; with none allowed it refuses, with
//!   the fix. (Client MCP roots on stdio are not consulted: the operator's list is the
//!   only allow-list.)

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_engine::{
    CreateSession, EngineError, ExecuteRequest, InstallPackages, InstallState, InstallStatus,
    MAX_FILE_BYTES, RunCommand, Status, WriteFile,
};

use super::{distribution_name, json_answer, no_packages, split_specifiers};
use crate::SnakeboxServer;
use crate::sessions::failure;

/// How long an install is waited for before the answer says it is still installing (that
/// server's five seconds); `check_package_installation_status` waits as long again.
const INSTALL_WAIT: Duration = Duration::from_secs(5);

/// That server's default `dest_path`, its sandboxes' working directory: the session's
/// workspace here.
const RESULTS_DIR: &str = "/app/results";

/// Where a session's workspace is inside its sandbox.
const WORK_DIR: &str = "/work";

/// Arguments of `create_sandbox`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSandboxParams {
    /// A label for people (optional).
    pub name: Option<String>,
}

/// Answer of `create_sandbox`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SandboxCreated {
    /// The id to pass as `sandbox_id` to every other tool.
    pub sandbox_id: String,
    /// Its label, if given.
    pub name: Option<String>,
    /// Its Python version.
    pub python_version: String,
    /// What to do next.
    pub message: String,
}

/// One sandbox of `list_sandboxes`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SandboxEntry {
    /// Its id, for `sandbox_id`.
    pub sandbox_id: String,
    /// Its label, if given.
    pub name: Option<String>,
    /// `running` while its interpreter runs, else `idle` (it starts on the next call; files
    /// and packages are kept either way).
    pub status: String,
    /// Its Python version.
    pub python_version: String,
    /// Creation time (Unix seconds).
    pub created_at: u64,
    /// Last use (Unix seconds).
    pub last_used_at: u64,
    /// Installed packages, `name==version`.
    pub installed_packages: Vec<String>,
}

/// Answer of `list_sandboxes`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SandboxListing {
    /// Every sandbox of yours, most recently used first.
    pub sandboxes: Vec<SandboxEntry>,
    /// How many sandboxes may exist.
    pub max_sandboxes: usize,
}

/// Arguments of `execute_python_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecutePythonCodeParams {
    /// The sandbox to run in (from create_sandbox or list_sandboxes).
    pub sandbox_id: String,
    /// The Python code to execute.
    pub code: String,
}

/// Answer of `execute_python_code`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct CodeExecuted {
    /// Standard output.
    pub stdout: String,
    /// Standard error (a traceback included).
    pub stderr: String,
    /// 0 when the code ran to its end, else non-zero.
    pub exit_code: i32,
    /// Files the code wrote or changed, relative to its working directory (figures too).
    pub files: Vec<String>,
    /// A link per file: over HTTP a signed, expiring download URL (a plain GET, no key);
    /// on stdio its `snakebox://artifacts/...` resource URI.
    pub file_links: Vec<String>,
    /// Why the code did not run, with the fix (null when it ran).
    pub error: Option<String>,
    /// snakebox's status: ok, error, timeout, memory_limit, invalid_request, ...
    pub status: String,
    /// The run's id.
    pub execution_id: String,
}

/// Arguments of `install_package_in_sandbox` and `check_package_installation_status`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PackageParams {
    /// The sandbox.
    pub sandbox_id: String,
    /// The package, e.g. `numpy` or `pandas>=2.2` (several: separated by spaces or commas).
    pub package_name: String,
}

/// Answer of `install_package_in_sandbox` and `check_package_installation_status`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct PackageStatus {
    /// true: installed; false: failed or not installed; null: still installing.
    pub success: Option<bool>,
    /// `success`, `installing`, `failed` or `not_installed`.
    pub status: String,
    /// What happened, and what to do next.
    pub message: String,
    /// Whether the install has ended (successfully or not).
    pub complete: bool,
    /// The installed version, when installed.
    pub version: Option<String>,
    /// Seconds since the install started, while it runs.
    pub elapsed_seconds: Option<u64>,
    /// The end of the installer's output, when it failed.
    pub stderr: Option<String>,
    /// The sandbox.
    pub sandbox_id: String,
}

/// Arguments of `execute_terminal_command`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TerminalParams {
    /// The sandbox.
    pub sandbox_id: String,
    /// The command, for `/bin/sh -c`, in the sandbox's working directory.
    pub command: String,
}

/// Answer of `execute_terminal_command`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct CommandRan {
    /// Standard output.
    pub stdout: String,
    /// Standard error (or why the command did not run, with the fix).
    pub stderr: String,
    /// The command's exit code (non-zero when it did not run).
    pub exit_code: i32,
}

/// Arguments of `upload_file_to_sandbox`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UploadParams {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path of the file on the server's host, under a directory the operator
    /// allows (`--upload-dirs`).
    pub local_file_path: String,
    /// Directory in the sandbox to put it in (default `/app/results`, the working
    /// directory; `/work/...` and relative paths are the same place).
    pub dest_path: Option<String>,
}

/// Answer of `upload_file_to_sandbox`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct FileUploaded {
    /// Always true (a failure is an error result).
    pub success: bool,
    /// What was done.
    pub message: String,
    /// The file's path in the sandbox, as that server named it (`/app/results/NAME`).
    pub dest_path: String,
    /// The same path relative to the working directory (what the code opens).
    pub path: String,
    /// Bytes written.
    pub size: u64,
    /// The sandbox.
    pub sandbox_id: String,
}

fn error_text(info: &snakebox_engine::ErrorInfo) -> String {
    match &info.hint {
        Some(hint) => format!("{} (hint: {hint})", info.message),
        None => info.message.clone(),
    }
}

/// The exit code of a record that has none (it never ran, or was stopped): 0 only for `ok`.
fn exit_code(result: &snakebox_engine::ExecutionResult) -> i32 {
    result
        .exit_code
        .unwrap_or(i32::from(result.status != Status::Ok))
}

/// An install's state as that server said it, for `package` (a requirement's name).
fn package_status(
    status: &InstallStatus,
    package: &str,
    asked: &str,
    now: u64,
) -> (PackageStatus, bool) {
    let name = distribution_name(package);
    let installed = status
        .packages
        .iter()
        .find(|p| distribution_name(&p.name) == name);
    let requested = status
        .requested
        .iter()
        .any(|r| distribution_name(r) == name);
    let sandbox_id = status.session_id.clone();
    let answer = |success, state: &str, message: String| PackageStatus {
        success,
        status: state.to_owned(),
        message,
        complete: state != "installing",
        version: installed.map(|p| p.version.clone()),
        elapsed_seconds: None,
        stderr: None,
        sandbox_id: sandbox_id.clone(),
    };
    match status.state {
        InstallState::Running if requested => (
            PackageStatus {
                elapsed_seconds: status.started_at.map(|at| now.saturating_sub(at)),
                ..answer(
                    None,
                    "installing",
                    format!(
                        "Installation of {asked} in progress. Use check_package_installation_status to monitor progress."
                    ),
                )
            },
            false,
        ),
        InstallState::Failed if requested && installed.is_none() => (
            PackageStatus {
                stderr: Some(status.log_tail.clone()),
                ..answer(
                    Some(false),
                    "failed",
                    format!(
                        "Failed to install {asked}: {}",
                        status.error.as_ref().map_or_else(
                            || "the installer failed (see stderr)".to_owned(),
                            error_text
                        )
                    ),
                )
            },
            true,
        ),
        _ if installed.is_some() => (
            answer(
                Some(true),
                "success",
                format!("Successfully installed {asked}"),
            ),
            false,
        ),
        _ => (
            answer(
                Some(false),
                "not_installed",
                format!(
                    "{asked} is not installed in sandbox {sandbox_id}; install it with install_package_in_sandbox"
                ),
            ),
            false,
        ),
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// Where a file named `file_name` uploaded to the directory `dest_path` goes, relative to
/// the session's workspace. That server's `/app/results` is the workspace (the working
/// directory of the code), as are `/work` and a relative path; another absolute path is
/// outside the workspace and refused.
pub(crate) fn upload_destination(
    dest_path: Option<&str>,
    file_name: &str,
) -> Result<String, EngineError> {
    let dest = dest_path.map(str::trim).filter(|d| !d.is_empty());
    let dest = dest.unwrap_or(RESULTS_DIR);
    let within = |root: &str| {
        dest.strip_prefix(root)
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    let relative = match within(RESULTS_DIR).or_else(|| within(WORK_DIR)) {
        Some(rest) => rest,
        None if dest.starts_with('/') => {
            return Err(EngineError::invalid(
                format!("dest_path is outside the sandbox's working directory: `{dest}`"),
                format!(
                    "give a directory under {RESULTS_DIR} (the working directory, also {WORK_DIR}), or a path relative to it; leave it out for {RESULTS_DIR}"
                ),
            ));
        }
        None => dest,
    };
    let directory = relative.trim_matches('/');
    Ok(if directory.is_empty() {
        file_name.to_owned()
    } else {
        format!("{directory}/{file_name}")
    })
}

/// The refusal of a host path no allowed directory holds.
fn outside(path: &Path, allowed: &[PathBuf]) -> EngineError {
    let dirs: Vec<String> = allowed.iter().map(|d| d.display().to_string()).collect();
    EngineError::invalid(
        format!(
            "local_file_path is not under a directory this server lets uploads read: `{}`",
            path.display()
        ),
        format!(
            "put the file under {} (symlinks out of them are not followed), or send its content with write_file(session_id, path, content)",
            dirs.join(", ")
        ),
    )
}

/// Read the host file `local` for an upload, only when it is a regular file under one of
/// `allowed` (canonical directories). The path is resolved first (symlinks and `..`
/// followed) and checked; then the resolved path is opened without following a final
/// symlink, and the file actually opened is checked again by its descriptor, so a path
/// swapped while it is opened reads nothing outside. Returns its name and its bytes.
pub(crate) fn read_upload(
    allowed: &[PathBuf],
    local: &str,
) -> Result<(String, Vec<u8>), EngineError> {
    use std::io::Read as _;
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    if allowed.is_empty() {
        return Err(EngineError::invalid(
            "upload_file_to_sandbox reads no host file on this server: no directory is allowed",
            "the operator allows directories with `snakebox serve --upload-dirs DIR[,DIR]` (`[server] upload_dirs`); or send the content with write_file(session_id, path, content)",
        ));
    }
    let path = Path::new(local);
    if !path.is_absolute() {
        return Err(EngineError::invalid(
            format!("local_file_path must be an absolute path on the server's host, got `{local}`"),
            "give the full path, under a directory the operator allows for uploads",
        ));
    }
    let not_found = |error: std::io::Error| {
        EngineError::new(
            snakebox_engine::ErrorKind::NotFound,
            format!("local_file_path cannot be opened ({error}): `{local}`"),
        )
        .with_hint("check the path: the file must exist on the server's host, under a directory allowed for uploads")
    };
    let canonical = fs_canonicalize(path).map_err(not_found)?;
    if !allowed.iter().any(|dir| canonical.starts_with(dir)) {
        return Err(outside(path, allowed));
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(&canonical)
        .map_err(not_found)?;
    let opened =
        std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(not_found)?;
    if !allowed.iter().any(|dir| opened.starts_with(dir)) {
        return Err(outside(path, allowed));
    }
    let metadata = file.metadata().map_err(not_found)?;
    if !metadata.is_file() {
        return Err(EngineError::invalid(
            format!("local_file_path is not a regular file: `{local}`"),
            "give the path of a file (a directory is uploaded one file at a time)",
        ));
    }
    if metadata.len() > MAX_FILE_BYTES {
        return Err(EngineError::invalid(
            format!(
                "the file is {} bytes, more than the upload limit of {MAX_FILE_BYTES} bytes: `{local}`",
                metadata.len()
            ),
            "upload a smaller file, or split it",
        ));
    }
    let mut content = Vec::new();
    (&mut file)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut content)
        .map_err(not_found)?;
    if content.len() as u64 > MAX_FILE_BYTES {
        return Err(EngineError::invalid(
            format!("the file grew past the upload limit of {MAX_FILE_BYTES} bytes: `{local}`"),
            "upload a smaller file",
        ));
    }
    let name = opened
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok((name, content))
}

/// `canonicalize` (not among the std::fs calls the lints ban; it names no path in its error,
/// so the caller's message does).
fn fs_canonicalize(path: &Path) -> std::io::Result<PathBuf> {
    path.canonicalize()
}

#[tool_router(router = python_mcp_sandbox_router, vis = "pub(crate)")]
impl SnakeboxServer {
    #[tool(
        description = "Create a new Python sandbox and return its sandbox_id for \
execute_python_code, install_package_in_sandbox and the other tools (python-mcp-sandbox's tool, \
served by snakebox: a sandbox is a snakebox session). Reuse one from list_sandboxes when there is \
one.\n\nExample: {} -> {\"sandbox_id\": \"3f2a...\", ...}",
        output_schema = schema_for_output::<SandboxCreated>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = false)
    )]
    async fn create_sandbox(
        &self,
        Parameters(params): Parameters<CreateSandboxParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let created = self
            .engine
            .create_session(
                &caller,
                CreateSession {
                    name: params.name,
                    ..CreateSession::default()
                },
            )
            .await;
        Ok(match created {
            Ok(info) => {
                let answer = SandboxCreated {
                    message: format!(
                        "Sandbox {} created; pass it as sandbox_id to the other tools",
                        info.session_id
                    ),
                    sandbox_id: info.session_id,
                    name: info.name,
                    python_version: info.python_version,
                };
                json_answer(&answer, false)
            }
            Err(error) => failure(&error),
        })
    }

    #[tool(
        description = "List your existing sandboxes for reuse (python-mcp-sandbox's tool, served \
by snakebox): sandbox_id, name, status, python_version and installed_packages of each.\n\n\
Example: {} -> {\"sandboxes\": [{\"sandbox_id\": \"3f2a...\", \"status\": \"idle\", ...}]}",
        output_schema = schema_for_output::<SandboxListing>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_sandboxes(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        Ok(match self.engine.list_sessions(&caller).await {
            Ok(list) => {
                let answer = SandboxListing {
                    max_sandboxes: list.max_sessions,
                    sandboxes: list
                        .sessions
                        .into_iter()
                        .map(|info| SandboxEntry {
                            status: if info.interpreter_running {
                                "running"
                            } else {
                                "idle"
                            }
                            .to_owned(),
                            installed_packages: info
                                .packages
                                .iter()
                                .map(|p| format!("{}=={}", p.name, p.version))
                                .collect(),
                            sandbox_id: info.session_id,
                            name: info.name,
                            python_version: info.python_version,
                            created_at: info.created_at,
                            last_used_at: info.last_used_at,
                        })
                        .collect(),
                };
                self.shaped(&caller, move || json_answer(&answer, false))
                    .await
            }
            Err(error) => failure(&error),
        })
    }

    #[tool(
        description = "Execute Python code in a sandbox and return stdout, stderr, exit_code and \
links to the files it generated (python-mcp-sandbox's tool, served by snakebox). Variables \
persist between calls in the same sandbox. Save figures with plt.savefig() and data with \
df.to_csv(): saved files come back in files and file_links.\n\nExample: {\"sandbox_id\": \
\"3f2a...\", \"code\": \"print(1 + 1)\"} -> {\"stdout\": \"2\\n\", \"exit_code\": 0, ...}",
        output_schema = schema_for_output::<CodeExecuted>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = false)
    )]
    async fn execute_python_code(
        &self,
        Parameters(params): Parameters<ExecutePythonCodeParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let request = ExecuteRequest {
            session_id: Some(params.sandbox_id),
            script: params.code,
            ..ExecuteRequest::default()
        };
        let mut result = self
            .engine
            .execute(&caller, request, self.call_token(&context), None)
            .await;
        self.add_download_links(&context, &caller, &mut result);
        let is_error = matches!(result.status, Status::InvalidRequest | Status::SetupFailed);
        let error = result.error.as_ref().map(error_text);
        let answer = CodeExecuted {
            stdout: result.stdout.clone(),
            stderr: match (&error, result.stderr.is_empty()) {
                (Some(error), true) => error.clone(),
                _ => result.stderr.clone(),
            },
            exit_code: exit_code(&result),
            files: result.artifacts.iter().map(|a| a.name.clone()).collect(),
            file_links: result
                .artifacts
                .iter()
                .map(|a| a.download_url.clone().unwrap_or_else(|| a.uri.clone()))
                .collect(),
            error,
            status: result.status.as_str().to_owned(),
            execution_id: result.execution_id.clone(),
        };
        Ok(self
            .shaped(&caller, move || json_answer(&answer, is_error))
            .await)
    }

    #[tool(
        description = "Install a Python package in a sandbox (python-mcp-sandbox's tool, served \
by snakebox). Waits up to 5 seconds: status `success` or `failed`, or `installing` when it takes \
longer (it goes on; ask check_package_installation_status).\n\nExample: {\"sandbox_id\": \
\"3f2a...\", \"package_name\": \"pandas\"} -> {\"success\": true, \"status\": \"success\", ...}",
        output_schema = schema_for_output::<PackageStatus>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = true)
    )]
    async fn install_package_in_sandbox(
        &self,
        Parameters(params): Parameters<PackageParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let packages = split_specifiers(&params.package_name);
        let Some(first) = packages.first().cloned() else {
            return Ok(failure(&no_packages(
                "package_name",
                "install_package_in_sandbox",
            )));
        };
        let installed = self
            .engine
            .install_packages(
                &caller,
                InstallPackages {
                    session_id: params.sandbox_id,
                    packages,
                    wait: Some(INSTALL_WAIT),
                },
                None,
            )
            .await;
        Ok(match installed {
            Ok(status) => {
                let (answer, failed) =
                    package_status(&status, &first, params.package_name.trim(), unix_now());
                json_answer(&answer, failed)
            }
            Err(error) => failure(&error),
        })
    }

    #[tool(
        description = "Check whether a package is installed in a sandbox, or how its install is \
going (python-mcp-sandbox's tool, served by snakebox): status `success` (with version), \
`installing` (check again), `failed` (with stderr) or `not_installed`.\n\nExample: \
{\"sandbox_id\": \"3f2a...\", \"package_name\": \"pandas\"}",
        output_schema = schema_for_output::<PackageStatus>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn check_package_installation_status(
        &self,
        Parameters(params): Parameters<PackageParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let Some(first) = split_specifiers(&params.package_name).first().cloned() else {
            return Ok(failure(&no_packages(
                "package_name",
                "check_package_installation_status",
            )));
        };
        // As that server did: an install still running is waited for a while before the
        // answer, so a caller polling it is not answered `installing` at once each time.
        let deadline = tokio::time::Instant::now() + INSTALL_WAIT;
        loop {
            let listed = self.engine.list_packages(&caller, &params.sandbox_id).await;
            let status = match listed {
                Ok(list) => list.install,
                Err(error) => return Ok(failure(&error)),
            };
            let (answer, failed) =
                package_status(&status, &first, params.package_name.trim(), unix_now());
            if answer.complete || tokio::time::Instant::now() >= deadline {
                return Ok(json_answer(&answer, failed));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    #[tool(
        description = "Execute a terminal command in a sandbox, in its working directory \
(python-mcp-sandbox's tool, served by snakebox). Returns stdout, stderr, exit_code.\n\nExample: \
{\"sandbox_id\": \"3f2a...\", \"command\": \"ls -la\"}",
        output_schema = schema_for_output::<CommandRan>(),
        annotations(read_only_hint = false, destructive_hint = true, open_world_hint = false)
    )]
    async fn execute_terminal_command(
        &self,
        Parameters(params): Parameters<TerminalParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let result = self
            .engine
            .run_command(
                &caller,
                RunCommand {
                    session_id: params.sandbox_id,
                    command: params.command,
                    timeout_seconds: None,
                },
                self.call_token(&context),
                None,
            )
            .await;
        let is_error = matches!(result.status, Status::InvalidRequest | Status::SetupFailed);
        let answer = CommandRan {
            stdout: result.stdout.clone(),
            stderr: match &result.error {
                Some(error) if result.stderr.is_empty() => error_text(error),
                _ => result.stderr.clone(),
            },
            exit_code: exit_code(&result),
        };
        Ok(self
            .shaped(&caller, move || json_answer(&answer, is_error))
            .await)
    }

    #[tool(
        description = "Upload a file of the server's host into a sandbox (python-mcp-sandbox's \
tool, served by snakebox). Only files under the directories the operator allows \
(`--upload-dirs`) can be read. dest_path is a directory in the sandbox, default /app/results \
(the working directory); the file keeps its name.\n\nExample: {\"sandbox_id\": \"3f2a...\", \
\"local_file_path\": \"/srv/uploads/data.csv\"} -> dest_path \"/app/results/data.csv\"",
        output_schema = schema_for_output::<FileUploaded>(),
        annotations(read_only_hint = false, destructive_hint = true, open_world_hint = false)
    )]
    async fn upload_file_to_sandbox(
        &self,
        Parameters(params): Parameters<UploadParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let allowed = self.host.config().upload_dirs.clone();
        let local = params.local_file_path.clone();
        let read = tokio::task::spawn_blocking(move || read_upload(&allowed, &local)).await;
        let (name, content) = match read {
            Ok(Ok(read)) => read,
            Ok(Err(error)) => return Ok(failure(&error)),
            Err(_) => {
                return Ok(failure(&EngineError::internal(
                    "reading the file for the upload stopped",
                    "try again",
                )));
            }
        };
        let path = match upload_destination(params.dest_path.as_deref(), &name) {
            Ok(path) => path,
            Err(error) => return Ok(failure(&error)),
        };
        let written = self
            .engine
            .write_file(
                &caller,
                WriteFile {
                    session_id: params.sandbox_id,
                    path,
                    content: base64::engine::general_purpose::STANDARD.encode(&content),
                    encoding: Some("base64".into()),
                },
            )
            .await;
        Ok(match written {
            Ok(written) => {
                let dest_path = format!("{RESULTS_DIR}/{}", written.path);
                let answer = FileUploaded {
                    success: true,
                    message: format!("File uploaded to {dest_path}"),
                    dest_path,
                    path: written.path,
                    size: written.size,
                    sandbox_id: written.session_id,
                };
                json_answer(&answer, false)
            }
            Err(error) => failure(&error),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::{read_upload, upload_destination};

    /// A fresh directory of this test's own under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("snakebox-upload-{name}-{}", std::process::id()));
        let _ = fs_err::remove_dir_all(&dir);
        fs_err::create_dir_all(&dir).unwrap();
        dir.canonicalize().unwrap()
    }

    #[test]
    fn an_upload_reads_only_regular_files_under_an_allowed_directory() {
        let root = scratch("allow");
        let allowed = root.join("allowed");
        let secret = root.join("secret");
        fs_err::create_dir_all(allowed.join("sub")).unwrap();
        fs_err::create_dir_all(&secret).unwrap();
        fs_err::write(allowed.join("sub/data.csv"), "a,b\n1,2\n").unwrap();
        fs_err::write(secret.join("key"), "secret").unwrap();
        std::os::unix::fs::symlink(secret.join("key"), allowed.join("link")).unwrap();
        std::os::unix::fs::symlink(&secret, allowed.join("dirlink")).unwrap();
        std::os::unix::fs::symlink(allowed.join("sub/data.csv"), allowed.join("inner")).unwrap();
        let dirs = vec![allowed.clone()];
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();

        let (name, content) = read_upload(&dirs, &path(&allowed.join("sub/data.csv"))).unwrap();
        assert_eq!(
            (name.as_str(), content.as_slice()),
            ("data.csv", &b"a,b\n1,2\n"[..])
        );
        // A link that stays inside is followed; its name is the file's.
        assert_eq!(
            read_upload(&dirs, &path(&allowed.join("inner"))).unwrap().0,
            "data.csv"
        );

        for (escape, expected) in [
            (secret.join("key"), "not under a directory"),
            (allowed.join("link"), "not under a directory"),
            (allowed.join("dirlink/key"), "not under a directory"),
            (allowed.join("../secret/key"), "not under a directory"),
            (allowed.join("sub"), "not a regular file"),
            (allowed.join("missing"), "cannot be opened"),
        ] {
            let error = read_upload(&dirs, &path(&escape)).unwrap_err();
            assert!(
                error.message.contains(expected),
                "{escape:?}: {}",
                error.message
            );
            assert!(error.hint.is_some(), "{escape:?}");
        }
        let error = read_upload(&dirs, "sub/data.csv").unwrap_err();
        assert!(error.message.contains("absolute path"), "{}", error.message);
        // Nothing allowed: every path is refused, with the operator's fix.
        let error = read_upload(&[], &path(&allowed.join("sub/data.csv"))).unwrap_err();
        assert!(
            error.message.contains("no directory is allowed"),
            "{}",
            error.message
        );
        assert!(error.hint.unwrap().contains("--upload-dirs"));
        let _ = fs_err::remove_dir_all(&root);
    }

    #[test]
    fn the_destination_is_a_directory_of_the_workspace() {
        for (dest, expected) in [
            (None, "data.csv"),
            (Some(""), "data.csv"),
            (Some("/app/results"), "data.csv"),
            (Some("/app/results/"), "data.csv"),
            (Some("/app/results/in"), "in/data.csv"),
            (Some("/work/in/"), "in/data.csv"),
            (Some("in/deeper"), "in/deeper/data.csv"),
        ] {
            assert_eq!(
                upload_destination(dest, "data.csv").unwrap(),
                expected,
                "{dest:?}"
            );
        }
        for outside in ["/etc", "/app/resultsX", "/workspace"] {
            let error = upload_destination(Some(outside), "data.csv").unwrap_err();
            assert!(
                error.message.contains("outside"),
                "{outside}: {}",
                error.message
            );
        }
    }
}
