//! The UI's pages and downloads: one handler per route, one askama template per page.
//!
//! Every handler starts from the request's session ([`Ui::session`]) and passes its
//! [`Caller`] to the engine, so another tenant's run, session or artifact is "not found"
//! exactly as one that never existed.

use std::collections::HashMap;
use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::Value;
use snakebox_engine::{Caller, RunKind, RunQuery, RunRecord, SessionInfo};

use super::Ui;
use super::auth::{NoSession, UiSession};
use super::format;
use crate::clients::{ClientConfig, configs};
use crate::edge::RequestAuthority;

/// Runs shown on the list.
const RUNS_LISTED: usize = 200;

pub(super) fn routes() -> Router<Arc<Ui>> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/runs") }))
        .route("/login", get(login_form).post(log_in))
        .route("/logout", axum::routing::post(log_out))
        .route("/runs", get(runs))
        .route("/runs/{id}", get(run))
        .route("/runs/{id}/cancel", axum::routing::post(run_cancel))
        .route("/runs/{id}/live", get(run_live))
        .route("/runs/{id}/download/{*path}", get(run_download))
        .route("/runs/{id}/image/{*path}", get(run_image))
        .route("/sessions", get(sessions))
        .route("/sessions/{id}", get(session))
        .route("/sessions/{id}/download/{*path}", get(session_download))
        .route(
            "/sessions/{id}/upload",
            axum::routing::post(session_upload).layer(axum::extract::DefaultBodyLimit::max(
                usize::try_from(snakebox_engine::MAX_FILE_BYTES).unwrap_or(usize::MAX) + 64 * 1024,
            )),
        )
        .route(
            "/sessions/{id}/delete",
            get(|ui, headers, id| session_confirm(ui, headers, id, Change::Delete)).post(
                |ui, headers, own, id, form| {
                    session_change(ui, headers, own, id, form, Change::Delete)
                },
            ),
        )
        .route(
            "/sessions/{id}/reset",
            get(|ui, headers, id| session_confirm(ui, headers, id, Change::Reset)).post(
                |ui, headers, own, id, form| {
                    session_change(ui, headers, own, id, form, Change::Reset)
                },
            ),
        )
        .route("/environment", get(environment))
        .route("/clients", get(clients))
        .route("/static/{file}", get(asset))
        .fallback(|| async {
            error_page(
                StatusCode::NOT_FOUND,
                "There is no such page",
                "start from the runs",
            )
        })
}

/// What every page of a logged-in tenant shows around its content.
#[derive(Debug, Clone)]
pub(super) struct Chrome {
    tenant: String,
    csrf: String,
    keyless: bool,
}

fn chrome(ui: &Ui, session: &UiSession) -> Option<Chrome> {
    Some(Chrome {
        tenant: session.caller.id().to_owned(),
        csrf: session.csrf.clone(),
        keyless: ui.sessions.keyless().unwrap_or(false),
    })
}

fn render(template: &impl Template) -> Response {
    match template.render() {
        Ok(html) => Html(html).into_response(),
        Err(err) => {
            tracing::error!(%err, "a UI template failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page could not be rendered\n",
            )
                .into_response()
        }
    }
}

#[derive(Template)]
#[template(path = "ui/error.html")]
struct ErrorPage<'a> {
    chrome: Option<Chrome>,
    status: String,
    message: &'a str,
    hint: &'a str,
}

/// A page that says what went wrong and what to do.
pub(super) fn error_page(status: StatusCode, message: &str, hint: &str) -> Response {
    let page = ErrorPage {
        chrome: None,
        status: status.to_string(),
        message,
        hint,
    };
    (status, render(&page)).into_response()
}

fn not_found(what: &str) -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        &format!("No {what} with this id"),
        "it may have been deleted or forgotten, or it belongs to another tenant",
    )
}

// --- Login ---------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "ui/login.html")]
struct LoginPage {
    chrome: Option<Chrome>,
    problem: Option<String>,
    /// No key exists and the edge serves the local tenant: a button logs in, no key asked.
    keyless: bool,
}

/// The error page of a login that could not be checked (the key store cannot be read).
pub(crate) fn unavailable(hint: &str) -> Response {
    error_page(
        StatusCode::SERVICE_UNAVAILABLE,
        "The server cannot check API keys right now",
        hint,
    )
}

/// The error page of a login that failed where it should not (the key store, or a session
/// that vanished as it was made).
fn not_logged_in(why: NoSession) -> Response {
    match why {
        NoSession::Unavailable(hint) => unavailable(&hint),
        NoSession::LogIn => unavailable("try again"),
    }
}

fn logged_in(ui: &Ui, id: &str) -> Response {
    let mut response = Redirect::to("/ui/runs").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, ui.sessions.set_cookie(id));
    response
}

