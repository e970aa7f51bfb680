//! The tool set of Python Code Executor (`execute_python(code, timeout)`, `install_package`,
//! `list_installed_packages`, `reset_sandbox`, `get_sandbox_info`), served when the operator
//! names it (`serve --compat-tools code-executor`), so that its README's calls
//! (`install_package("pandas matplotlib seaborn")`, then `execute_python(...)` importing
//! them) keep working.
//!
//! That server has one sandbox, and its tools take no sandbox argument. Here each caller
//! (each tenant) has one: a snakebox session named `code-executor`, created on the first call
//! that needs it and found again by that name (so it outlives the connection, and a new one
//! is made if it was deleted for idleness). Every tool of this set, `execute_python` included,
//! works in it. Its `execute_python` takes the place of snakebox's own while the set is served
//! (one name, one tool): `code` and `timeout` as that server named them, and the answer is
//! snakebox's record (stdout, stderr, status), as that server's was those three.

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_engine::{
    Caller, CreateSession, EngineError, ExecuteRequest, ExecutionResult, InstallPackages,
    InstallState,
};

use super::{json_answer, no_packages, split_specifiers};
use crate::SnakeboxServer;
use crate::sessions::failure;

/// The name of each caller's implicit sandbox (a session's label).
pub(crate) const SANDBOX_NAME: &str = "code-executor";

/// Where a session's workspace is inside its sandbox.
const WORK_DIR: &str = "/work";

/// Creating a caller's sandbox when it has none is one step at a time in this process, so
/// two first calls at once make one sandbox, not two (a call that finds one never waits).
static FIND_OR_CREATE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Arguments of `execute_python`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecuteParams {
    /// The Python code to execute, e.g. `"import math; print(math.sqrt(16))"`.
    pub code: String,
    /// Max execution time in seconds (default: the server's, 30; at most its maximum, 300).
    pub timeout: Option<f64>,
}

/// Arguments of `install_package`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct InstallParams {
    /// One or more requirements, separated by spaces or commas: `"numpy"`, `"pandas
    /// matplotlib seaborn"`, `"requests>=2.28.0"`.
    pub packages: String,
}

/// Answer of `install_package`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct PackagesInstalled {
    /// Whether every requirement is installed.
    pub success: bool,
    /// What was asked for, one requirement each.
    pub requested: Vec<String>,
    /// What happened.
    pub message: String,
    /// The end of the installer's output, when it failed.
    pub log_tail: Option<String>,
    /// Installed packages now, `name==version`.
    pub installed_packages: Vec<String>,
}

/// One package of `list_installed_packages`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct InstalledPackage {
    /// Distribution name.
    pub name: String,
    /// Installed version.
    pub version: String,
}

/// Answer of `list_installed_packages`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct PackagesListed {
    /// Installed packages.
    pub packages: Vec<InstalledPackage>,
    /// How many.
    pub count: usize,
}

/// Answer of `reset_sandbox`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SandboxReset {
    /// Always true (a failure is an error result).
    pub success: bool,
    /// What was done.
    pub message: String,
}

/// Answer of `get_sandbox_info`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SandboxInfo {
    /// `ready`.
    pub status: String,
    /// The sandbox's Python version.
    pub python_version: String,
    /// The working directory of its code.
    pub path: String,
    /// How many packages are installed.
    pub package_count: usize,
    /// Whether its interpreter is running now (variables are kept only while it is).
    pub interpreter_running: bool,
    /// Its id: a snakebox session, also reachable with the session tools.
    pub sandbox_id: String,
}

impl SnakeboxServer {
    /// The caller's sandbox: its session named [`SANDBOX_NAME`], created now if it has none.
    async fn own_sandbox(&self, caller: &Caller) -> Result<String, EngineError> {
        if let Some(found) = self.find_own_sandbox(caller).await? {
            return Ok(found);
        }
        // None yet: looked for again under the lock, so only a first use waits for another.
        let _one_at_a_time = FIND_OR_CREATE.lock().await;
        if let Some(found) = self.find_own_sandbox(caller).await? {
            return Ok(found);
        }
        let created = self
            .engine
            .create_session(
                caller,
                CreateSession {
                    name: Some(SANDBOX_NAME.to_owned()),
                    ..CreateSession::default()
                },
            )
            .await?;
        Ok(created.session_id)
    }

    /// The caller's sandbox, if it has one (the oldest, should two have been made).
    async fn find_own_sandbox(&self, caller: &Caller) -> Result<Option<String>, EngineError> {
        let list = self.engine.list_sessions(caller).await?;
        Ok(list
            .sessions
            .into_iter()
            .filter(|s| s.name.as_deref() == Some(SANDBOX_NAME))
            .min_by_key(|s| s.created_at)
            .map(|s| s.session_id))
    }
}

fn package_names(packages: &[snakebox_engine::Package]) -> Vec<String> {
    packages
        .iter()
        .map(|p| format!("{}=={}", p.name, p.version))
        .collect()
}

