//! The session tools: create, list, delete and reset sessions; install and list packages; run
//! a shell command; write, read and list files. Code runs in a session through
//! `execute_python` with a `session_id` (see `tools.rs`).
//!
//! Thin like the other tools: typed parameters, one engine call, a structured result with a
//! text form. A failure that is not the caller's code (no such session, a path outside the
//! workspace, a cap reached) is a result with `isError: true` and a hint.

use std::time::Duration;

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_engine::{
    Caller, CreateSession, EngineError, ExecutionResult, FileContent, FileList, FileWritten,
    InstallPackages, InstallState, InstallStatus, ListFiles, PackageList, ReadFile, RunCommand,
    SessionInfo, SessionList, WriteFile,
};

use crate::tools::{SnakeboxServer, progress, structured};

/// How long `install_packages` waits by default before answering "still running".
const DEFAULT_INSTALL_WAIT: Duration = Duration::from_secs(50);

/// Arguments of `create_session`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSessionParams {
    /// Python version, e.g. `"3.12"` (default: the server's).
    pub python_version: Option<String>,
    /// Packages to install at creation, PEP 508, e.g. `["pandas>=2.2"]`.
    pub dependencies: Option<Vec<String>>,
    /// A short label to recognise the session by, e.g. `"sales-analysis"`.
    pub name: Option<String>,
    /// Network for the session's whole life, as for `execute_python`: `true` asks for it
    /// (refused unless the server allows network), `false` declines it. Default: the
    /// server's policy (off unless the operator turned it on). The result's `network` says what
    /// is in effect; a call cannot change it later.
    pub network: Option<bool>,
    /// Narrow the server's network policy for the session's whole life to these host names
    /// (`api.example.com`, or `*.example.com`), each allowed by the server's policy (see
    /// `check_environment`); asking for more is refused with the reason. Its code reaches the
    /// network through the server's proxy; each call's `network_log` lists every connection.
    pub allowed_domains: Option<Vec<String>>,
    /// The profile to hold the session to, e.g. `"basic"` (default: the server's), for its
    /// whole life: network, packages, subprocesses (denied: also no run_command), a
    /// read-only /work, limits and imports (checked when a cell imports).
    pub profile: Option<String>,
}

/// Arguments naming one session.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionParams {
    /// The session's id, as returned by `create_session`.
    pub session_id: String,
}

/// Arguments of `install_packages`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct InstallParams {
    /// The session's id.
    pub session_id: String,
    /// Packages as PEP 508 specifiers, e.g. `["six==1.16.0", "requests>=2.31"]`.
    pub packages: Vec<String>,
    /// Seconds to wait for the install before answering (default 50). A longer install keeps
    /// going; `list_packages` reports it.
    pub wait_seconds: Option<f64>,
}

/// Arguments of `run_command`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CommandParams {
    /// The session's id.
    pub session_id: String,
    /// A shell command (`/bin/sh -c`), run in the session's workspace, e.g. `"ls -la"`.
    pub command: String,
    /// Wall-clock limit in seconds (default 30; clamped to the server maximum).
    pub timeout_seconds: Option<f64>,
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteFileParams {
    /// The session's id.
    pub session_id: String,
    /// Path relative to the workspace, e.g. `"data/input.csv"` (no leading `/`, no `..`).
    pub path: String,
    /// The content: text, or base64 when `encoding` is `"base64"`.
    pub content: String,
    /// `"utf-8"` (default) or `"base64"`.
    pub encoding: Option<String>,
}

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadFileParams {
    /// The session's id.
    pub session_id: String,
    /// Path relative to the workspace, e.g. `"results/summary.txt"`.
    pub path: String,
}

/// Arguments of `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListFilesParams {
    /// The session's id.
    pub session_id: String,
    /// Directory relative to the workspace (default: the workspace itself).
    pub path: Option<String>,
    /// Levels to descend (default 3, at most 10).
    pub depth: Option<u32>,
}

/// A result that only says it worked.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Done {
    /// The session.
    pub session_id: String,
    /// What happened.
    pub message: String,
}