/// `GET /ui/login`: the form. A GET changes nothing on the server: without any key (the
/// local tenant), the page offers a button that POSTs the login, never a session made here.
async fn login_form(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Response {
    if ui.sessions.get(&headers).is_ok() {
        return Redirect::to("/ui/runs").into_response();
    }
    match ui.sessions.keyless() {
        Ok(keyless) => render(&LoginPage {
            chrome: None,
            problem: None,
            keyless,
        }),
        Err(why) => not_logged_in(why),
    }
}

async fn log_in(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Extension(RequestAuthority(own)): Extension<RequestAuthority>,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    // No session yet, so no CSRF token: the Origin must be the server's own.
    if let Err(refused) = ui.check_post(&headers, &own, None, None) {
        return *refused;
    }
    let key = form.get("key").map_or("", String::as_str);
    // No key exists and the edge serves the local tenant: the button needs no key.
    if key.trim().is_empty() && matches!(ui.sessions.keyless(), Ok(true)) {
        return match ui.sessions.log_in_keyless() {
            Ok((_, id)) => logged_in(&ui, &id),
            Err(why) => not_logged_in(why),
        };
    }
    match ui.sessions.log_in(key) {
        Ok(Some((_, id))) => logged_in(&ui, &id),
        Ok(None) => (
            StatusCode::UNAUTHORIZED,
            render(&LoginPage {
                chrome: None,
                problem: Some(
                    "That key is not valid (wrong or revoked). Keys look like sbx_… and are printed once by `snakebox keys add`."
                        .into(),
                ),
                keyless: false,
            }),
        )
            .into_response(),
        Err(why) => not_logged_in(why),
    }
}

async fn log_out(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Extension(RequestAuthority(own)): Extension<RequestAuthority>,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    if let Err(refused) = ui.session_for_form(&headers, &own, &form) {
        return *refused;
    }
    ui.sessions.log_out(&headers);
    let mut response = Redirect::to("/ui/login").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, ui.sessions.clear_cookie());
    response
}

// --- Runs ------------------------------------------------------------------------------

struct RunRow {
    id: String,
    href: String,
    when: String,
    status: String,
    status_class: &'static str,
    kind: &'static str,
    duration: String,
    setup: String,
    python: String,
    dependencies: String,
    exit_code: String,
    session: Option<String>,
    summary: String,
}

fn status_class(status: &str) -> &'static str {
    match status {
        "ok" => "ok",
        "running" => "running",
        _ => "bad",
    }
}

fn run_row(record: &RunRecord) -> RunRow {
    RunRow {
        id: record.execution_id.clone(),
        href: format!("/ui/runs/{}", format::url_path(&record.execution_id)),
        when: format::utc_ms(record.started_at_ms),
        status: record.status.clone(),
        status_class: status_class(&record.status),
        kind: match record.kind {
            RunKind::Execute => "script",
            RunKind::SessionCell => "session cell",
            RunKind::Command => "command",
        },
        duration: format::duration(record.duration_ms),
        setup: format::duration(record.setup_ms),
        python: record.python_version.clone().unwrap_or_else(|| "—".into()),
        dependencies: if record.dependencies.is_empty() {
            "—".into()
        } else {
            record.dependencies.join(", ")
        },
        exit_code: record
            .exit_code
            .map_or_else(|| "—".into(), |code| code.to_string()),
        session: record.session_id.clone(),
        summary: format::summary(&record.script, 60),
    }
}

#[derive(Template)]
#[template(path = "ui/runs.html")]
struct RunsPage {
    chrome: Option<Chrome>,
    runs: Vec<RunRow>,
    refresh: bool,
    /// The link to the next (older) page, when this one is full.
    older: Option<String>,
}

/// `?before=ID`: the page of runs older than run ID.
#[derive(Deserialize)]
struct RunsPaging {
    before: Option<String>,
}

async fn runs(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(paging): Query<RunsPaging>,
) -> Response {
    let session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    let query = RunQuery {
        limit: RUNS_LISTED,
        before: paging.before.clone(),
        session_id: None,
    };
    let records = ui.engine.list_runs(&session.caller, query).await;
    let older = (records.len() == RUNS_LISTED)
        .then(|| records.last())
        .flatten()
        .map(|last| format!("/ui/runs?before={}", format::url_path(&last.execution_id)));
    let runs: Vec<RunRow> = records.iter().map(run_row).collect();
    // Only the newest page refreshes itself while something runs.
    let refresh = paging.before.is_none() && runs.iter().any(|run| run.status == "running");
    render(&RunsPage {
        chrome: chrome(&ui, &session),
        runs,
        refresh,
        older,
    })
}

struct ArtifactView {
    name: String,
    mime: String,
    size: String,
    download: String,
    image: Option<String>,
}

struct NetworkView {
    host: String,
    port: String,
    allowed: &'static str,
    reason: String,
    sent: String,
    received: String,
}

