//! The compatibility tool set of IBM's python sandbox server (`execute_code`, `validate_code`,
//! `get_sandbox_info`), served beside snakebox's own tools when the operator turns it on
//! (`serve --compat-tools ibm`, or a bare `--compat-tools`), so clients and prompts written
//! for that server keep working.
//!
//! Its arguments and answers keep that server's names and shapes; what they mean is snakebox's:
//! each call runs in a fresh sandbox under the server's default profile (its tiers are
//! snakebox's built-in profiles), `memory_limit` narrows the profile's limit, `use_container`
//! is honoured only on the docker backend and refused with the reason elsewhere, and `result`
//! is the value of the variable `result` (that server's meaning) while `last_expression` is
//! snakebox's own result (the value of the last expression). A separate tool set rather than
//! aliases on `execute_python`: its tool names are what its clients call, and its argument
//! names beside snakebox's would make one tool with two names for each argument.

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_engine::{EngineError, ExecuteRequest, ExecutionResult, SecurityEvent, Status};

use super::json_answer;
use crate::SnakeboxServer;

/// Arguments of `execute_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecuteCodeParams {
    /// Python code to execute, e.g. `"result = 2 + 2\nprint(result)"`.
    pub code: String,
    /// Execution timeout in seconds (default 30; at most the server's maximum).
    pub timeout: Option<f64>,
    /// Return stdout and stderr (default true; `false` returns them empty).
    pub capture_output: Option<bool>,
    /// Modules the code may import, e.g. `["math"]`; within the server profile's own list.
    pub allowed_imports: Option<Vec<String>>,
    /// Ask for container isolation: honoured when the server runs containers (its docker
    /// backend), refused with the reason otherwise. Every call is sandboxed either way.
    pub use_container: Option<bool>,
    /// A memory limit below the profile's, e.g. `"256m"`.
    pub memory_limit: Option<String>,
}

/// Answer of `execute_code`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ExecuteCodeResult {
    /// Whether the code ran to the end without an error.
    pub success: bool,
    /// The run's id (its artifacts and audit line carry it).
    pub execution_id: String,
    /// The value of the code's top-level variable `result` (JSON when plain data, else its
    /// repr); null when it has none.
    pub result: Option<serde_json::Value>,
    /// snakebox's result: the value of the last expression (JSON when plain data, else its
    /// repr); null when there is none.
    pub last_expression: Option<serde_json::Value>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Seconds the run took.
    pub execution_time: f64,
    /// Top-level names the code defined.
    pub variables: Vec<String>,
    /// What went wrong (the exception, or why the call was refused, with the fix).
    pub error: Option<String>,
    /// snakebox's status: ok, error, timeout, memory_limit, invalid_request, ...
    pub status: String,
    /// The profile the run was held to.
    pub profile: Option<String>,
    /// What the server refused or stopped (security events).
    pub events: Vec<SecurityEvent>,
}

/// Arguments of `validate_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ValidateCodeParams {
    /// Python code to validate.
    pub code: String,
    /// Modules the code may import (default: the server profile's list).
    pub allowed_imports: Option<Vec<String>>,
}

/// `validation` of `validate_code`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct CodeValidation {
    /// Whether nothing would stop the code.
    pub valid: bool,
    /// Each problem, with its line: `Line 1: Import 'os' is not allowed`.
    pub errors: Vec<String>,
    /// A summary.
    pub message: String,
}

/// `analysis` of `validate_code`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct CodeAnalysis {
    /// Lines of code.
    pub line_count: u64,
    /// Characters of code.
    pub character_count: u64,
    /// `low`, `medium` or `high`.
    pub estimated_complexity: String,
}

/// Answer of `validate_code`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ValidateCodeResult {
    /// Whether the code is valid, and why not.
    pub validation: CodeValidation,
    /// Its size and complexity.
    pub analysis: CodeAnalysis,
    /// What to change.
    pub recommendations: Vec<String>,
}

/// One profile in `get_sandbox_info`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SecurityProfile {
    /// Whether this caller may use it (the server's default always is).
    pub enabled: bool,
    /// Modules its code may import (empty: no import policy).
    pub modules: Vec<String>,
    /// What it is for.
    pub description: String,
    /// Each decision and how it is enforced.
    pub enforces: Vec<String>,
}

/// `resource_limits` of `get_sandbox_info`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ResourceLimits {
    /// Default timeout in seconds.
    pub timeout: u64,
    /// Output kept per stream, in bytes.
    pub max_output_size: u64,
    /// The default profile's memory limit (`256m`), or `unlimited`.
    pub memory_limit: String,
}

