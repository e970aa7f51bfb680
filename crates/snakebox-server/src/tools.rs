//! The tools: `execute_python`, `validate_script`, `check_environment`.
//!
//! Names and parameters are drop-in compatible with `mcp-python-exec-sandbox`; descriptions
//! are written for the language model that reads them.

use std::sync::Arc;

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ListResourceTemplatesResult, ListResourcesResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    Resource, ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_engine::OutputChunk;
use snakebox_engine::{
    Caller, EngineApi, EngineHandle, EngineHost, EnvironmentReport, ExecuteRequest,
    ExecutionResult, FileEncoding, InputFile, Status, ToolCallAudit, ValidateScript, Validation,
};
use tokio_util::sync::CancellationToken;

const INSTRUCTIONS: &str = "snakebox runs Python in a fresh, isolated sandbox for every call. \
Declare third-party packages with `dependencies` (PEP 508, pinned: [\"pandas>=2.2\"]) or a PEP 723 \
`# /// script` block; they are installed once and cached. Results carry the value of the last \
expression, plots as images, and files the script writes (read them with `resources/read`); pass \
input files with `files`. For work that spans calls (variables, files, installed packages), \
`create_session` once and pass its `session_id` to `execute_python`. Call `check_environment` to \
see available Python versions, limits and whether the network is allowed (it is off by default). \
Use `validate_script` to check a script without running it. An optional argument may be \
`null` or left out: both mean the default.";

/// Arguments of `execute_python`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecuteParams {
    /// Python source to run. May start with a PEP 723 block declaring dependencies:
    /// `# /// script` / `# dependencies = ["requests>=2.31"]` / `# ///`.
    pub script: String,
    /// Extra packages as PEP 508 specifiers, e.g. `["numpy>=1.26", "pandas==2.2.2"]`. They are
    /// merged with the script's PEP 723 dependencies; on a name clash these win.
    pub dependencies: Option<Vec<String>>,
    /// Wall-clock limit in seconds (default 30; larger values are clamped to the server maximum).
    pub timeout_seconds: Option<f64>,
    /// Python version for this call, e.g. `"3.12"` (default: the server's). Must satisfy the
    /// script's `requires-python` if it has one.
    pub python_version: Option<String>,
    /// Files to create in the script's working directory before it runs, e.g.
    /// `[{"path": "data/in.csv", "content": "a,b\n1,2\n"}]`. Paths are relative (no `/` at the
    /// start, no `..`); at most 100 files and 32 MiB in total. Binary files: base64 content
    /// with `"encoding": "base64"`.
    pub files: Option<Vec<FileParam>>,
    /// Run in this persistent session (from `create_session`) instead of a fresh sandbox:
    /// variables, imports, files and packages from earlier calls are kept. Earlier code of the
    /// same session shares the process that reports each cell: names it replaces (`sys.exit`,
    /// builtins, `json`, the runner's functions) change no later result, but code that tampers
    /// with the runner's own objects can make this session's later `status`, `exit_code`,
    /// `result`, `exception` and the stdout/stderr split say anything. `timeout`,
    /// `memory_limit`, `cancelled`, `fresh_interpreter` and the files are observed by the server
    /// and cannot be forged; other sessions and calls are never affected. `reset_session` (or
    /// any restart of the interpreter) removes such tampering.
    pub session_id: Option<String>,
    /// Set `true` to ask for network access (refused unless the server allows network; see
    /// `network_policy` in `check_environment`), `false` to run offline on a server that allows
    /// network. Default: the server's policy (off unless the operator turned it on). With
    /// `session_id`, the session's network was fixed at its creation: asking for anything else
    /// is refused with the reason.
    pub network: Option<bool>,
    /// Narrow the server's network policy for this run to these host names (`api.example.com`,
    /// or `*.example.com` for any name below it), e.g. `["api.example.com", "files.example.org"]`.
    /// Each must be allowed by the server's policy (see `check_environment`); asking for more
    /// is refused with the reason. Runs reach the network through a proxy (HTTP_PROXY and
    /// ALL_PROXY are set; urllib, requests, httpx and pip use it): host names only, public
    /// addresses only, ports 80 and 443 by default. Every connection, allowed or refused, is
    /// listed in the result's `network_log` with the reason.
    pub allowed_domains: Option<Vec<String>>,
    /// Only these modules may be imported by the script's own code (a name covers its
    /// submodules: `os` allows `os.path`), e.g. `["math", "json", "numpy"]`. An import outside
    /// them is refused before the run, with its line (`invalid_request`), and stopped while it
    /// runs (`ImportError`); each is an `import_blocked` event. Libraries' own imports are not
    /// checked. A guard rail, not the security boundary (the sandbox is). Not with `session_id`.
    /// Under a profile with an import policy it may only narrow that policy.
    pub allowed_imports: Option<Vec<String>>,
    /// The profile to run under, e.g. `"basic"` or `"data_science"` (default: the server's).
    /// A profile fixes network, subprocesses, writable paths, limits, installable packages and
    /// imports; `check_environment` lists the profiles this caller may name and what each
    /// enforces. Not with `session_id`.
    pub profile: Option<String>,
    /// A memory limit below the profile's, e.g. `"256m"`, `"1g"` or a number of bytes; a call
    /// may narrow its limits, never widen them. Not with `session_id`.
    pub memory_limit: Option<String>,
    /// The operator's secrets this run may use, by name, e.g. `["API_TOKEN"]` (check_environment
    /// lists those this caller may ask for, with their hosts). The code never sees a value: the
    /// environment variable of that name holds a placeholder, which the network proxy replaces
    /// by the value in the headers of HTTPS requests to the secret's hosts only, e.g.
    /// `requests.get(url, headers={"Authorization": f"Bearer {os.environ['API_TOKEN']}"})`.
    /// A placeholder sent anywhere else is refused. Needs network. Not with `session_id`.
    pub secrets: Option<Vec<String>>,
}