#[tool_router(router = code_executor_router, vis = "pub(crate)")]
impl SnakeboxServer {
    #[tool(
        name = "execute_python",
        description = "Execute Python code in your sandbox (Python Code Executor's tool, served \
by snakebox): packages installed with install_package are importable, and variables persist \
between calls until reset_sandbox. Returns stdout, stderr and the status.\n\nExamples: \
{\"code\": \"print('Hello, World!')\"}; {\"code\": \"import math; print(math.sqrt(16))\", \
\"timeout\": 10}",
        output_schema = schema_for_output::<ExecutionResult>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = false)
    )]
    async fn code_executor_execute_python(
        &self,
        Parameters(params): Parameters<ExecuteParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let session_id = match self.own_sandbox(&caller).await {
            Ok(id) => id,
            Err(error) => return Ok(failure(&error)),
        };
        let request = ExecuteRequest {
            session_id: Some(session_id),
            script: params.code,
            timeout_seconds: params.timeout,
            ..ExecuteRequest::default()
        };
        let result = self
            .engine
            .execute(&caller, request, self.call_token(&context), None)
            .await;
        Ok(self.execution_reply(&context, &caller, result).await)
    }

    #[tool(
        description = "Install Python packages into your sandbox (Python Code Executor's tool, \
served by snakebox). One string, requirements separated by spaces or commas; waits until the \
install ends.\n\nExamples: {\"packages\": \"numpy\"}; {\"packages\": \"pandas matplotlib \
seaborn\"}; {\"packages\": \"requests>=2.28.0\"}",
        output_schema = schema_for_output::<PackagesInstalled>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = true)
    )]
    async fn install_package(
        &self,
        Parameters(params): Parameters<InstallParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let requested = split_specifiers(&params.packages);
        if requested.is_empty() {
            return Ok(failure(&no_packages("packages", "install_package")));
        }
        let session_id = match self.own_sandbox(&caller).await {
            Ok(id) => id,
            Err(error) => return Ok(failure(&error)),
        };
        let installed = self
            .engine
            .install_packages(
                &caller,
                InstallPackages {
                    session_id,
                    packages: requested.clone(),
                    wait: None,
                },
                None,
            )
            .await;
        Ok(match installed {
            Ok(status) => {
                let success = status.state == InstallState::Succeeded;
                let answer = PackagesInstalled {
                    success,
                    message: if success {
                        format!("Successfully installed {}", requested.join(" "))
                    } else {
                        format!(
                            "Failed to install {}: {}",
                            requested.join(" "),
                            status.error.as_ref().map_or_else(
                                || "the installer failed (see log_tail)".to_owned(),
                                |e| match &e.hint {
                                    Some(hint) => format!("{} (hint: {hint})", e.message),
                                    None => e.message.clone(),
                                }
                            )
                        )
                    },
                    log_tail: (!success).then(|| status.log_tail.clone()),
                    installed_packages: package_names(&status.packages),
                    requested,
                };
                json_answer(&answer, !success)
            }
            Err(error) => failure(&error),
        })
    }

    #[tool(
        description = "List the packages installed in your sandbox (Python Code Executor's \
tool, served by snakebox): name and version of each, and the count.",
        output_schema = schema_for_output::<PackagesListed>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_installed_packages(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let listed = match self.own_sandbox(&caller).await {
            Ok(id) => self.engine.list_packages(&caller, &id).await,
            Err(error) => Err(error),
        };
        Ok(match listed {
            Ok(list) => {
                let answer = PackagesListed {
                    count: list.packages.len(),
                    packages: list
                        .packages
                        .into_iter()
                        .map(|p| InstalledPackage {
                            name: p.name,
                            version: p.version,
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
        description = "Reset your sandbox to a clean state (Python Code Executor's tool, served \
by snakebox): removes the packages installed and the files and variables left by earlier \
calls.",
        output_schema = schema_for_output::<SandboxReset>(),
        annotations(read_only_hint = false, destructive_hint = true, open_world_hint = false)
    )]
    async fn reset_sandbox(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let reset = match self.own_sandbox(&caller).await {
            Ok(id) => self.engine.reset_session(&caller, &id).await,
            Err(error) => Err(error),
        };
        Ok(match reset {
            Ok(_) => {
                let answer = SandboxReset {
                    success: true,
                    message: "Sandbox reset to a clean state: installed packages, files and variables removed".into(),
                };
                json_answer(&answer, false)
            }
            Err(error) => failure(&error),
        })
    }

    #[tool(
        name = "get_sandbox_info",
        description = "Describe your sandbox (Python Code Executor's tool, served by snakebox): \
its status, Python version, working directory path and how many packages are installed. \
check_environment has the server's full report.",
        output_schema = schema_for_output::<SandboxInfo>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn code_executor_sandbox_info(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let found = match self.own_sandbox(&caller).await {
            Ok(id) => self.engine.list_sessions(&caller).await.and_then(|list| {
                list.sessions
                    .into_iter()
                    .find(|s| s.session_id == id)
                    .ok_or_else(|| {
                        EngineError::internal(
                            "your sandbox went away while it was described",
                            "call get_sandbox_info again",
                        )
                    })
            }),
            Err(error) => Err(error),
        };
        Ok(match found {
            Ok(info) => {
                let answer = SandboxInfo {
                    status: "ready".into(),
                    python_version: info.python_version,
                    path: WORK_DIR.into(),
                    package_count: info.packages.len(),
                    interpreter_running: info.interpreter_running,
                    sandbox_id: info.session_id,
                };
                json_answer(&answer, false)
            }
            Err(error) => failure(&error),
        })
    }
}