/// What a finished run returned, read from its kept result.
struct OutputView {
    stdout: String,
    stdout_truncated: bool,
    stderr: String,
    stderr_truncated: bool,
    /// Type and repr of the last expression's value.
    result: Option<(String, String)>,
    /// Type, message and traceback.
    exception: Option<(String, String, String)>,
    /// Message and hint.
    error: Option<(String, Option<String>)>,
    notes: Vec<String>,
    artifacts: Vec<ArtifactView>,
    network: Vec<NetworkView>,
    /// What it used (label, value), where the host measured it.
    usage: Vec<(&'static str, String)>,
    /// Security events (kind, detail).
    events: Vec<(String, String)>,
}

fn text(value: &Value, key: &str) -> String {
    value
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// MIME types shown inline (after their first bytes are checked): raster images only.
const INLINE_IMAGES: [&str; 3] = ["image/png", "image/jpeg", "image/gif"];

fn output_view(run_id: &str, output: &Value) -> OutputView {
    let base = format!("/ui/runs/{}", format::url_path(run_id));
    let prefix = format!("snakebox://artifacts/{run_id}/");
    let artifacts = output
        .get("artifacts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|artifact| {
            let uri = artifact.get("uri")?.as_str()?;
            let path = uri.strip_prefix(&prefix)?;
            let mime = text(artifact, "mime_type");
            let encoded = format::url_path(path);
            Some(ArtifactView {
                name: text(artifact, "name"),
                size: format::bytes(artifact.get("size").and_then(Value::as_u64).unwrap_or(0)),
                download: format!("{base}/download/{encoded}"),
                image: INLINE_IMAGES
                    .contains(&mime.as_str())
                    .then(|| format!("{base}/image/{encoded}")),
                mime,
            })
        })
        .collect();
    let network = output
        .get("network_log")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|entry| NetworkView {
            host: text(entry, "host"),
            port: entry
                .get("port")
                .and_then(Value::as_u64)
                .map_or_else(String::new, |port| port.to_string()),
            allowed: if entry.get("allowed").and_then(Value::as_bool) == Some(true) {
                "yes"
            } else {
                "no"
            },
            reason: text(entry, "reason"),
            sent: format::bytes(entry.get("bytes_sent").and_then(Value::as_u64).unwrap_or(0)),
            received: format::bytes(
                entry
                    .get("bytes_received")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
            ),
        })
        .collect();
    let flag = |key: &str| output.get(key).and_then(Value::as_bool) == Some(true);
    let measured = |key: &str| {
        output
            .get("resource_usage")
            .and_then(|usage| usage.get(key))
            .and_then(Value::as_u64)
    };
    let mut usage = Vec::new();
    if let Some(bytes) = measured("peak_memory_bytes") {
        usage.push(("Peak memory", format::bytes(bytes)));
    }
    if let Some(ms) = measured("cpu_time_ms") {
        usage.push(("CPU time", format::duration(Some(ms))));
    }
    if let Some(hits) = measured("process_limit_hits").filter(|&hits| hits > 0) {
        usage.push(("Processes refused at the limit", hits.to_string()));
    }
    let events = output
        .get("events")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|event| (text(event, "kind"), text(event, "detail")))
        .collect();
    OutputView {
        usage,
        events,
        stdout: text(output, "stdout"),
        stdout_truncated: flag("stdout_truncated"),
        stderr: text(output, "stderr"),
        stderr_truncated: flag("stderr_truncated"),
        result: output
            .get("result")
            .filter(|value| !value.is_null())
            .map(|value| (text(value, "type_name"), text(value, "repr"))),
        exception: output
            .get("exception")
            .filter(|value| !value.is_null())
            .map(|value| {
                (
                    text(value, "type_name"),
                    text(value, "message"),
                    text(value, "traceback"),
                )
            }),
        error: output
            .get("error")
            .filter(|value| !value.is_null())
            .map(|value| {
                (
                    text(value, "message"),
                    value.get("hint").and_then(Value::as_str).map(str::to_owned),
                )
            }),
        notes: output
            .get("notes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|note| note.as_str().map(str::to_owned))
            .collect(),
        artifacts,
        network,
    }
}

#[derive(Template)]
#[template(path = "ui/run.html")]
struct RunPage {
    chrome: Option<Chrome>,
    csrf: String,
    run: RunRow,
    /// The script, highlighted (class, text).
    script: Vec<super::highlight::Token>,
    script_truncated: bool,
    refresh: bool,
    output: Option<OutputView>,
}

async fn run(State(ui): State<Arc<Ui>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    let Ok(record) = ui.engine.run_record(&session.caller, &id).await else {
        return not_found("run");
    };
    let output = ui
        .engine
        .run_output(&session.caller, &id)
        .await
        .map(|output| output_view(&record.execution_id, &output));
    render(&RunPage {
        chrome: chrome(&ui, &session),
        csrf: session.csrf.clone(),
        refresh: record.status == "running",
        script: super::highlight::python(&record.script),
        script_truncated: record.script_truncated,
        run: run_row(&record),
        output,
    })
}