/// `container_mode` of `get_sandbox_info`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ContainerMode {
    /// Whether `use_container` can be honoured here (the docker backend).
    pub available: bool,
    /// Whether runs are in containers by default.
    pub enabled: bool,
}

/// Answer of `get_sandbox_info`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SandboxInfo {
    /// Always true.
    pub success: bool,
    /// The profiles, by name.
    pub security_profiles: std::collections::BTreeMap<String, SecurityProfile>,
    /// The default profile's name.
    pub default_profile: String,
    /// Limits of the default profile.
    pub resource_limits: ResourceLimits,
    /// Container isolation.
    pub container_mode: ContainerMode,
}

fn value_json(value: Option<&snakebox_engine::ValueRepr>) -> Option<serde_json::Value> {
    value.map(|value| {
        value
            .json
            .clone()
            .unwrap_or_else(|| serde_json::Value::String(value.repr.clone()))
    })
}

fn execute_answer(result: &ExecutionResult, capture: bool) -> ExecuteCodeResult {
    let error = result
        .error
        .as_ref()
        .map(|error| match &error.hint {
            Some(hint) => format!("{} (hint: {hint})", error.message),
            None => error.message.clone(),
        })
        .or_else(|| {
            result
                .exception
                .as_ref()
                .map(|e| format!("{}: {}", e.type_name, e.message))
        });
    ExecuteCodeResult {
        success: result.status == Status::Ok && result.exception.is_none(),
        execution_id: result.execution_id.clone(),
        result: value_json(result.result_variable.as_ref()),
        last_expression: value_json(result.result.as_ref()),
        stdout: if capture {
            result.stdout.clone()
        } else {
            String::new()
        },
        stderr: if capture {
            result.stderr.clone()
        } else {
            String::new()
        },
        #[allow(clippy::cast_precision_loss)]
        execution_time: result.duration_ms as f64 / 1000.0,
        variables: result.names.clone(),
        error,
        status: result.status.as_str().to_owned(),
        profile: result.profile.clone(),
        events: result.events.clone(),
    }
}

fn mebibytes(bytes: u64) -> String {
    format!("{}m", bytes / (1 << 20))
}

