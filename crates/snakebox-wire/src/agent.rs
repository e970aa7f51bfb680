//! `snakebox agent`'s side of the wire: the engine served over the internal HTTP API
//! ([`crate::protocol`]) to the fronts that hold the private half of its front key.
//!
//! Why it exists: a front (the MCP and HTTP faces) holds an `Arc<dyn EngineApi>`; on one
//! host that is the engine itself, across hosts it is a [`crate::RemoteEngine`] calling this
//! router. One route per [`EngineApi`] method, so the engine decides everything exactly as it
//! does in one process.
//!
//! Who is trusted, and with what: every API request carries a grant token
//! (`Authorization: Bearer …`) that [`AgentCheck`] verifies: signed with the front's key, for
//! this agent's name and audience, within its lifetime, never seen before. The tenant of the
//! call ([`Caller`]) is the token's and nothing else's: no body field names it (`Caller` is
//! not `Deserialize`). A call on a session must carry a token for that very session, so a
//! token lent for one session's call cannot act on another. Sessions are bound to the tenant
//! that created them by the engine itself (another tenant's id is "not found"). A refused
//! token is answered `401` with what was wrong and a hint, and nothing runs.
//!
//! The probes (`/healthz`, `/readyz`) and `/metrics` take no token: they say nothing of any
//! tenant, and the agent's port is reachable only by fronts (the deployment's network
//! policy; SECURITY.md). User code never sees a token: a run's environment is made by the
//! engine, never from a request's headers.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use snakebox_engine::{
    Caller, CreateSession, EngineApi, EngineHandle, EngineHost, ExecuteRequest, ExecutionResult,
    InstallPackages, ListFiles, OpenArtifact, OutputChunk, OutputSink, ReadFile, RunCommand,
    RunQuery, ToolCallAudit, ValidateScript, WireExecution, WriteFile,
};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio_util::sync::CancellationToken;

use crate::protocol::{self, AgentRefusal, ArtifactLimit, ArtifactRef, Frame, RunRef, SessionRef};
use crate::token::AgentCheck;

/// The largest request body an agent reads: room for a call at the documented limits (32 MiB
/// of input files as base64 beside a script), as the HTTP face's default.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Renders the process's metrics as Prometheus text (the binary passes the HTTP face's
/// exporter: this room sits below it).
pub type MetricsRender = Arc<dyn Fn() -> String + Send + Sync>;

/// What the routes share.
struct Agent {
    api: Arc<dyn EngineApi>,
    host: Arc<dyn EngineHost>,
    check: AgentCheck,
    metrics: Option<MetricsRender>,
}

/// The agent's routes: the API behind token checks, the probes and `/metrics` without.
pub fn router(engine: EngineHandle, check: AgentCheck, metrics: Option<MetricsRender>) -> Router {
    let agent = Arc::new(Agent {
        api: Arc::clone(engine.api()),
        host: Arc::clone(engine.host()),
        check,
        metrics,
    });
    Router::new()
        .route(protocol::EXECUTE, post(execute))
        .route(protocol::RUN_COMMAND, post(run_command))
        .route(protocol::INSTALL_PACKAGES, post(install_packages))
        .route(protocol::CREATE_SESSION, post(create_session))
        .route(protocol::LIST_SESSIONS, post(list_sessions))
        .route(protocol::DELETE_SESSION, post(delete_session))
        .route(protocol::RESET_SESSION, post(reset_session))
        .route(protocol::LIST_PACKAGES, post(list_packages))
        .route(protocol::WRITE_FILE, post(write_file))
        .route(protocol::READ_FILE, post(read_file))
        .route(protocol::LIST_FILES, post(list_files))
        .route(protocol::VALIDATE, post(validate))
        .route(protocol::REPORT, post(report))
        .route(protocol::LIST_RUNS, post(list_runs))
        .route(protocol::RUN_RECORD, post(run_record))
        .route(protocol::RUN_OUTPUT, post(run_output))
        .route(protocol::LIVE_OUTPUT, post(live_output))
        .route(protocol::CANCEL_RUN, post(cancel_run))
        .route(protocol::LIST_ARTIFACTS, post(list_artifacts))
        .route(protocol::READ_ARTIFACT, post(read_artifact))
        .route(protocol::OPEN_ARTIFACT, post(open_artifact))
        .route(protocol::AUDIT_TOOL_CALL, post(audit_tool_call))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(scrape))
        .fallback(|| async {
            Refusal::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route on a snakebox agent".into(),
                "an agent serves the internal API under /v1/ to fronts (`snakebox serve --agents URL`), not MCP: point MCP clients at a front",
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(agent)
}

/// Serve `router` on `listener` until `stop` is cancelled.
///
/// # Errors
/// When accepting connections fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // A streamed answer is many small writes (a frame per chunk, then the result): without
    // TCP_NODELAY, Nagle's algorithm holds each back for the front's delayed ACK (~40 ms).
    let listener = listener.tap_io(|stream| {
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(%err, "could not set TCP_NODELAY on a front's connection");
        }
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}

/// A request refused before any engine call.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    body: AgentRefusal,
}