/// The one mapping of an engine error on this face: a tool result with `isError: true` whose
/// text says the error's kind, message and hint (`error (KIND): …` and `hint: …` lines).
/// (Protocol errors are kept for malformed requests.)
///
/// It carries no `structuredContent`: that must match the tool's `outputSchema` (the
/// TypeScript SDK checks it and turns a mismatch into a -32602 that hides the message), and
/// an error is not the tool's output. Clients accept an error result without it.
pub(crate) fn failure(error: &EngineError) -> CallToolResult {
    let mut text = format!("error ({}): {}\n", error.kind.as_str(), error.message);
    if let Some(hint) = &error.hint {
        text.push_str(&format!("hint: {hint}\n"));
    }
    CallToolResult::error(vec![rmcp::model::ContentBlock::text(text)])
}

impl SnakeboxServer {
    /// `result` as the tool's answer: an error as [`failure`], a value shaped (text and
    /// structured content) as the caller's host work ([`SnakeboxServer::shaped`]: a listing
    /// of thousands of entries takes milliseconds, issue 32's noisy neighbour's `files`).
    async fn answer<T: Serialize + Send + 'static>(
        &self,
        caller: &Caller,
        result: Result<T, EngineError>,
        text: impl Fn(&T) -> String + Send + 'static,
    ) -> CallToolResult {
        match result {
            Ok(value) => {
                self.shaped(caller, move || structured(&value, text(&value), false))
                    .await
            }
            Err(error) => failure(&error),
        }
    }
}

fn session_text(info: &SessionInfo) -> String {
    let packages: Vec<String> = info
        .packages
        .iter()
        .map(|p| format!("{}=={}", p.name, p.version))
        .collect();
    format!(
        "session_id: {}{}\npython: {}\npackages: {}\ninterpreter running: {}\nnetwork: {}{}\n",
        info.session_id,
        info.name
            .as_ref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default(),
        info.python_version,
        if packages.is_empty() {
            "(none)".to_owned()
        } else {
            packages.join(", ")
        },
        info.interpreter_running,
        if info.network { "on" } else { "off" },
        if info.network && !info.allowed_domains.is_empty() {
            format!(" (only {})", info.allowed_domains.join(", "))
        } else {
            String::new()
        }
    )
}

fn install_text(status: &InstallStatus) -> String {
    let mut text = match status.state {
        InstallState::Running => format!(
            "install of {} is still running; call list_packages to see when it is done\n",
            status.requested.join(", ")
        ),
        InstallState::Succeeded => format!("installed {}\n", status.requested.join(", ")),
        InstallState::Failed => format!("install of {} failed\n", status.requested.join(", ")),
        InstallState::None => "no install\n".to_owned(),
    };
    if let Some(error) = &status.error {
        text.push_str(&format!("error: {}\n", error.message));
        if let Some(hint) = &error.hint {
            text.push_str(&format!("hint: {hint}\n"));
        }
    }
    if !status.packages.is_empty() {
        let packages: Vec<String> = status
            .packages
            .iter()
            .map(|p| format!("{}=={}", p.name, p.version))
            .collect();
        text.push_str(&format!("packages: {}\n", packages.join(", ")));
    }
    text
}