#[tool_router(router = ibm_router, vis = "pub(crate)")]
impl SnakeboxServer {
    #[tool(
        description = "Execute Python code in a fresh sandbox (the tool of IBM's python sandbox \
server, served by snakebox). Returns success, result (the value of a variable named `result`), \
last_expression (the last expression's value), stdout, stderr, execution_time and variables.\n\n\
Example: {\"code\": \"result = 2 + 2\\nprint(f'The answer is: {result}')\", \"timeout\": 10} -> \
result 4, stdout \"The answer is: 4\\n\".\n\nThe server's default profile decides network, \
subprocesses, packages, imports and limits (get_sandbox_info lists them); `memory_limit` may \
only lower the limit; `use_container` works only where the server runs containers.",
        output_schema = schema_for_output::<ExecuteCodeResult>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = false)
    )]
    async fn execute_code(
        &self,
        Parameters(params): Parameters<ExecuteCodeParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let config = self.host.config();
        if params.use_container == Some(true) && !config.backend.runs_in_containers() {
            return Ok(crate::sessions::failure(&EngineError::invalid(
                format!(
                    "use_container is not available: this server isolates runs with its `{}` backend, not containers",
                    config.backend.name()
                ),
                "drop use_container (every run is already in its own sandbox: namespaces, seccomp, limits); or the operator starts snakebox with --sandbox-backend docker",
            )));
        }
        let memory_limit_bytes = match params
            .memory_limit
            .as_deref()
            .map(crate::tools::parse_memory)
        {
            None => None,
            Some(Ok(bytes)) => Some(bytes),
            Some(Err(error)) => return Ok(crate::sessions::failure(&error)),
        };
        let request = ExecuteRequest {
            script: params.code,
            session_id: None,
            timeout_seconds: params.timeout,
            allowed_imports: params.allowed_imports,
            memory_limit_bytes,
            ..ExecuteRequest::default()
        };
        let result = self
            .engine
            .execute(&caller, request, self.call_token(&context), None)
            .await;
        let answer = execute_answer(&result, params.capture_output.unwrap_or(true));
        let is_error = matches!(result.status, Status::InvalidRequest | Status::SetupFailed);
        // A megabyte of output is shaped as the caller's host work, as every run's answer.
        Ok(self
            .shaped(&caller, move || json_answer(&answer, is_error))
            .await)
    }

    #[tool(
        description = "Validate Python code without running it (the tool of IBM's python \
sandbox server, served by snakebox): imports outside the policy (`allowed_imports`, else the \
server profile's), syntax errors, with their lines; an analysis and recommendations.\n\n\
Example: {\"code\": \"import os; os.system('ls')\"} -> valid false, errors [\"Line 1: Import \
'os' is not allowed\"] under the basic profile.",
        output_schema = schema_for_output::<ValidateCodeResult>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn validate_code(
        &self,
        Parameters(params): Parameters<ValidateCodeParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        // The engine holds allowed_imports to the profile as it does for execute_code; a
        // request it refuses (a wider list) is invalid code here, with the reason as its error.
        let (validation, mut errors) = match self
            .engine
            .validate(
                &caller,
                snakebox_engine::ValidateScript {
                    script: params.code.clone(),
                    allowed_imports: params.allowed_imports,
                    ..snakebox_engine::ValidateScript::default()
                },
            )
            .await
        {
            Ok(validation) => (Some(validation), Vec::new()),
            Err(refused) => (None, vec![refused.message.clone()]),
        };
        let valid = validation.as_ref().is_some_and(|v| v.valid);
        let problems = validation.as_ref().map_or(&[][..], |v| &v.problems[..]);
        for problem in problems {
            let at = problem
                .line
                .map_or_else(String::new, |line| format!("Line {line}: "));
            if problem.kind == "import_not_allowed" {
                let module = validation
                    .iter()
                    .flat_map(|v| v.imports.iter())
                    .find(|found| !found.allowed && Some(found.line) == problem.line)
                    .map_or("?", |found| found.module.as_str());
                errors.push(format!("{at}Import '{module}' is not allowed"));
            } else {
                errors.push(format!("{at}{}", problem.message));
            }
        }
        let line_count = params.code.lines().count() as u64;
        let functions = validation
            .as_ref()
            .and_then(|v| v.analysis.as_ref())
            .map_or(0, |a| a.functions);
        let estimated_complexity = match (line_count, functions) {
            (0..=50, 0..=5) => "low",
            (0..=200, 0..=20) => "medium",
            _ => "high",
        };
        let mut recommendations = validation
            .as_ref()
            .map(|v| v.recommendations.clone())
            .unwrap_or_default();
        if !valid {
            recommendations.push(
                "Some operations may be restricted in sandbox environment: see get_sandbox_info for what the profile allows".into(),
            );
        }
        let answer = ValidateCodeResult {
            validation: CodeValidation {
                valid,
                message: if valid {
                    "Code is valid".into()
                } else {
                    "Code contains restricted operations".into()
                },
                errors,
            },
            analysis: CodeAnalysis {
                line_count,
                character_count: params.code.chars().count() as u64,
                estimated_complexity: estimated_complexity.into(),
            },
            recommendations,
        };
        Ok(json_answer(&answer, false))
    }

    #[tool(
        description = "Describe the sandbox (the tool of IBM's python sandbox server, served by \
snakebox): its security profiles (basic, data_science, network, filesystem and the operator's), \
which this caller may use and the modules each allows, resource limits and container mode. \
check_environment has the full report.",
        output_schema = schema_for_output::<SandboxInfo>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_sandbox_info(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let config = self.host.config();
        let profiles = &config.profiles;
        let default = profiles.all.get(&profiles.default);
        let memory = default
            .and_then(|p| p.limits.memory_bytes)
            .into_iter()
            .chain(config.memory_bytes)
            .min();
        let docker = config.backend.runs_in_containers();
        let answer = SandboxInfo {
            success: true,
            security_profiles: profiles
                .all
                .values()
                .map(|profile| {
                    (
                        profile.name.clone(),
                        SecurityProfile {
                            enabled: profiles.for_caller(&caller, Some(&profile.name)).is_ok(),
                            modules: profile.allowed_imports.clone().unwrap_or_default(),
                            description: profile.description.clone(),
                            enforces: profile.enforcement(),
                        },
                    )
                })
                .collect(),
            default_profile: profiles.default.clone(),
            resource_limits: ResourceLimits {
                timeout: config.default_timeout.as_secs(),
                max_output_size: default
                    .and_then(|p| p.limits.output_bytes)
                    .unwrap_or(config.max_output_bytes)
                    .min(config.max_output_bytes),
                memory_limit: memory.map_or_else(|| "unlimited".into(), mebibytes),
            },
            container_mode: ContainerMode {
                available: docker,
                enabled: docker,
            },
        };
        Ok(json_answer(&answer, false))
    }
}