impl Refusal {
    fn new(status: StatusCode, error: &str, message: String, hint: &str) -> Refusal {
        Refusal {
            status,
            body: AgentRefusal {
                error: error.into(),
                message,
                hint: hint.into(),
            },
        }
    }

    fn unauthorized(message: String, hint: &str) -> Refusal {
        Refusal::new(StatusCode::UNAUTHORIZED, "unauthorized", message, hint)
    }

    fn bad_request(message: String) -> Refusal {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            message,
            "send the request type of the route as JSON (snakebox_wire::protocol); front and agent must be the same snakebox version",
        )
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"snakebox-agent\""),
            );
        }
        response
    }
}

/// What a verified token grants: one call of its tenant, on its session if it names one.
struct Granted {
    caller: Caller,
    session: Option<String>,
}

impl Granted {
    /// Whether the token was signed for a call on `session` (a session's call) or on none.
    fn scope(&self, session: Option<&str>) -> Result<(), Refusal> {
        if self.session.as_deref() == session {
            return Ok(());
        }
        let granted = self.session.as_deref().unwrap_or("no session");
        let asked = session.unwrap_or("no session");
        Err(Refusal::unauthorized(
            format!("the token grants a call on `{granted}`, the request is for `{asked}`"),
            "a front signs one token per call, naming the session the call acts on: send the call with a token signed for it",
        ))
    }
}

impl FromRequestParts<Arc<Agent>> for Granted {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, agent: &Arc<Agent>) -> Result<Granted, Refusal> {
        let Some(value) = parts.headers.get(header::AUTHORIZATION) else {
            return Err(Refusal::unauthorized(
                "no `Authorization` header: a snakebox agent answers only calls a front signed"
                    .into(),
                "call the agent through a front (`snakebox serve --agents URL --front-key FILE`); clients never call an agent directly",
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                Refusal::unauthorized(
                    "the `Authorization` header is not `Bearer <token>`".into(),
                    "send the grant token a front signed as `Authorization: Bearer <token>`",
                )
            })?;
        let grant = agent.check.check(token, SystemTime::now()).map_err(|err| {
            tracing::warn!(%err, "refused a call to the agent");
            Refusal::unauthorized(format!("the token was refused: {err}"), err.hint())
        })?;
        let caller = Caller::tenant(&grant.tenant).map_err(|err| {
            Refusal::unauthorized(
                format!("the token's tenant was refused: {}", err.message),
                "the front signs tokens for its tenants' names: 1 to 64 of a-z, 0-9, - and _",
            )
        })?;
        Ok(Granted {
            caller,
            session: grant.session,
        })
    }
}

/// A request body as JSON of `T`, refused with a JSON `400` when it is not one.
struct Json<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = Refusal;

    async fn from_request(request: Request, state: &S) -> Result<Json<T>, Refusal> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|err| Refusal::bad_request(format!("the body could not be read: {err}")))?;
        serde_json::from_slice(&bytes).map(Json).map_err(|err| {
            Refusal::bad_request(format!(
                "the body is not a {}: {err}",
                std::any::type_name::<T>()
            ))
        })
    }
}

/// An answer as JSON, `200`.
fn answer<T: Serialize>(value: &T) -> Response {
    axum::Json(value).into_response()
}

/// One line of a streamed answer.
fn line<T: Serialize>(value: &T) -> Bytes {
    let mut text = serde_json::to_vec(value).unwrap_or_else(|err| {
        // Every frame's types serialise (the engine's API tests prove it); a failure would
        // be a bug, answered as a line the client reports rather than a broken stream.
        serde_json::to_vec(&Frame::<()>::Chunk(OutputChunk {
            stream: snakebox_engine::Stream::Stderr,
            text: format!("snakebox agent: a frame did not serialise: {err}"),
        }))
        .unwrap_or_default()
    });
    text.push(b'\n');
    Bytes::from(text)
}

/// A streamed answer: the lines `lines` receives, as the body. When the client goes away
/// (the body is dropped), `cancel` is cancelled: the run stops.
fn streamed(
    lines: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
    cancel: CancellationToken,
) -> Response {
    let guard = cancel.drop_guard();
    let stream = futures::stream::unfold((lines, guard), |(mut lines, guard)| async move {
        lines
            .recv()
            .await
            .map(|bytes| (Ok::<Bytes, Infallible>(bytes), (lines, guard)))
    });
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    response
}