/// One input file of `execute_python`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileParam {
    /// Path relative to the working directory, e.g. `data/in.csv`.
    pub path: String,
    /// The file's content: text, or base64 when `encoding` is `base64`.
    pub content: String,
    /// `utf-8` (default) or `base64`.
    pub encoding: Option<FileEncoding>,
}

/// Arguments of `validate_script`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ValidateParams {
    /// Python source to check (with or without a PEP 723 block).
    pub script: String,
    /// Extra packages as PEP 508 specifiers, checked like `execute_python`'s.
    pub dependencies: Option<Vec<String>>,
    /// Python version to check the syntax against (default: what `execute_python` would use).
    pub python_version: Option<String>,
    /// Module names the script may import (a name covers its submodules: `os` allows
    /// `os.path`); each import outside them is a problem with its line. Absent: no import
    /// policy (or the profile's, when it has one; a list given here may only narrow it).
    pub allowed_imports: Option<Vec<String>>,
    /// Check against this profile's import policy (default: the server's profile), as
    /// `execute_python` would under it.
    pub profile: Option<String>,
}

/// Put by an HTTP face into a request's extensions, and cancelled when the request goes away
/// (its response is dropped: the client disconnected). Calls of that request are cancelled
/// with it.
#[derive(Debug, Clone)]
pub struct RequestGone(pub CancellationToken);

/// Signed download URLs of artifacts, made by an HTTP face (which serves them).
pub trait DownloadLinks: Send + Sync {
    /// The URL that downloads `caller`'s artifact `name` of `execution_id`, if one can be
    /// made.
    fn url(&self, caller: &Caller, execution_id: &str, name: &str) -> Option<String>;
}

/// Put by an HTTP face into a request's extensions: that request's results carry each
/// artifact's download URL (`download_url`) beside its `resource_link`. Results on stdio,
/// where no request carries one, are unchanged.
#[derive(Clone)]
pub struct Downloads(pub Arc<dyn DownloadLinks>);