#[tool_router(router = session_router, vis = "pub(crate)")]
impl SnakeboxServer {
    #[tool(
        description = "Create a persistent Python session and return its `session_id`.\n\n\
Use a session when work spans several calls: pass the id as `session_id` to `execute_python` and \
variables, imports and functions persist between calls (like a notebook), the working directory \
(the session's workspace) keeps its files, and packages installed with `install_packages` stay \
installed. Each session is its own isolated sandbox. Sessions survive a server restart (files and \
packages; variables are lost and the next result says so). Delete sessions you no longer need. \
Network follows the one-shot rules and is fixed at creation: off unless the server allows it; \
`network: true` is refused on a server without network, `network: false` declines it; the \
result's `network` says what is in effect. A session's results are only as trustworthy as its \
own earlier code: see `session_id` of `execute_python` for what that code can forge (never \
another session's results).\n\n\
Example: {\"name\": \"sales-analysis\", \"dependencies\": [\"pandas>=2.2\"], \"python_version\": \"3.12\"}",
        output_schema = schema_for_output::<SessionInfo>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = false)
    )]
    async fn create_session(
        &self,
        Parameters(params): Parameters<CreateSessionParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let result = self
            .engine
            .create_session(
                &caller,
                CreateSession {
                    python_version: params.python_version,
                    dependencies: params.dependencies.unwrap_or_default(),
                    name: params.name,
                    network: params.network,
                    allowed_domains: params.allowed_domains.unwrap_or_default(),
                    profile: params.profile,
                },
            )
            .await;
        Ok(self.answer(&caller, result, session_text).await)
    }

    #[tool(
        description = "List the sessions: id, name, Python version, created and last used (Unix \
seconds), installed packages, size on disk, whether the interpreter is running (variables are \
kept only while it is), plus the server's caps on sessions and their disk, and your share of \
that disk (tenant_max_disk_bytes; a write past it fails with ENOSPC) and what you use of it.",
        output_schema = schema_for_output::<SessionList>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_sessions(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let result = self.engine.list_sessions(&caller).await;
        Ok(self
            .answer(&caller, result, |list| {
                if list.sessions.is_empty() {
                    return "no sessions\n".to_owned();
                }
                list.sessions
                    .iter()
                    .map(session_text)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .await)
    }

    #[tool(
        description = "Delete a session with its files, packages and interpreter (a call running in \
it is stopped). This cannot be undone.\n\nExample: {\"session_id\": \"s-0123456789abcdef\"}",
        output_schema = schema_for_output::<Done>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn delete_session(
        &self,
        Parameters(params): Parameters<SessionParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let id = params.session_id;
        let result = self
            .engine
            .delete_session(&caller, &id)
            .await
            .map(|()| Done {
                message: format!("session {id} deleted"),
                session_id: id.clone(),
            });
        Ok(self
            .answer(&caller, result, |done| format!("{}\n", done.message))
            .await)
    }

    #[tool(
        description = "Reset a session to the state it was created in: a new interpreter (all \
variables gone), an empty workspace, and only the packages given at creation. The session_id \
stays the same.\n\nExample: {\"session_id\": \"s-0123456789abcdef\"}",
        output_schema = schema_for_output::<SessionInfo>(),
        annotations(read_only_hint = false, destructive_hint = true, open_world_hint = false)
    )]
    async fn reset_session(
        &self,
        Parameters(params): Parameters<SessionParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let result = self.engine.reset_session(&caller, &params.session_id).await;
        Ok(self.answer(&caller, result, session_text).await)
    }

    #[tool(
        description = "Install packages into a session with uv; they are importable by the \
session's next `execute_python` call and stay installed. Sends progress notifications while it \
runs. Waits up to `wait_seconds` (default 50): a longer install keeps running, and \
`list_packages` reports when it is done.\n\n\
Example: {\"session_id\": \"s-0123456789abcdef\", \"packages\": [\"six==1.16.0\", \"requests>=2.31\"]}",
        output_schema = schema_for_output::<InstallStatus>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = true)
    )]
    async fn install_packages(
        &self,
        Parameters(params): Parameters<InstallParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let wait = match params.wait_seconds {
            Some(value) if value.is_finite() && value >= 0.0 => {
                Duration::from_secs_f64(value.min(3600.0))
            }
            _ => DEFAULT_INSTALL_WAIT,
        };
        let (sender, forwarder) = progress(&context);
        let result = self
            .engine
            .install_packages(
                &caller,
                InstallPackages {
                    session_id: params.session_id,
                    packages: params.packages,
                    wait: Some(wait),
                },
                sender,
            )
            .await;
        if let Some(forwarder) = forwarder
            && result
                .as_ref()
                .is_ok_and(|status| status.state != InstallState::Running)
        {
            let _ = forwarder.await;
        }
        Ok(match result {
            Ok(status) => {
                let failed = status.state == InstallState::Failed;
                structured(&status, install_text(&status), failed)
            }
            Err(error) => failure(&error),
        })
    }

    #[tool(
        description = "List the packages installed in a session, what was asked for, and the state \
of its last install (running, succeeded, failed — with uv's error).\n\n\
Example: {\"session_id\": \"s-0123456789abcdef\"}",
        output_schema = schema_for_output::<PackageList>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_packages(
        &self,
        Parameters(params): Parameters<SessionParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let result = self.engine.list_packages(&caller, &params.session_id).await;
        Ok(self
            .answer(&caller, result, |list| {
                let mut text = format!("python: {}\n", list.python_version);
                for p in &list.packages {
                    text.push_str(&format!("{}=={}\n", p.name, p.version));
                }
                if list.install.state != InstallState::None {
                    text.push_str(&install_text(&list.install));
                }
                text
            })
            .await)
    }

    #[tool(
        description = "Run a shell command (`/bin/sh -c`) in a session's sandbox, in its workspace, \
with its packages on PATH (`python` is the session's Python). Separate from the session's \
interpreter: no variables are shared, files are. Same isolation, limits and network as the session's \
code (see `create_session`). Returns stdout, stderr, exit_code, status.\n\n\
Example: {\"session_id\": \"s-0123456789abcdef\", \"command\": \"ls -la && wc -l data.csv\", \"timeout_seconds\": 30}",
        output_schema = schema_for_output::<ExecutionResult>(),
        annotations(read_only_hint = false, destructive_hint = true, open_world_hint = false)
    )]
    async fn run_command(
        &self,
        Parameters(params): Parameters<CommandParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let (sender, forwarder) = progress(&context);
        let result = self
            .engine
            .run_command(
                &caller,
                RunCommand {
                    session_id: params.session_id,
                    command: params.command,
                    timeout_seconds: params.timeout_seconds,
                },
                self.call_token(&context),
                sender,
            )
            .await;
        if let Some(forwarder) = forwarder {
            let _ = forwarder.await;
        }
        Ok(self.execution_reply(&context, &caller, result).await)
    }

    #[tool(
        description = "Write a file into a session's workspace (the working directory of its code), \
creating parent directories; replaces an existing file. Paths are relative: no leading `/`, no \
`..`. Up to 10 MiB; binary content as base64 with `\"encoding\": \"base64\"`.\n\n\
Example: {\"session_id\": \"s-0123456789abcdef\", \"path\": \"data/input.csv\", \"content\": \"a,b\\n1,2\\n\"}",
        output_schema = schema_for_output::<FileWritten>(),
        annotations(read_only_hint = false, destructive_hint = true, open_world_hint = false)
    )]
    async fn write_file(
        &self,
        Parameters(params): Parameters<WriteFileParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let result = self
            .engine
            .write_file(
                &caller,
                WriteFile {
                    session_id: params.session_id,
                    path: params.path,
                    content: params.content,
                    encoding: params.encoding,
                },
            )
            .await;
        Ok(self
            .answer(&caller, result, |w| {
                format!("wrote {} ({} bytes)\n", w.path, w.size)
            })
            .await)
    }

    #[tool(
        description = "Read a file from a session's workspace (up to 10 MiB). Text comes back as \
is; binary content as base64 (`encoding` says which). Paths are relative to the workspace; \
symbolic links are not followed.\n\nExample: {\"session_id\": \"s-0123456789abcdef\", \"path\": \"results/summary.txt\"}",
        output_schema = schema_for_output::<FileContent>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn read_file(
        &self,
        Parameters(params): Parameters<ReadFileParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let result = self
            .engine
            .read_file(
                &caller,
                ReadFile {
                    session_id: params.session_id,
                    path: params.path,
                },
            )
            .await;
        Ok(self
            .answer(&caller, result, |file| {
                if file.encoding == "utf-8" {
                    file.content.clone()
                } else {
                    format!(
                        "{} is binary ({} bytes); base64 content in structuredContent.content\n",
                        file.path, file.size
                    )
                }
            })
            .await)
    }

    #[tool(
        description = "List files in a session's workspace (or a directory of it): path, kind \
(file, directory, symlink), size. Descends `depth` levels (default 3).\n\n\
Example: {\"session_id\": \"s-0123456789abcdef\", \"path\": \"\", \"depth\": 2}",
        output_schema = schema_for_output::<FileList>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_files(
        &self,
        Parameters(params): Parameters<ListFilesParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let depth = params.depth.unwrap_or(3) as usize;
        let result = self
            .engine
            .list_files(
                &caller,
                ListFiles {
                    session_id: params.session_id,
                    path: params.path.unwrap_or_default(),
                    depth,
                },
            )
            .await;
        Ok(self
            .answer(&caller, result, |list| {
                if list.entries.is_empty() {
                    return "(empty)\n".to_owned();
                }
                let mut text: String = list
                    .entries
                    .iter()
                    .map(|e| match e.kind.as_str() {
                        "directory" => format!("{}/\n", e.path),
                        "file" => format!("{} ({} bytes)\n", e.path, e.size),
                        kind => format!("{} ({kind})\n", e.path),
                    })
                    .collect();
                if list.truncated {
                    text.push_str("[listing truncated]\n");
                }
                text
            })
            .await)
    }
}