/// Run `call` with a sink and a cancellation token, streaming its chunks as frames, then its
/// answer as the result frame; with `tail`, chunks sent after the answer (an install going
/// on) follow it until the sink's last sender is gone.
fn stream_call<T, F, Fut>(call: F, tail: bool) -> Response
where
    T: Serialize + Send + 'static,
    F: FnOnce(CancellationToken, OutputSink) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let cancel = CancellationToken::new();
    let (sink, mut chunks) = unbounded_channel::<OutputChunk>();
    let (lines, body) = unbounded_channel::<Bytes>();
    let run = call(cancel.clone(), sink);
    tokio::spawn(async move {
        let send = |lines: &UnboundedSender<Bytes>, chunk: OutputChunk| {
            let _ = lines.send(line(&Frame::<()>::Chunk(chunk)));
        };
        let mut run = std::pin::pin!(run);
        let mut answer = None;
        loop {
            tokio::select! {
                biased;
                chunk = chunks.recv() => match chunk {
                    Some(chunk) => send(&lines, chunk),
                    None => break,
                },
                done = &mut run => {
                    answer = Some(done);
                    break;
                }
            }
        }
        let answer = match answer {
            Some(answer) => answer,
            None => run.await,
        };
        // Chunks sent before the answer go before it.
        while let Ok(chunk) = chunks.try_recv() {
            send(&lines, chunk);
        }
        let _ = lines.send(line(&Frame::Result(answer)));
        if tail {
            while let Some(chunk) = chunks.recv().await {
                send(&lines, chunk);
            }
        }
    });
    streamed(body, cancel)
}

/// A run's answer: its record whole ([`WireExecution`]), as the result frame.
fn stream_run<F, Fut>(call: F) -> Response
where
    F: FnOnce(CancellationToken, OutputSink) -> Fut,
    Fut: Future<Output = ExecutionResult> + Send + 'static,
{
    stream_call(
        move |cancel, sink| {
            let run = call(cancel, sink);
            async move { WireExecution::from(run.await) }
        },
        false,
    )
}

async fn execute(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<ExecuteRequest>,
) -> Result<Response, Refusal> {
    granted.scope(request.session_id.as_deref())?;
    let api = Arc::clone(&agent.api);
    Ok(stream_run(move |cancel, sink| async move {
        api.execute(&granted.caller, request, cancel, Some(sink))
            .await
    }))
}

async fn run_command(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<RunCommand>,
) -> Result<Response, Refusal> {
    granted.scope(Some(&request.session_id))?;
    let api = Arc::clone(&agent.api);
    Ok(stream_run(move |cancel, sink| async move {
        api.run_command(&granted.caller, request, cancel, Some(sink))
            .await
    }))
}

async fn install_packages(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<InstallPackages>,
) -> Result<Response, Refusal> {
    granted.scope(Some(&request.session_id))?;
    let api = Arc::clone(&agent.api);
    // An install outlives its call by design: the client going away does not stop it.
    Ok(stream_call(
        move |_cancel, sink| async move {
            api.install_packages(&granted.caller, request, Some(sink))
                .await
        },
        true,
    ))
}

async fn create_session(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<CreateSession>,
) -> Result<Response, Refusal> {
    granted.scope(None)?;
    Ok(answer(
        &agent.api.create_session(&granted.caller, request).await,
    ))
}

async fn list_sessions(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
) -> Result<Response, Refusal> {
    granted.scope(None)?;
    Ok(answer(&agent.api.list_sessions(&granted.caller).await))
}

async fn delete_session(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<SessionRef>,
) -> Result<Response, Refusal> {
    granted.scope(Some(&request.session_id))?;
    Ok(answer(
        &agent
            .api
            .delete_session(&granted.caller, &request.session_id)
            .await,
    ))
}

async fn reset_session(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<SessionRef>,
) -> Result<Response, Refusal> {
    granted.scope(Some(&request.session_id))?;
    Ok(answer(
        &agent
            .api
            .reset_session(&granted.caller, &request.session_id)
            .await,
    ))
}

async fn list_packages(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<SessionRef>,
) -> Result<Response, Refusal> {
    granted.scope(Some(&request.session_id))?;
    Ok(answer(
        &agent
            .api
            .list_packages(&granted.caller, &request.session_id)
            .await,
    ))
}

async fn write_file(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<WriteFile>,
) -> Result<Response, Refusal> {
    granted.scope(Some(&request.session_id))?;
    Ok(answer(
        &agent.api.write_file(&granted.caller, request).await,
    ))
}