/// The MCP server: one engine shared by every request.
#[derive(Clone)]
pub struct SnakeboxServer {
    /// Every call of a tenant's request goes here: the engine in this process, or over a
    /// wire ([`snakebox_engine::api`]).
    pub(crate) engine: Arc<dyn EngineApi>,
    /// This process's own matters: the settings the tools read.
    pub(crate) host: Arc<dyn EngineHost>,
    /// Who every call of this connection is for: stdio has one caller ([`Caller::local`]).
    /// `None` on a face with tenants ([`SnakeboxServer::per_request`]): each request carries
    /// its own, put there by the face after it authenticated the request.
    caller: Option<Caller>,
    /// Download links for every call of this connection (a legacy SSE stream opened over
    /// HTTP); a request's own [`Downloads`] comes first.
    downloads: Option<Downloads>,
    tool_router: ToolRouter<Self>,
    /// Whether the conformance suite's fixtures are served too ([`crate::conformance`]).
    fixtures: bool,
}

#[tool_router]
impl SnakeboxServer {
    /// A server over this engine (an `Arc<Engine>`, or any [`EngineHandle`]).
    #[must_use]
    pub fn new(engine: impl Into<EngineHandle>) -> Self {
        Self::for_caller(engine, Caller::local())
    }

    /// A server over this engine whose calls are all `caller`'s.
    #[must_use]
    pub fn for_caller(engine: impl Into<EngineHandle>, caller: Caller) -> Self {
        let engine: EngineHandle = engine.into();
        let tool_router = Self::tools_for(engine.host().as_ref());
        Self {
            engine: Arc::clone(engine.api()),
            host: Arc::clone(engine.host()),
            caller: Some(caller),
            downloads: None,
            tool_router,
            fixtures: false,
        }
    }

    /// This server, with download links in the results of every call (see [`Downloads`]).
    #[must_use]
    pub fn with_downloads(mut self, downloads: Downloads) -> Self {
        self.downloads = Some(downloads);
        self
    }

    /// A server over this engine for a face with tenants: every request must carry its
    /// [`Caller`] in the extensions of its HTTP request parts (an HTTP face inserts it after
    /// authenticating the request). A request without one is refused, never served as
    /// anyone's.
    #[must_use]
    pub fn per_request(engine: impl Into<EngineHandle>) -> Self {
        let engine: EngineHandle = engine.into();
        let tool_router = Self::tools_for(engine.host().as_ref());
        Self {
            engine: Arc::clone(engine.api()),
            host: Arc::clone(engine.host()),
            caller: None,
            downloads: None,
            tool_router,
            fixtures: false,
        }
    }

    /// Every tool of snakebox, with schemas every client's validator takes
    /// ([`crate::schemas`]).
    pub(crate) fn all_tools() -> ToolRouter<Self> {
        let mut tools = Self::tool_router() + Self::session_router();
        crate::schemas::make_plain(&mut tools);
        tools
    }

    /// The tools this engine's server offers: snakebox's, and each compatibility tool set
    /// ([`crate::compat`]) the operator named. A set's tool of the same name as one of
    /// snakebox's takes its place (the code executor's `execute_python`).
    fn tools_for(host: &dyn EngineHost) -> ToolRouter<Self> {
        let mut tools = Self::all_tools();
        for set in &host.config().compat_tools {
            let mut router = crate::compat::router(*set);
            crate::schemas::make_plain(&mut router);
            tools += router;
        }
        tools
    }

    /// Every tool snakebox can serve: its own and those of every compatibility tool set,
    /// with plain schemas. Two sets may name a tool alike, so this is a list, not a router.
    #[cfg(test)]
    pub(crate) fn every_tool() -> Vec<rmcp::model::Tool> {
        let mut tools = Self::all_tools().list_all();
        for set in snakebox_engine::CompatToolSet::ALL {
            let mut router = crate::compat::router(set);
            crate::schemas::make_plain(&mut router);
            tools.extend(router.list_all());
        }
        tools
    }

    /// This server with the MCP conformance suite's fixture tools and resources beside its
    /// own (see `conformance`; the hidden `serve --conformance-fixtures`).
    #[must_use]
    pub fn with_conformance_fixtures(mut self) -> Self {
        if !self.fixtures {
            self.tool_router += crate::conformance::router();
            self.fixtures = true;
        }
        self
    }