/// How often a live view looks for new output.
const LIVE_POLL: std::time::Duration = std::time::Duration::from_millis(250);
/// How often a live-output stream checks that its login still holds (a log-out, the
/// session's expiry; a revoked key ends it within [`crate::live::RECHECK`]).
const LIVE_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// A running run's output as Server-Sent Events: `output` events with what was printed since
/// the last one (`{"stdout": …, "stderr": …}`), then `end` once the run has ended (the page
/// then reloads to show its result); `gone` at once when it is not running here.
async fn run_live(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    if ui.engine.run_record(&session.caller, &id).await.is_err() {
        return not_found("run");
    }
    /// Where the stream is.
    struct Follow {
        ui: Arc<Ui>,
        headers: HeaderMap,
        caller: snakebox_engine::Caller,
        id: String,
        /// Stdout and stderr bytes sent so far.
        sent: (usize, usize),
        /// When the login was last checked.
        checked: std::time::Instant,
        /// Resolves when the login's key is revoked.
        revoked: crate::live::Revoked,
        first: bool,
        done: bool,
    }
    let revoked = ui.sessions.live().revoked(session.via);
    let follow = Follow {
        ui,
        headers,
        caller: session.caller,
        id,
        sent: (0, 0),
        checked: std::time::Instant::now(),
        revoked,
        first: true,
        done: false,
    };
    let events = futures_util::stream::unfold(follow, |mut follow| async move {
        if follow.done {
            return None;
        }
        loop {
            // A log-out or a revoked key ends the stream (the page reloads to the login).
            if follow.checked.elapsed() >= LIVE_RECHECK {
                follow.checked = std::time::Instant::now();
                let still = follow
                    .ui
                    .sessions
                    .get(&follow.headers)
                    .is_ok_and(|session| session.caller == follow.caller);
                if !still {
                    follow.done = true;
                    let event = Event::default().event("end").data("{}");
                    return Some((Ok::<Event, std::convert::Infallible>(event), follow));
                }
            }
            let Some(live) = follow
                .ui
                .engine
                .live_output(&follow.caller, &follow.id)
                .await
            else {
                let event = Event::default()
                    .event(if follow.first { "gone" } else { "end" })
                    .data("{}");
                follow.done = true;
                return Some((Ok(event), follow));
            };
            let (out, err) = follow.sent;
            let (new_out, new_err) = (
                live.stdout.get(out..).unwrap_or_default(),
                live.stderr.get(err..).unwrap_or_default(),
            );
            if !new_out.is_empty() || !new_err.is_empty() || follow.first {
                let data = serde_json::json!({
                    "stdout": new_out,
                    "stderr": new_err,
                    "truncated": live.truncated,
                });
                let event = Event::default().event("output").data(data.to_string());
                follow.sent = (live.stdout.len(), live.stderr.len());
                follow.first = false;
                return Some((Ok(event), follow));
            }
            // A revoked key ends the stream at once (within the live keys' recheck).
            let revoked = tokio::select! {
                () = tokio::time::sleep(LIVE_POLL) => false,
                () = &mut follow.revoked => true,
            };
            if revoked {
                follow.done = true;
                let event = Event::default().event("end").data("{}");
                return Some((Ok(event), follow));
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn run_cancel(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Extension(RequestAuthority(own)): Extension<RequestAuthority>,
    Path(id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let session = match ui.session_for_form(&headers, &own, &form) {
        Ok(session) => session,
        Err(refused) => return *refused,
    };
    match ui.engine.cancel_run(&session.caller, &id).await {
        Ok(()) => Redirect::to(&format!("/ui/runs/{}", format::url_path(&id))).into_response(),
        Err(err) => error_page(
            StatusCode::NOT_FOUND,
            &err.message,
            err.hint.as_deref().unwrap_or("list the runs"),
        ),
    }
}

/// Bytes a run or session produced, as a download that is never rendered in the UI's origin.
fn download(name: &str, data: Vec<u8>) -> Response {
    let mut response = data.into_response();
    crate::download::attachment_headers(response.headers_mut(), name, "application/octet-stream");
    response
}

async fn read_artifact(
    ui: &Ui,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Option<snakebox_engine::ArtifactContent> {
    let uri = format!("snakebox://artifacts/{id}/{path}");
    ui.engine.read_artifact(caller, &uri).await.ok()
}

async fn run_download(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path((id, path)): Path<(String, String)>,
) -> Response {
    let session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    match read_artifact(&ui, &session.caller, &id, &path).await {
        Some(artifact) => download(&artifact.name, artifact.data),
        None => not_found("artifact"),
    }
}

/// The raster image type of `data`, by its first bytes (PNG, JPEG, GIF, WebP: never SVG).
fn raster_type(data: &[u8]) -> Option<&'static str> {
    // No file name: an SVG is never recognised, whatever it is called.
    snakebox_engine::image_mime(data, "")
}

async fn run_image(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path((id, path)): Path<(String, String)>,
) -> Response {
    let session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    let Some(artifact) = read_artifact(&ui, &session.caller, &id, &path).await else {
        return not_found("artifact");
    };
    // Only what is really a PNG, JPEG or GIF is shown; anything else (SVG, HTML) is a
    // download, whatever its name or declared type.
    match raster_type(&artifact.data) {
        Some(mime) => (
            [
                (header::CONTENT_TYPE, HeaderValue::from_static(mime)),
                (
                    header::CONTENT_SECURITY_POLICY,
                    HeaderValue::from_static("sandbox; default-src 'none'"),
                ),
            ],
            artifact.data,
        )
            .into_response(),
        None => error_page(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "This artifact is not a PNG, JPEG or GIF image, so it is not shown in the page",
            "download it from the run's page",
        ),
    }
}

// --- Sessions --------------------------------------------------------------------------

struct SessionRow {
    id: String,
    href: String,
    name: String,
    python: String,
    packages: String,
    size: String,
    running: bool,
    last_used: String,
}

fn session_row(info: &SessionInfo) -> SessionRow {
    SessionRow {
        id: info.session_id.clone(),
        href: format!("/ui/sessions/{}", format::url_path(&info.session_id)),
        name: info
            .name
            .clone()
            .unwrap_or_else(|| info.session_id.chars().take(12).collect()),
        python: info.python_version.clone(),
        packages: if info.requested_packages.is_empty() {
            "—".into()
        } else {
            info.requested_packages.join(", ")
        },
        size: format::bytes(info.size_bytes),
        running: info.interpreter_running,
        last_used: format::utc_secs(info.last_used_at),
    }
}

#[derive(Template)]
#[template(path = "ui/sessions.html")]
struct SessionsPage {
    chrome: Option<Chrome>,
    sessions: Vec<SessionRow>,
    problem: Option<String>,
}

async fn sessions(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Response {
    let session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    let (sessions, problem) = match ui.engine.list_sessions(&session.caller).await {
        Ok(list) => (list.sessions.iter().map(session_row).collect(), None),
        Err(err) => (Vec::new(), Some(err.to_string())),
    };
    render(&SessionsPage {
        chrome: chrome(&ui, &session),
        sessions,
        problem,
    })
}

async fn find_session(ui: &Ui, caller: &Caller, id: &str) -> Option<SessionInfo> {
    let list = ui.engine.list_sessions(caller).await.ok()?;
    list.sessions.into_iter().find(|s| s.session_id == id)
}

struct FileRow {
    path: String,
    kind: String,
    size: String,
    download: Option<String>,
}

#[derive(Template)]
#[template(path = "ui/session.html")]
struct SessionPage {
    chrome: Option<Chrome>,
    csrf: String,
    session: SessionRow,
    installed: String,
    executions: u64,
    network: String,
    created: String,
    files: Vec<FileRow>,
    files_truncated: bool,
    /// Its cells and commands among the tenant's newest runs, newest first.
    cells: Vec<RunRow>,
    /// The last install: its state, what it asked for, why it failed, the end of uv's log.
    install: Option<InstallView>,
}

struct InstallView {
    state: &'static str,
    requested: String,
    when: String,
    error: Option<String>,
    log_tail: String,
    running: bool,
}

fn install_view(status: &snakebox_engine::InstallStatus) -> Option<InstallView> {
    use snakebox_engine::InstallState;
    let state = match status.state {
        InstallState::None => return None,
        InstallState::Running => "running",
        InstallState::Succeeded => "succeeded",
        InstallState::Failed => "failed",
    };
    Some(InstallView {
        state,
        requested: status.requested.join(", "),
        when: match (status.started_at, status.finished_at) {
            (_, Some(end)) => format!("finished {}", format::utc_secs(end)),
            (Some(start), None) => format!("started {}", format::utc_secs(start)),
            (None, None) => String::new(),
        },
        error: status.error.as_ref().map(|error| match &error.hint {
            Some(hint) => format!("{} (hint: {hint})", error.message),
            None => error.message.clone(),
        }),
        log_tail: status.log_tail.clone(),
        running: state == "running",
    })
}

async fn session(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let ui_session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    let Some(info) = find_session(&ui, &ui_session.caller, &id).await else {
        return not_found("session");
    };
    let row = session_row(&info);
    let (files, files_truncated) = match ui
        .engine
        .list_files(
            &ui_session.caller,
            snakebox_engine::ListFiles {
                session_id: id.clone(),
                path: String::new(),
                depth: 10,
            },
        )
        .await
    {
        Ok(list) => (
            list.entries
                .iter()
                .map(|entry| FileRow {
                    download: (entry.kind == "file").then(|| {
                        format!("{}/download/{}", row.href, format::url_path(&entry.path))
                    }),
                    path: entry.path.clone(),
                    kind: entry.kind.clone(),
                    size: format::bytes(entry.size),
                })
                .collect(),
            list.truncated,
        ),
        Err(_) => (Vec::new(), false),
    };
    let installed = if info.packages.is_empty() {
        "—".into()
    } else {
        info.packages
            .iter()
            .map(|p| format!("{}=={}", p.name, p.version))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let network = match (info.network, info.allowed_domains.is_empty()) {
        (false, _) => "off".to_owned(),
        (true, true) => "the server's policy".to_owned(),
        (true, false) => format!("only {}", info.allowed_domains.join(", ")),
    };
    let query = RunQuery {
        limit: RUNS_LISTED,
        before: None,
        session_id: Some(info.session_id.clone()),
    };
    let cells = ui
        .engine
        .list_runs(&ui_session.caller, query)
        .await
        .iter()
        .map(run_row)
        .collect();
    let install = ui
        .engine
        .list_packages(&ui_session.caller, &id)
        .await
        .ok()
        .and_then(|list| install_view(&list.install));
    render(&SessionPage {
        install,
        chrome: chrome(&ui, &ui_session),
        csrf: ui_session.csrf.clone(),
        cells,
        installed,
        executions: info.executions,
        network,
        created: format::utc_secs(info.created_at),
        session: row,
        files,
        files_truncated,
    })
}

async fn session_download(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path((id, path)): Path<(String, String)>,
) -> Response {
    let session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    let Ok(file) = ui
        .engine
        .read_file(
            &session.caller,
            snakebox_engine::ReadFile {
                session_id: id.clone(),
                path: path.clone(),
            },
        )
        .await
    else {
        return not_found("file");
    };
    let data = if file.encoding == "base64" {
        use base64::Engine as _;
        match base64::engine::general_purpose::STANDARD.decode(file.content.as_bytes()) {
            Ok(data) => data,
            Err(_) => return not_found("file"),
        }
    } else {
        file.content.into_bytes()
    };
    download(&path, data)
}

/// A file uploaded into a session's workspace (a multipart form: `csrf`, `file`, and
/// optionally `path`, where to put it; else the file's own name).
async fn session_upload(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Extension(RequestAuthority(own)): Extension<RequestAuthority>,
    Path(id): Path<String>,
    mut multipart: axum::extract::Multipart,
) -> Response {
    let session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    // The Origin first, before the body is read.
    if let Err(refused) = ui.check_post(&headers, &own, None, None) {
        return *refused;
    }
    let (mut csrf, mut path, mut file) = (None, None, None);
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(err) => {
                return error_page(
                    err.status(),
                    &format!("The upload could not be read: {}", err.body_text()),
                    "upload one file of at most 10 MiB",
                );
            }
        };
        let name = field.name().unwrap_or_default().to_owned();
        let file_name = field.file_name().map(str::to_owned);
        let Ok(bytes) = field.bytes().await else {
            return error_page(
                StatusCode::BAD_REQUEST,
                "The upload could not be read",
                "upload one file of at most 10 MiB",
            );
        };
        match name.as_str() {
            "csrf" => csrf = Some(String::from_utf8_lossy(&bytes).into_owned()),
            "path" => path = Some(String::from_utf8_lossy(&bytes).trim().to_owned()),
            "file" => file = Some((file_name.unwrap_or_default(), bytes)),
            _ => {}
        }
    }
    if let Err(refused) = ui.check_post(&headers, &own, Some(&session), csrf.as_deref()) {
        return *refused;
    }
    let Some((file_name, bytes)) = file else {
        return error_page(
            StatusCode::BAD_REQUEST,
            "The form carried no file",
            "choose a file to upload",
        );
    };
    let target = path.filter(|path| !path.is_empty()).unwrap_or(file_name);
    let content = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(&bytes)
    };
    match ui
        .engine
        .write_file(
            &session.caller,
            snakebox_engine::WriteFile {
                session_id: id.clone(),
                path: target.to_string(),
                content,
                encoding: Some("base64".into()),
            },
        )
        .await
    {
        Ok(_) => Redirect::to(&format!("/ui/sessions/{}", format::url_path(&id))).into_response(),
        Err(err) if err.kind == snakebox_engine::ErrorKind::NotFound => not_found("session"),
        Err(err) => error_page(
            StatusCode::BAD_REQUEST,
            &err.message,
            err.hint.as_deref().unwrap_or("try again"),
        ),
    }
}

/// What a confirmed POST does to a session.
#[derive(Debug, Clone, Copy)]
enum Change {
    Delete,
    Reset,
}

impl Change {
    fn action(self) -> &'static str {
        match self {
            Change::Delete => "delete",
            Change::Reset => "reset",
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Change::Delete => "Delete",
            Change::Reset => "Reset",
        }
    }

    fn explanation(self) -> &'static str {
        match self {
            Change::Delete => {
                "Its interpreter is stopped (a call running in it ends now), and its files and packages are removed. This cannot be undone."
            }
            Change::Reset => {
                "It goes back to how it was created: a new interpreter (variables are lost; a call running in it ends now), an empty workspace, only the packages given at creation. Its id stays."
            }
        }
    }
}

#[derive(Template)]
#[template(path = "ui/session_confirm.html")]
struct ConfirmPage {
    chrome: Option<Chrome>,
    name: String,
    href: String,
    csrf: String,
    action: &'static str,
    verb: &'static str,
    explanation: &'static str,
}

async fn session_confirm(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    change: Change,
) -> Response {
    let session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    let Some(info) = find_session(&ui, &session.caller, &id).await else {
        return not_found("session");
    };
    let row = session_row(&info);
    render(&ConfirmPage {
        chrome: chrome(&ui, &session),
        csrf: session.csrf.clone(),
        name: row.name,
        href: row.href,
        action: change.action(),
        verb: change.verb(),
        explanation: change.explanation(),
    })
}

async fn session_change(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Extension(RequestAuthority(own)): Extension<RequestAuthority>,
    Path(id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
    change: Change,
) -> Response {
    let session = match ui.session_for_form(&headers, &own, &form) {
        Ok(session) => session,
        Err(refused) => return *refused,
    };
    let done = match change {
        Change::Delete => ui
            .engine
            .delete_session(&session.caller, &id)
            .await
            .map(|()| "/ui/sessions".to_owned()),
        Change::Reset => ui
            .engine
            .reset_session(&session.caller, &id)
            .await
            .map(|_| format!("/ui/sessions/{}", format::url_path(&id))),
    };
    match done {
        Ok(to) => Redirect::to(&to).into_response(),
        Err(err) if err.kind == snakebox_engine::ErrorKind::NotFound => not_found("session"),
        Err(err) => error_page(
            StatusCode::INTERNAL_SERVER_ERROR,
            &err.message,
            err.hint.as_deref().unwrap_or("try again"),
        ),
    }
}

// --- Environment and clients -----------------------------------------------------------

struct Section {
    title: &'static str,
    rows: Vec<(String, String)>,
}

/// The fields of a serialized record as rows (nested values as compact JSON).
fn rows_of(value: &impl serde::Serialize) -> Vec<(String, String)> {
    let Ok(Value::Object(map)) = serde_json::to_value(value) else {
        return Vec::new();
    };
    map.into_iter()
        .map(|(key, value)| {
            let shown = match value {
                Value::String(text) => text,
                Value::Null => "—".into(),
                other => other.to_string(),
            };
            (key.replace('_', " "), shown)
        })
        .collect()
}

#[derive(Template)]
#[template(path = "ui/environment.html")]
struct EnvironmentPage {
    chrome: Option<Chrome>,
    ready: bool,
    problems: Vec<String>,
    sections: Vec<Section>,
    limits: Vec<snakebox_engine::LimitStatus>,
    pythons: Vec<snakebox_engine::InterpreterReport>,
}

async fn environment(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Response {
    let session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    let report = ui.engine.report_for(&session.caller).await;
    let yes_no = |flag: bool| if flag { "yes" } else { "no" }.to_owned();
    let sandbox = {
        let mut rows = vec![
            ("backend".to_owned(), report.sandbox_backend.clone()),
            (
                "isolation active".to_owned(),
                yes_no(report.isolation_active),
            ),
        ];
        rows.extend(
            report
                .sandbox_details
                .iter()
                .map(|detail| ("detail".to_owned(), detail.clone())),
        );
        if let Some(hint) = &report.sandbox_hint {
            rows.push(("hint".into(), hint.clone()));
        }
        rows
    };
    let mut server = vec![
        ("snakebox".to_owned(), report.snakebox_version.clone()),
        ("platform".to_owned(), report.platform.clone()),
        ("uv".to_owned(), report.uv.clone()),
        ("default Python".to_owned(), report.default_python.clone()),
        ("timeouts".to_owned(), report.timeouts.clone()),
    ];
    if let Some(hint) = &report.uv_hint {
        server.push(("uv hint".into(), hint.clone()));
    }
    let sections = vec![
        Section {
            title: "Server",
            rows: server,
        },
        Section {
            title: "Sandbox",
            rows: sandbox,
        },
        Section {
            title: "Network",
            rows: vec![
                ("allowed".into(), yes_no(report.network)),
                ("policy".into(), report.network_policy.clone()),
                ("enforcement".into(), report.network_enforcement.clone()),
            ],
        },
        Section {
            title: "Environment cache",
            rows: rows_of(&report.cache),
        },
        Section {
            title: "Artifacts",
            rows: rows_of(&report.artifacts),
        },
        Section {
            title: "Sessions",
            // The report lists every tenant's sessions; a tenant sees only the counts here
            // (its own sessions are on the sessions page).
            rows: rows_of(&report.sessions)
                .into_iter()
                .filter(|(key, _)| key != "sessions")
                .collect(),
        },
        Section {
            title: "Warm pool",
            rows: rows_of(&report.warm_pool),
        },
    ];
    render(&EnvironmentPage {
        chrome: chrome(&ui, &session),
        ready: report.ready,
        problems: report.problems.clone(),
        sections,
        limits: report.limits.clone(),
        pythons: report.pythons.clone(),
    })
}

#[derive(Template)]
#[template(path = "ui/clients.html")]
struct ClientsPage {
    chrome: Option<Chrome>,
    base: String,
    keyed: bool,
    clients: Vec<ClientConfig>,
}

async fn clients(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Extension(RequestAuthority(own)): Extension<RequestAuthority>,
) -> Response {
    let session = match ui.session(&headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    let base = ui.base_url(&own);
    let keyed = !ui.sessions.keyless().unwrap_or(false);
    render(&ClientsPage {
        chrome: chrome(&ui, &session),
        clients: configs(&base, keyed),
        base,
        keyed,
    })
}

// --- Static files ----------------------------------------------------------------------

const CSS: &str = include_str!("../../static/ui.css");
const JS: &str = include_str!("../../static/ui.js");
const ICON: &str = include_str!("../../static/icon.svg");

async fn asset(Path(file): Path<String>) -> Response {
    let (mime, body) = match file.as_str() {
        "ui.css" => ("text/css; charset=utf-8", CSS),
        "ui.js" => ("text/javascript; charset=utf-8", JS),
        "icon.svg" => ("image/svg+xml", ICON),
        _ => {
            return error_page(
                StatusCode::NOT_FOUND,
                "There is no such file",
                "start from the runs",
            );
        }
    };
    (
        [
            (header::CONTENT_TYPE, mime),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_raster_images_are_recognised() {
        assert_eq!(raster_type(b"\x89PNG\r\n\x1a\nrest"), Some("image/png"));
        assert_eq!(raster_type(b"GIF89a..."), Some("image/gif"));
        assert_eq!(raster_type(&[0xff, 0xd8, 0xff, 0xe0]), Some("image/jpeg"));
        assert_eq!(
            raster_type(b"<svg xmlns='http://www.w3.org/2000/svg'/>"),
            None
        );
        assert_eq!(raster_type(b"<html>"), None);
    }

    /// Template snapshots: each page rendered from fixed data, so a change to what a page
    /// shows (or to how it escapes) is a reviewed diff.
    mod snapshots {
        use super::*;

        fn chrome() -> Option<Chrome> {
            Some(Chrome {
                tenant: "team-a".into(),
                csrf: "c0ffee".into(),
                keyless: false,
            })
        }

        fn record(id: &str, status: &str, script: &str) -> RunRecord {
            RunRecord {
                execution_id: id.into(),
                kind: RunKind::Execute,
                session_id: None,
                started_at_ms: 1_700_000_000_000,
                status: status.into(),
                duration_ms: (status != "running").then_some(1234),
                setup_ms: Some(56),
                exit_code: (status != "running").then_some(1),
                python_version: Some("3.12.7".into()),
                dependencies: vec!["numpy==2.1.0".into()],
                script: script.into(),
                script_truncated: false,
                script_bytes: Some(script.len() as u64),
                script_sha256: None,
            }
        }

        fn session_info() -> SessionInfo {
            SessionInfo {
                session_id: "s-0123".into(),
                name: Some("analysis <1>".into()),
                python_version: "3.12.7".into(),
                created_at: 1_700_000_000,
                last_used_at: 1_700_000_600,
                requested_packages: vec!["pandas".into()],
                packages: vec![],
                size_bytes: 123_456,
                interpreter_running: true,
                network: false,
                allowed_domains: vec![],
                executions: 3,
                profile: "standard".into(),
            }
        }

        #[test]
        fn login_page() {
            insta::assert_snapshot!(
                LoginPage {
                    chrome: None,
                    problem: Some("That key is not valid".into()),
                    keyless: false,
                }
                .render()
                .unwrap()
            );
        }

        #[test]
        fn runs_page() {
            let runs = vec![
                run_row(&record("r2", "running", "import time\ntime.sleep(9)")),
                run_row(&record("r1", "error", "# setup\nprint('<b>hi</b>')")),
            ];
            insta::assert_snapshot!(
                RunsPage {
                    chrome: chrome(),
                    runs,
                    refresh: true,
                    older: Some("/ui/runs?before=r1".into()),
                }
                .render()
                .unwrap()
            );
        }

        #[test]
        fn finished_run_page() {
            let output = serde_json::json!({
                "stdout": "<script>alert(1)</script>\n",
                "stderr": "warning\n",
                "result": {"type_name": "int", "repr": "42"},
                "exception": {"type_name": "ZeroDivisionError", "message": "division by zero",
                              "traceback": "Traceback (most recent call last):\n  File \"<script>\", line 1\n"},
                "error": {"message": "The script raised", "hint": "read the traceback"},
                "notes": ["a note"],
                "artifacts": [
                    {"name": "plot.png", "size": 2048, "mime_type": "image/png",
                     "uri": "snakebox://artifacts/r1/plot.png"},
                    {"name": "out dir/page.svg", "size": 71, "mime_type": "image/svg+xml",
                     "uri": "snakebox://artifacts/r1/out dir/page.svg"},
                ],
                "network_log": [{"host": "data.example.org", "port": 443, "allowed": true,
                                 "reason": "allowed by policy", "bytes_sent": 10, "bytes_received": 2048}],
                "resource_usage": {"peak_memory_bytes": 52428800, "cpu_time_ms": null,
                                   "process_limit_hits": 3},
                "events": [{"kind": "process_limit",
                            "detail": "3 new process(es) or thread(s) were refused at the process limit (EAGAIN)"}],
            });
            insta::assert_snapshot!(
                RunPage {
                    chrome: chrome(),
                    csrf: "c0ffee".into(),
                    run: run_row(&record("r1", "error", "print(1/0)")),
                    script: crate::ui::highlight::python("print(1/0)"),
                    script_truncated: false,
                    refresh: false,
                    output: Some(output_view("r1", &output)),
                }
                .render()
                .unwrap()
            );
        }

        #[test]
        fn running_run_page() {
            insta::assert_snapshot!(
                RunPage {
                    chrome: chrome(),
                    csrf: "c0ffee".into(),
                    run: run_row(&record("r2", "running", "import time")),
                    script: crate::ui::highlight::python("import time"),
                    script_truncated: true,
                    refresh: true,
                    output: None,
                }
                .render()
                .unwrap()
            );
        }

        #[test]
        fn sessions_and_session_pages() {
            let info = session_info();
            insta::assert_snapshot!(
                "sessions",
                SessionsPage {
                    chrome: chrome(),
                    sessions: vec![session_row(&info)],
                    problem: None,
                }
                .render()
                .unwrap()
            );
            insta::assert_snapshot!(
                "session",
                SessionPage {
                    chrome: chrome(),
                    csrf: "c0ffee".into(),
                    session: session_row(&info),
                    installed: "pandas==2.2.3".into(),
                    executions: 3,
                    network: "off".into(),
                    created: format::utc_secs(info.created_at),
                    files: vec![FileRow {
                        path: "data/in.csv".into(),
                        kind: "file".into(),
                        size: "10 B".into(),
                        download: Some("/ui/sessions/s-0123/download/data/in.csv".into()),
                    }],
                    files_truncated: false,
                    cells: vec![run_row(&record("r3", "ok", "x = 1"))],
                    install: Some(InstallView {
                        state: "running",
                        requested: "pandas".into(),
                        when: "started 2023-11-14 22:13:20".into(),
                        error: None,
                        log_tail: "Resolved 6 packages".into(),
                        running: true,
                    }),
                }
                .render()
                .unwrap()
            );
            insta::assert_snapshot!(
                "session_delete",
                ConfirmPage {
                    chrome: chrome(),
                    name: "analysis <1>".into(),
                    href: "/ui/sessions/s-0123".into(),
                    csrf: "c0ffee".into(),
                    action: Change::Delete.action(),
                    verb: Change::Delete.verb(),
                    explanation: Change::Delete.explanation(),
                }
                .render()
                .unwrap()
            );
        }

        #[test]
        fn clients_page() {
            insta::assert_snapshot!(
                ClientsPage {
                    chrome: chrome(),
                    base: "https://snakebox.example.com".into(),
                    keyed: true,
                    clients: configs("https://snakebox.example.com", true),
                }
                .render()
                .unwrap()
            );
        }
    }

    #[test]
    fn output_is_escaped_in_pages() {
        let page = ErrorPage {
            chrome: None,
            status: "404".into(),
            message: "<script>alert(1)</script>",
            hint: "\"><img src=x>",
        };
        let html = page.render().unwrap();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&#60;script&#62;"), "{html}");
        assert!(!html.contains("<img src=x>"), "{html}");
    }
}