async fn read_file(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<ReadFile>,
) -> Result<Response, Refusal> {
    granted.scope(Some(&request.session_id))?;
    Ok(answer(&agent.api.read_file(&granted.caller, request).await))
}

async fn list_files(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<ListFiles>,
) -> Result<Response, Refusal> {
    granted.scope(Some(&request.session_id))?;
    Ok(answer(
        &agent.api.list_files(&granted.caller, request).await,
    ))
}

async fn validate(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<ValidateScript>,
) -> Result<Response, Refusal> {
    granted.scope(None)?;
    Ok(answer(&agent.api.validate(&granted.caller, request).await))
}

async fn report(State(agent): State<Arc<Agent>>, granted: Granted) -> Result<Response, Refusal> {
    granted.scope(None)?;
    Ok(answer(&agent.api.report_for(&granted.caller).await))
}

async fn list_runs(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(query): Json<RunQuery>,
) -> Result<Response, Refusal> {
    granted.scope(query.session_id.as_deref())?;
    Ok(answer(&agent.api.list_runs(&granted.caller, query).await))
}

async fn run_record(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(run): Json<RunRef>,
) -> Result<Response, Refusal> {
    granted.scope(None)?;
    Ok(answer(
        &agent
            .api
            .run_record(&granted.caller, &run.execution_id)
            .await,
    ))
}

async fn run_output(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(run): Json<RunRef>,
) -> Result<Response, Refusal> {
    granted.scope(None)?;
    Ok(answer(
        &agent
            .api
            .run_output(&granted.caller, &run.execution_id)
            .await,
    ))
}

async fn live_output(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(run): Json<RunRef>,
) -> Result<Response, Refusal> {
    granted.scope(None)?;
    Ok(answer(
        &agent
            .api
            .live_output(&granted.caller, &run.execution_id)
            .await,
    ))
}

async fn cancel_run(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(run): Json<RunRef>,
) -> Result<Response, Refusal> {
    granted.scope(None)?;
    Ok(answer(
        &agent
            .api
            .cancel_run(&granted.caller, &run.execution_id)
            .await,
    ))
}

async fn list_artifacts(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(limit): Json<ArtifactLimit>,
) -> Result<Response, Refusal> {
    granted.scope(None)?;
    Ok(answer(
        &agent.api.list_artifacts(&granted.caller, limit.limit).await,
    ))
}

async fn read_artifact(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(artifact): Json<ArtifactRef>,
) -> Result<Response, Refusal> {
    granted.scope(None)?;
    Ok(answer(
        &agent
            .api
            .read_artifact(&granted.caller, &artifact.uri)
            .await,
    ))
}

/// The head as the first line (`{"Ok": head}` or `{"Err": error}`), then the bytes.
async fn open_artifact(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(request): Json<OpenArtifact>,
) -> Result<Response, Refusal> {
    granted.scope(None)?;
    let (head, body) = match agent.api.open_artifact(&granted.caller, request).await {
        Ok(opened) => (Ok(opened.head), Some(opened.body)),
        Err(error) => (Err(error), None),
    };
    let first = line(&head);
    let first = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(first) });
    let body = match body {
        Some(body) => first.chain(tokio_util::io::ReaderStream::new(body)).boxed(),
        None => first.boxed(),
    };
    let mut response = Response::new(Body::from_stream(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

async fn audit_tool_call(
    State(agent): State<Arc<Agent>>,
    granted: Granted,
    Json(audit): Json<ToolCallAudit>,
) -> Result<Response, Refusal> {
    granted.scope(None)?;
    agent.api.audit_tool_call(&granted.caller, audit).await;
    Ok(answer(&()))
}

/// `/healthz`: the process answers, and says its name (what a front signs tokens for).
async fn healthz(State(agent): State<Arc<Agent>>) -> Response {
    answer(&serde_json::json!({"status": "ok", "agent": agent.check.agent()}))
}

/// `/readyz`: 200 when the engine can run code, else 503 with the reasons.
async fn readyz(State(agent): State<Arc<Agent>>) -> Response {
    let report = agent.host.report();
    let status = if report.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(serde_json::json!({
            "ready": report.ready,
            "problems": report.problems,
            "agent": agent.check.agent(),
        })),
    )
        .into_response()
}

/// `/metrics`: Prometheus text, after refreshing this process's gauges.
async fn scrape(State(agent): State<Arc<Agent>>) -> Response {
    let Some(render) = agent.metrics.clone() else {
        return (
            StatusCode::NOT_FOUND,
            "no metrics exporter in this process\n",
        )
            .into_response();
    };
    let host = Arc::clone(&agent.host);
    let text = tokio::task::spawn_blocking(move || {
        host.publish_gauges();
        render()
    })
    .await
    .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}