    /// The cancel token of a call: cancelled by an MCP cancellation, and on HTTP also when the
    /// request goes away (the client disconnected: [`RequestGone`]), so a run nobody waits for
    /// is stopped rather than left to its timeout.
    pub(crate) fn call_token(&self, context: &RequestContext<RoleServer>) -> CancellationToken {
        let token = context.ct.child_token();
        let gone = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<RequestGone>())
            .cloned();
        if let Some(RequestGone(gone)) = gone {
            let call = token.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = gone.cancelled() => call.cancel(),
                    () = call.cancelled() => {}
                }
            });
        }
        token
    }

    /// `shape`'s answer, shaped as `caller`'s host work ([`EngineHost::host_work`]): turning
    /// a listing of thousands of entries or a megabyte of output into text and JSON takes
    /// milliseconds of a thread, in proportion to what the caller asked for. On the host-work
    /// threads it counts against the caller's part of them, so that one tenant's flood of
    /// large answers neither queues another tenant's request behind it on the runtime's
    /// workers nor takes more than its part of the cores (issue 32, item 1).
    pub(crate) async fn shaped(
        &self,
        caller: &Caller,
        shape: impl FnOnce() -> CallToolResult + Send + 'static,
    ) -> CallToolResult {
        let (answer, mut shaped) = tokio::sync::oneshot::channel();
        let work = Box::new(move || {
            let _ = answer.send(shape());
        });
        match self.host.host_work(caller, "shape the answer", work).await {
            // The work has ended when host_work returns: the answer is there.
            Ok(()) => shaped.try_recv().unwrap_or_else(|_| {
                crate::sessions::failure(&snakebox_engine::EngineError::internal(
                    "the answer was not shaped",
                    "try the call again; if it keeps failing, the server's log says why",
                ))
            }),
            Err(error) => crate::sessions::failure(&error),
        }
    }

    /// An execution's record as the tool result: on HTTP, with the download URL of each
    /// artifact for `caller` (see [`Downloads`]).
    pub(crate) async fn execution_reply(
        &self,
        context: &RequestContext<RoleServer>,
        caller: &Caller,
        mut result: ExecutionResult,
    ) -> CallToolResult {
        self.add_download_links(context, caller, &mut result);
        self.shaped(caller, move || execution_result(&result)).await
    }

    /// On HTTP, the download URL of each of `result`'s artifacts for `caller` (see
    /// [`Downloads`]); on stdio there are none.
    pub(crate) fn add_download_links(
        &self,
        context: &RequestContext<RoleServer>,
        caller: &Caller,
        result: &mut ExecutionResult,
    ) {
        let downloads = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Downloads>())
            .or(self.downloads.as_ref());
        if let Some(Downloads(links)) = downloads {
            for artifact in &mut result.artifacts {
                artifact.download_url = links.url(caller, &result.execution_id, &artifact.name);
            }
        }
    }

    /// Who `context`'s request is for.
    pub(crate) fn caller(&self, context: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
        if let Some(fixed) = self.caller.as_ref() {
            return Ok(fixed.clone());
        }
        context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
            .cloned()
            .ok_or_else(|| {
                ErrorData::internal_error(
                    "the request carries no authenticated tenant; it was not served",
                    None,
                )
            })
    }

    #[tool(
        description = "Run a Python script in a fresh sandbox and return what a notebook would show.\n\n\
Examples:\n\
{\"script\": \"import numpy as np\\nnp.arange(3).sum()\", \"dependencies\": [\"numpy>=1.26\"]} \
-> result.json = 3\n\
{\"script\": \"import csv\\nlen(list(csv.reader(open('in.csv'))))\", \
\"files\": [{\"path\": \"in.csv\", \"content\": \"a,b\\n1,2\\n\"}]} -> result.json = 2\n\
{\"script\": \"import matplotlib.pyplot as plt\\nplt.plot([1, 4, 9])\\nplt.show()\", \
\"dependencies\": [\"matplotlib==3.10.3\"]} -> a PNG image\n\n\
Each call starts clean. Packages come from `dependencies` \
(PEP 508; pin versions) or a PEP 723 block at the top of the script; they are installed once \
and cached. To keep variables, files and packages between calls, create a session \
(`create_session`) and pass its `session_id`: the code runs in its live interpreter.\n\n\
Returns: stdout and stderr (head and tail kept if long), exit_code, status (ok, error, \
timeout, cancelled, memory_limit, cpu_limit, setup_failed, invalid_request); result (the last \
expression's repr, and json when plain data); exception (type, \
message, line, traceback of `script.py`); images (matplotlib figures, a PIL image as the last \
expression, saved PNG/JPEG/SVG files; up to 4 inline, each also an artifact); artifacts \
(files the script created or changed in its working directory, as resource links \
`snakebox://artifacts/<execution_id>/<path>` to fetch with resources/read, and over HTTP a \
`download_url`; kept for a limited time; in a session use read_file).\n\n\
`files` creates inputs in the working directory first (text, or base64 with \"encoding\": \
\"base64\"). The network is off unless the server allows it; then it goes through a proxy \
(HTTP_PROXY is set: urllib, requests, httpx and pip work), host names only, `network_log` \
lists every connection with why it was allowed or blocked, and `allowed_domains` narrows it. \
Printed lines stream as progress notifications when the request has a progress token; \
cancelling the request kills the run. Limits (timeout_seconds, default 30; output, memory, \
processes): see check_environment.",
        output_schema = schema_for_output::<ExecutionResult>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = false)
    )]
    async fn execute_python(
        &self,
        Parameters(params): Parameters<ExecuteParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let memory_limit_bytes = match params.memory_limit.as_deref().map(parse_memory) {
            None => None,
            Some(Ok(bytes)) => Some(bytes),
            Some(Err(error)) => return Ok(crate::sessions::failure(&error)),
        };
        let request = ExecuteRequest {
            session_id: params.session_id,
            script: params.script,
            dependencies: params.dependencies.unwrap_or_default(),
            timeout_seconds: params.timeout_seconds,
            python_version: params.python_version,
            files: params
                .files
                .unwrap_or_default()
                .into_iter()
                .map(|file| InputFile {
                    path: file.path,
                    content: file.content,
                    encoding: file.encoding.unwrap_or_default(),
                })
                .collect(),
            network: params.network,
            allowed_domains: params.allowed_domains.unwrap_or_default(),
            allowed_imports: params.allowed_imports,
            profile: params.profile,
            memory_limit_bytes,
            secrets: params.secrets.unwrap_or_default(),
        };
        let caller = self.caller(&context)?;
        let (sender, forwarder) = progress(&context);
        let result = self
            .engine
            .execute(&caller, request, self.call_token(&context), sender)
            .await;
        if let Some(forwarder) = forwarder {
            // Every chunk is sent before the result, so progress never trails the answer.
            let _ = forwarder.await;
        }
        Ok(self.execution_reply(&context, &caller, result).await)
    }

    #[tool(
        description = "Check a Python script without running it and list every problem found: \
malformed PEP 723 metadata (bad TOML, two blocks, wrong types such as `dependencies = \"x\"`), \
invalid PEP 508 dependency specifiers, a `requires-python` that no available interpreter \
satisfies, Python syntax errors (with line and column) for the target version, and imports \
outside `allowed_imports` (with their line). Also lists what the script imports (stdlib, a \
declared dependency, or undeclared: a missing dependency), its size, and recommendations. No \
code runs and nothing is installed.\n\nExample: {\"script\": \"import numpy\\nprint('hi'\", \
\"dependencies\": [\"numpy>=\"], \"allowed_imports\": [\"numpy\", \"math\"]}",
        output_schema = schema_for_output::<Validation>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn validate_script(
        &self,
        Parameters(params): Parameters<ValidateParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let validation = match self
            .engine
            .validate(
                &caller,
                ValidateScript {
                    script: params.script,
                    dependencies: params.dependencies.unwrap_or_default(),
                    python_version: params.python_version,
                    profile: params.profile,
                    allowed_imports: params.allowed_imports,
                },
            )
            .await
        {
            Ok(validation) => validation,
            Err(error) => return Ok(crate::sessions::failure(&error)),
        };
        Ok(structured(&validation, validation_text(&validation), false))
    }

    #[tool(
        description = "Describe the execution environment: snakebox, uv and Python versions, \
platform, the sandbox backend and whether isolation is really active, each resource limit and \
whether it is enforced here, network policy, available Python versions, and the package cache \
(location, size, warming). Call it first to learn what versions and limits you can rely on.",
        output_schema = schema_for_output::<EnvironmentReport>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn check_environment(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller(&context)?;
        let report = self.engine.report_for(&caller).await;
        Ok(structured(&report, report_text(&report), false))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SnakeboxServer {
    /// Every call: arguments a client added on its own are set aside (and named in the
    /// result), misspelled ones refused (`arguments`), then the tool runs; arguments
    /// that do not fit its parameters get an error naming them and the types they need.
    async fn call_tool(
        &self,
        mut request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        let aliases = match (
            self.tool_router.get(&request.name),
            request.arguments.as_mut(),
        ) {
            (Some(tool), Some(arguments)) => crate::arguments::read_aliases(tool, arguments)?,
            _ => Vec::new(),
        };
        let ignored = match (
            self.tool_router.get(&request.name),
            request.arguments.as_mut(),
        ) {
            (Some(tool), Some(arguments)) => crate::arguments::set_aside_foreign(tool, arguments)?,
            _ => Vec::new(),
        };
        let wrong_types = self
            .tool_router
            .get(&request.name)
            .map(|tool| crate::arguments::wrong_types(tool, request.arguments.as_ref()))
            .unwrap_or_default();
        let name = request.name.clone();
        // Every answered call is reported as the API says (`ToolCallAudit::answered`: runs
        // are audited by the engine itself, every other tool call gets one line: when,
        // tenant, tool, status). A call refused before it ran (an unknown tool, arguments
        // that do not fit; a run tool's too, the engine never saw it) is recorded as refused
        // with the size and hash of what was sent, never what was sent.
        let caller = self.caller(&context).ok();
        let sent = request.arguments.clone();
        let refused = |caller: Option<Caller>| {
            let request = serde_json::json!({ "name": &name, "arguments": &sent }).to_string();
            let (engine, tool) = (Arc::clone(&self.engine), name.to_string());
            async move {
                if let Some(caller) = caller {
                    engine
                        .audit_tool_call(&caller, ToolCallAudit::Refused { tool, request })
                        .await;
                }
            }
        };
        if self.tool_router.get(&name).is_none() {
            refused(caller.clone()).await;
            let tools: Vec<String> = self
                .tool_router
                .list_all()
                .into_iter()
                .map(|tool| format!("`{}`", tool.name))
                .collect();
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{}`", snakebox_engine::cap_text(&name, 200)),
                Some(serde_json::json!({
                    "hint": format!("call one of {} (tools/list describes each)", tools.join(", "))
                })),
            ));
        }
        let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        let response = self.tool_router.call(tcc).await;
        let mut response = match response {
            Ok(response) => response,
            Err(error) => {
                refused(caller.clone()).await;
                return Err(error);
            }
        };
        if let rmcp::model::CallToolResponse::Complete(result) = &mut response {
            let unfit = crate::arguments::explain_unfit(&name, &wrong_types, result);
            crate::arguments::note_ignored(result, &ignored);
            crate::arguments::note_aliases(result, &aliases);
            if unfit {
                refused(caller.clone()).await;
            } else if let Some(caller) = &caller
                && let Some(audit) = ToolCallAudit::answered(&name, result.is_error == Some(true))
            {
                self.engine.audit_tool_call(caller, audit).await;
            }
        }
        Ok(response)
    }

    /// A method MCP does not have (or snakebox does not serve): `-32601`, naming it, with
    /// the methods there are (rmcp's own answer is the bare method name).
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        Err(ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!("unknown method `{}`", request.method),
            Some(serde_json::json!({
                "hint": "snakebox serves initialize, ping, tools/list, tools/call, \
                         resources/list, resources/read and resources/templates/list"
            })),
        ))
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_resources()
                .enable_tools()
                .build(),
        )
        .with_server_info(Implementation::new("snakebox", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let template = ResourceTemplate::new(snakebox_engine::ARTIFACT_URI_TEMPLATE, "artifact")
            .with_title("Files produced by execute_python")
            .with_description(format!(
                "A file a run wrote in its working directory, or an image it produced; the \
                 URIs come in execute_python results (artifacts, resource_link content). {}.",
                self.host.artifact_retention()
            ));
        let mut templates = vec![template];
        if self.fixtures {
            templates.push(crate::conformance::template());
        }
        Ok(ListResourceTemplatesResult::with_all_items(templates))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let caller = self.caller(&context)?;
        let resources = self
            .engine
            .list_artifacts(&caller, LISTED_ARTIFACTS)
            .await
            .into_iter()
            .map(|artifact| {
                Resource::new(artifact.uri, artifact.name)
                    .with_mime_type(artifact.mime_type)
                    .with_size(artifact.size)
            })
            .collect::<Vec<_>>();
        let resources = if self.fixtures {
            [resources, crate::conformance::resources()].concat()
        } else {
            resources
        };
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let caller = self.caller(&context)?;
        if self.fixtures && crate::conformance::is_fixture_uri(&request.uri) {
            return crate::conformance::read(&request.uri).map(ReadResourceResponse::from);
        }
        read_artifact(self.engine.as_ref(), &caller, &request.uri)
            .await
            .map(ReadResourceResponse::from)
    }
}

/// A call's `memory_limit` as seed servers write it (`256m`, `1g`, `512MiB`, `1048576`; see
/// [`snakebox_engine::parse_memory_limit`]).
pub(crate) fn parse_memory(text: &str) -> Result<u64, snakebox_engine::EngineError> {
    snakebox_engine::parse_memory_limit(text).map_err(|err| {
        let hint = match err {
            snakebox_engine::SizeError::TooSmall(_) => {
                "give 16MiB or more (\"256m\"), or leave memory_limit out for the profile's limit"
            }
            _ => snakebox_engine::SIZE_HINT,
        };
        snakebox_engine::EngineError::invalid(format!("memory_limit: {err}"), hint)
    })
}

/// Structured content plus a text form. `is_error` marks results where the tool could not do
/// what was asked (not a script that failed: that is a normal result).
pub(crate) fn structured<T: Serialize>(value: &T, text: String, is_error: bool) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = serde_json::to_value(value).ok();
    result.is_error = Some(is_error);
    result
}

/// A run's record as the tool's answer (shaped as the caller's host work: see
/// [`SnakeboxServer::shaped`]).
pub(crate) fn execution_result(result: &ExecutionResult) -> CallToolResult {
    use base64::Engine as _;
    let is_error = matches!(result.status, Status::InvalidRequest | Status::SetupFailed);
    let mut reply = structured(result, result.to_text(), is_error);
    // Images first (bounded in size and number by the engine), then a link per artifact.
    for image in &result.inline_images {
        let data = base64::engine::general_purpose::STANDARD.encode(&image.data);
        reply
            .content
            .push(ContentBlock::image(data, image.mime_type.clone()));
    }
    for artifact in &result.artifacts {
        reply.content.push(ContentBlock::resource_link(
            Resource::new(artifact.uri.clone(), artifact.name.clone())
                .with_mime_type(artifact.mime_type.clone())
                .with_size(artifact.size)
                .with_description(match &artifact.download_url {
                    Some(url) => format!(
                        "produced by execution {} (read it with resources/read, or download it with a plain GET of {url})",
                        result.execution_id
                    ),
                    None => format!(
                        "produced by execution {} (read it with resources/read)",
                        result.execution_id
                    ),
                }),
        ));
    }
    reply
}

/// An engine error where the protocol wants an error, not a tool result (`resources/read`):
/// its kind picks the JSON-RPC code, the hint travels in `data`.
fn protocol_error(error: &snakebox_engine::EngineError, uri: &str) -> ErrorData {
    use snakebox_engine::ErrorKind;
    let data = Some(serde_json::json!({
        "uri": uri,
        "kind": error.kind,
        "hint": error.hint,
    }));
    match error.kind {
        ErrorKind::Invalid => ErrorData::invalid_params(error.message.clone(), data),
        ErrorKind::NotFound => ErrorData::resource_not_found(error.message.clone(), data),
        _ => ErrorData::internal_error(error.message.clone(), data),
    }
}

/// Newest artifacts listed by `resources/list` (all stay readable through the template).
const LISTED_ARTIFACTS: usize = 100;

/// `resources/read` of an artifact: text when it is text, base64 otherwise.
async fn read_artifact(
    engine: &dyn EngineApi,
    caller: &Caller,
    uri: &str,
) -> Result<ReadResourceResult, ErrorData> {
    let content = engine
        .read_artifact(caller, uri)
        .await
        .map_err(|err| protocol_error(&err, uri))?;
    let contents = if snakebox_engine::is_text_mime(&content.mime_type) {
        match String::from_utf8(content.data) {
            Ok(text) => ResourceContents::text(text, content.uri).with_mime_type(content.mime_type),
            Err(err) => ResourceContents::blob(
                base64::Engine::encode(
                    &base64::engine::general_purpose::STANDARD,
                    err.into_bytes(),
                ),
                content.uri,
            )
            .with_mime_type(content.mime_type),
        }
    } else {
        ResourceContents::blob(
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, content.data),
            content.uri,
        )
        .with_mime_type(content.mime_type)
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

fn validation_text(validation: &Validation) -> String {
    let mut text = if validation.valid {
        format!(
            "valid: no problems found (Python {})\n",
            validation.python_version.as_deref().unwrap_or("unknown")
        )
    } else {
        format!("invalid: {} problem(s)\n", validation.problems.len())
    };
    for problem in &validation.problems {
        let location = match (problem.line, problem.column) {
            (Some(line), Some(column)) => format!(" (line {line}, column {column})"),
            (Some(line), None) => format!(" (line {line})"),
            _ => String::new(),
        };
        text.push_str(&format!(
            "- [{}]{location} {}\n",
            problem.kind, problem.message
        ));
        if let Some(hint) = &problem.hint {
            text.push_str(&format!("  hint: {hint}\n"));
        }
    }
    if let Some(analysis) = &validation.analysis {
        text.push_str(&format!(
            "analysis: {} lines, {} functions, {} classes, {} imports\n",
            analysis.lines, analysis.functions, analysis.classes, analysis.imports
        ));
    }
    for found in &validation.imports {
        let origin = match found.origin {
            snakebox_engine::ImportOrigin::Stdlib => "stdlib",
            snakebox_engine::ImportOrigin::Dependency => "dependency",
            snakebox_engine::ImportOrigin::Undeclared => "undeclared",
        };
        let refused = if found.allowed { "" } else { ", not allowed" };
        text.push_str(&format!(
            "- import {} (line {}, {origin}{refused})\n",
            found.module, found.line
        ));
    }
    for recommendation in &validation.recommendations {
        text.push_str(&format!("recommendation: {recommendation}\n"));
    }
    text
}

fn report_text(report: &EnvironmentReport) -> String {
    serde_json::to_string_pretty(report).unwrap_or_default()
}

/// Progress notifications for the request, when the client asked for them.
pub(crate) fn progress(
    context: &RequestContext<RoleServer>,
) -> (
    Option<tokio::sync::mpsc::UnboundedSender<OutputChunk>>,
    Option<tokio::task::JoinHandle<()>>,
) {
    let Some(token) = context.meta.get_progress_token() else {
        return (None, None);
    };
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel::<OutputChunk>();
    let forwarder = tokio::spawn(crate::progress::forward(
        context.peer.clone(),
        token,
        receiver,
    ));
    (Some(sender), Some(forwarder))
}

#[cfg(test)]
mod description_tests {
    use super::SnakeboxServer;

    /// Claude Code cuts tool descriptions at 2,048 characters: keep each within it, so the
    /// examples (first) are never lost.
    #[test]
    fn every_tool_description_fits_the_shortest_client_limit() {
        let tools = SnakeboxServer::every_tool();
        assert!(tools.len() >= 16);
        for tool in tools {
            let length = tool.description.as_deref().map_or(0, |d| d.chars().count());
            assert!(
                (1..=2048).contains(&length),
                "{}: {length} characters",
                tool.name
            );
        }
    }
}
