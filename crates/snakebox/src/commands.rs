//! The subcommands: `serve` (stdio or HTTP), `run`, `check`, `keys`, `audit`, `python install`.
#![allow(clippy::print_stdout, clippy::print_stderr)] // The CLI's job is to print.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use snakebox_engine::{
    Engine, EngineHandle, EnvironmentReport, ExecuteRequest, Status, StopReason,
};
use tokio_util::sync::CancellationToken;

use crate::cli::{
    AgentArgs, AuditArgs, CheckArgs, ClientConfigArgs, ImageAction, ImageArgs, KeysAction,
    KeysArgs, PythonAction, PythonCommandArgs, RunArgs, ServeArgs,
};
use crate::settings;

/// How long calls in flight get to return their (cancelled) records when the server stops.
const DRAIN: Duration = Duration::from_secs(10);

/// The bound on the whole teardown after the drain; past it, what is left is forced.
const TEARDOWN: Duration = Duration::from_secs(20);

/// Print an error and its causes, with `hint:` lines, to stderr.
pub(crate) fn report_error(err: &anyhow::Error) {
    eprintln!("error: {err:#}");
}

/// `snakebox serve`: MCP over stdio, until the client closes stdin or SIGTERM/SIGINT.
///
/// Stopping is clean and bounded either way (see [`snakebox_engine::Engine::shutdown`]): calls
/// in flight are answered `cancelled`, new ones refused, then sandboxes, fork servers, mounts,
/// cgroups and run directories are released. A second signal skips the wait and forces the
/// release. Exit code 0 (a stop asked for is not a failure); 2 when serving failed.
pub(crate) async fn serve(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let (mut settings, http, front) = settings::resolve_serve(args)?;
    // The front's key is read before anything starts: a key that cannot sign is said now.
    let front = match front {
        Some(front) => Some(Front {
            key: Arc::new(
                snakebox_wire::FrontKey::load(&front.front_key)
                    .map_err(|err| with_hint(&err, err.hint()))?,
            ),
            directory: front.directory,
        }),
        None => None,
    };
    if front.is_some() {
        front_engine(&mut settings.engine);
    }
    if let Some(http) = http {
        return serve_http(settings.engine, http, front).await;
    }
    reach_database(&settings.engine).await?;
    let engine = Engine::start(settings.engine).await;
    fail_on_unreachable_database(&engine)?;
    if front.is_none() {
        fail_on_bad_default_python(&engine).await?;
    }
    let report = engine.report();
    if report.ready || front.is_some() {
        tracing::info!(
            backend = %report.sandbox_backend,
            isolation = report.isolation_active,
            data_dir = %report.cache.location,
            "snakebox {} serving MCP on stdio",
            report.snakebox_version
        );
    } else {
        for problem in &report.problems {
            tracing::error!("executions are refused until this is fixed: {problem}");
        }
    }
    release_startup_pages();
    // The face gets the engine as an `EngineHandle`: its API for tenants' calls, and this
    // process's own matters (settings, stopping).
    let served = snakebox_server::serve_stdio(
        handle(&engine, front.as_ref()).await?,
        stop_signal(),
        DRAIN,
        settings.max_frame_bytes,
    )
    .await;
    let reason = served
        .as_ref()
        .map_or(StopReason::InputClosed, |reason| *reason);
    release(&engine, reason, DRAIN, DRAIN + TEARDOWN).await;
    served?;
    Ok(ExitCode::SUCCESS)
}

/// `snakebox serve --http`: MCP over streamable HTTP until SIGTERM/SIGINT, stopped as cleanly
/// as stdio: calls in flight are answered `cancelled`, then the listener closes and the engine
/// releases the host.
async fn serve_http(
    config: snakebox_engine::EngineConfig,
    http: snakebox_http::HttpConfig,
    front: Option<Front>,
) -> anyhow::Result<ExitCode> {
    reach_database(&config).await?;
    let engine = Engine::start(config).await;
    fail_on_unreachable_database(&engine)?;
    if front.is_none() {
        fail_on_bad_default_python(&engine).await?;
    }
    let report = engine.report();
    if !report.ready && front.is_none() {
        for problem in &report.problems {
            tracing::error!("executions are refused until this is fixed: {problem}");
        }
    }
    release_startup_pages();
    let stop = CancellationToken::new();
    let served = handle(&engine, front.as_ref()).await?;
    // A front's calls in flight are its Routed engine's, not this process's engine's.
    let host = Arc::clone(served.host());
    let mut serving = tokio::spawn({
        let stop = stop.clone();
        async move { snakebox_http::serve(served, &http, stop).await }
    });
    let reason = tokio::select! {
        reason = stop_signal() => reason,
        served = &mut serving => {
            // It stopped by itself: it could not start (an address in use, no keys).
            engine.shutdown(StopReason::Requested, Duration::ZERO).await;
            let error = match served {
                Ok(Ok(())) => anyhow::anyhow!("the HTTP server stopped by itself"),
                Ok(Err(err)) => {
                    let hint = err.hint();
                    with_hint(&err, &hint)
                }
                Err(join) => anyhow::anyhow!(join).context("the HTTP server failed"),
            };
            return Err(error);
        }
    };
    host.begin_shutdown(reason);
    let cut_short = host.wait_idle(DRAIN).await;
    if cut_short > 0 {
        tracing::warn!(cut_short, "calls still running after the drain deadline");
    }
    // Their replies are written: close the listener and the connections.
    stop.cancel();
    if tokio::time::timeout(DRAIN, &mut serving).await.is_err() {
        serving.abort();
    }
    release(&engine, reason, Duration::ZERO, TEARDOWN).await;
    Ok(ExitCode::SUCCESS)
}

/// Where a front's engine agents are (`serve --agents`, `--directory kubernetes`) and the key
/// it signs their calls with.
struct Front {
    directory: settings::DirectorySettings,
    key: Arc<snakebox_wire::FrontKey>,
}

/// A front's own engine runs nothing (every call goes to an agent): no warm pool, no fork
/// server, no environment built at start.
fn front_engine(config: &mut snakebox_engine::EngineConfig) {
    config.warm_pool = 0;
    config.fork_server = false;
    config.prefork = 0;
    config.warm_cache = false;
}

/// What the faces get: this process's engine, with its calls going to the agents when this
/// process is a front ([`snakebox_wire::Routed`] over a static directory). The process's own
/// matters (settings, readiness, stopping) stay this process's.
async fn handle(engine: &Arc<Engine>, front: Option<&Front>) -> anyhow::Result<EngineHandle> {
    let handle = EngineHandle::from(Arc::clone(engine));
    let Some(front) = front else {
        return Ok(handle);
    };
    let host = Arc::clone(handle.host());
    let directory: Arc<dyn snakebox_wire::Directory> = match &front.directory {
        settings::DirectorySettings::Static(agents) => {
            let remotes = agents
                .iter()
                .map(|(name, url)| {
                    snakebox_wire::RemoteEngine::new(
                        name,
                        url,
                        Arc::clone(&front.key),
                        Arc::clone(&host),
                    )
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(engine_error)?;
            let names: Vec<String> = agents
                .iter()
                .map(|(name, url)| format!("{name}={url}"))
                .collect();
            tracing::info!(agents = %names.join(","), "calls go to the engine agents");
            Arc::new(snakebox_wire::StaticDirectory::new(remotes).map_err(engine_error)?)
        }
        settings::DirectorySettings::Kubernetes(kube) => {
            let config = host.config();
            let mut settings = snakebox_kube::KubernetesSettings::new(
                &config.profiles.default,
                config.python_version.as_deref().unwrap_or("default"),
            );
            settings.namespace.clone_from(&kube.namespace);
            settings.agent_port = kube.agent_port;
            settings.ready_timeout = kube.ready_timeout;
            settings.runner_idle_ttl = kube.runner_idle_ttl;
            settings.max_claim_age = kube.claim_max_age;
            snakebox_kube::KubernetesDirectory::connect(
                settings,
                Arc::clone(&front.key),
                Arc::clone(&host),
            )
            .await
            .map_err(engine_error)?
        }
    };
    let routed = Arc::new(snakebox_wire::Routed::new(directory, host));
    routed.watch_readiness().await;
    let report = snakebox_engine::EngineHost::report(routed.as_ref());
    for problem in &report.problems {
        tracing::warn!("{problem}");
    }
    Ok(EngineHandle::new(Arc::clone(&routed) as _, routed))
}

/// An engine error with its hint, for the command line.
fn engine_error(err: snakebox_engine::EngineError) -> anyhow::Error {
    match err.hint {
        Some(hint) => anyhow::anyhow!("{}\nhint: {hint}", err.message),
        None => anyhow::anyhow!("{}", err.message),
    }
}

/// `snakebox agent`: the engine served to fronts over the internal HTTP API until
/// SIGTERM/SIGINT, stopped as `serve --http` is (calls in flight answered `cancelled`).
pub(crate) async fn agent(args: &AgentArgs) -> anyhow::Result<ExitCode> {
    let (settings, addr, name) = settings::resolve_agent(args)?;
    let check = snakebox_wire::AgentCheck::load(&args.front_public_key, &name)
        .map_err(|err| with_hint(&err, err.hint()))?;
    // Installed before anything records, so the first run is counted.
    let _ = snakebox_http::render_metrics();
    let engine = Engine::start(settings.engine).await;
    fail_on_bad_default_python(&engine).await?;
    let report = engine.report();
    if !report.ready {
        for problem in &report.problems {
            tracing::error!("executions are refused until this is fixed: {problem}");
        }
    }
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(err) => {
            engine.shutdown(StopReason::Requested, Duration::ZERO).await;
            return Err(anyhow::anyhow!(
                "could not listen on `{addr}`: {err}\nhint: check that the address is free (another agent on that port?) and that this user may bind it"
            ));
        }
    };
    let bound = listener.local_addr().unwrap_or(addr);
    release_startup_pages();
    let router = snakebox_wire::agent::router(
        EngineHandle::from(Arc::clone(&engine)),
        check,
        Some(Arc::new(snakebox_http::render_metrics)),
    );
    tracing::info!(%bound, agent = %name, "snakebox agent serving the engine at http://{bound}");
    let stop = CancellationToken::new();
    let mut serving = tokio::spawn(snakebox_wire::agent::serve(listener, router, stop.clone()));
    let reason = tokio::select! {
        reason = stop_signal() => reason,
        served = &mut serving => {
            engine.shutdown(StopReason::Requested, Duration::ZERO).await;
            return Err(match served {
                Ok(Ok(())) => anyhow::anyhow!("the agent's server stopped by itself"),
                Ok(Err(err)) => anyhow::anyhow!(err).context("the agent's server failed"),
                Err(join) => anyhow::anyhow!(join).context("the agent's server failed"),
            });
        }
    };
    engine.begin_shutdown(reason);
    let cut_short = engine.wait_idle(DRAIN).await;
    if cut_short > 0 {
        tracing::warn!(cut_short, "calls still running after the drain deadline");
    }
    stop.cancel();
    if tokio::time::timeout(DRAIN, &mut serving).await.is_err() {
        serving.abort();
    }
    release(&engine, reason, Duration::ZERO, TEARDOWN).await;
    Ok(ExitCode::SUCCESS)
}

/// Start-up is over: its code need not stay resident (see [`crate::memory`]).
fn release_startup_pages() {
    let released = crate::memory::release_startup_pages();
    tracing::debug!(released, "start-up code pages released");
}

/// The end of either face: the engine's shutdown (calls get `drain` to return), bounded by
/// `bound`; past it, or on a second stop signal, the release is forced.
async fn release(engine: &Engine, reason: StopReason, drain: Duration, bound: Duration) {
    tokio::select! {
        finished = tokio::time::timeout(bound, engine.shutdown(reason, drain)) => {
            if finished.is_err() {
                tracing::warn!("shutdown took too long; forcing the release");
                engine.release_host();
            }
        }
        again = stop_signal() => {
            tracing::warn!(?again, "second stop request; forcing the release");
            engine.release_host();
        }
    }
}

/// An error with its causes on one line, then a `hint:` line.
fn with_hint(err: &dyn std::error::Error, hint: &str) -> anyhow::Error {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    anyhow::anyhow!("{text}\nhint: {hint}")
}

/// `snakebox keys add | list | revoke`: the HTTP face's API keys, in the data directory.
pub(crate) fn keys(args: &KeysArgs) -> anyhow::Result<ExitCode> {
    let Some(engine) = args.action.engine() else {
        return front_keypair(&args.action);
    };
    let config = settings::resolve(engine)?;
    let failed = |err: snakebox_http::KeyError| with_hint(&err, &err.hint());
    // The configured store: the data directory's, or the deployment's database.
    let database = config.engine.database.as_ref();
    let store = snakebox_http::KeyStore::open(database, &config.engine.data_dir).map_err(failed)?;
    // Reading keys never creates a data directory: a mistyped --data-dir is said, not made.
    let data_dir = &config.engine.data_dir;
    if database.is_none() && !matches!(args.action, KeysAction::Add { .. }) && !data_dir.exists() {
        anyhow::bail!(
            "the data directory `{}` does not exist, so it holds no keys\nhint: check --data-dir (`SNAKEBOX_DATA_DIR`, `[server] data_dir`); the server's is shown by `snakebox check`",
            data_dir.display()
        );
    }
    match &args.action {
        KeysAction::Add { tenant, .. } => {
            let made = store.add(tenant).map_err(failed)?;
            eprintln!(
                "made key {} for tenant `{}`; it is shown once, below: clients send it as `Authorization: Bearer <key>`",
                made.info.id, made.info.tenant
            );
            println!("{}", made.key);
        }
        KeysAction::List { json, .. } => {
            let keys = store.list().map_err(failed)?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&keys)?);
            } else if keys.is_empty() {
                println!("no keys (make one with `snakebox keys add --tenant NAME`)");
            } else {
                for key in keys {
                    let state = key
                        .revoked_at
                        .map_or_else(|| "live".to_owned(), |at| format!("revoked at {at}"));
                    println!(
                        "{}  {}  tenant={}  created at {}  {state}",
                        key.id, key.masked, key.tenant, key.created_at
                    );
                }
            }
        }
        KeysAction::Revoke { id, .. } => {
            let key = store.revoke(id).map_err(failed)?;
            println!("revoked {} ({}, tenant {})", key.id, key.masked, key.tenant);
        }
        KeysAction::FrontKeypair { .. } => return front_keypair(&args.action),
    }
    Ok(ExitCode::SUCCESS)
}

/// `snakebox client-config CLIENT [--http URL [--key KEY | --no-key]]`: the snippet on stdout
/// (so it can be piped or pasted), where it goes on stderr.
pub(crate) fn client_config(args: &ClientConfigArgs) -> anyhow::Result<ExitCode> {
    use snakebox_http::clients::{Client, Connection, config};
    let client = Client::from_id(&args.client).map_err(|err| {
        anyhow::anyhow!("{err}\nhint: `snakebox client-config claude-code` prints Claude Code's")
    })?;
    let binary;
    let placeholder = "sbx_…";
    let connection = match &args.http {
        None => {
            binary = std::env::current_exe()
                .and_then(|path| path.canonicalize())
                .context("could not find this binary's own path")?;
            Connection::Stdio { binary: &binary }
        }
        Some(url) => {
            let base = url.trim_end_matches('/');
            let base = base.strip_suffix("/mcp").unwrap_or(base);
            if !(base.starts_with("http://") || base.starts_with("https://")) {
                anyhow::bail!(
                    "`--http {url}` is not an http:// or https:// URL\nhint: give the server's base URL, such as https://sb.example.com or http://127.0.0.1:8000"
                );
            }
            let key = match (&args.key, args.no_key) {
                (Some(key), _) => Some(key.as_str()),
                (None, true) => None,
                (None, false) => {
                    eprintln!(
                        "# replace {placeholder} with an API key (`snakebox keys add --tenant NAME`), or pass --key KEY (--no-key for a server without keys)"
                    );
                    Some(placeholder)
                }
            };
            Connection::Http { base, key }
        }
    };
    let made = config(client, connection);
    if made.place == "a shell" {
        eprintln!("# {}: run this", made.name);
    } else {
        eprintln!("# {}: put this in {}", made.name, made.place);
    }
    println!("{}", made.text);
    Ok(ExitCode::SUCCESS)
}

/// `snakebox keys front-keypair --out DIR`: the key pair of a front and its engine agents.
fn front_keypair(action: &KeysAction) -> anyhow::Result<ExitCode> {
    let KeysAction::FrontKeypair { out } = action else {
        anyhow::bail!("not `keys front-keypair`");
    };
    let (private, public) =
        snakebox_wire::write_keypair(out).map_err(|err| with_hint(&err, err.hint()))?;
    println!(
        "wrote {} (the front's private key: give it to the fronts only, as --front-key)",
        private.display()
    );
    println!(
        "wrote {} (its public key: give it to every agent, as --front-public-key)",
        public.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `90s`, `30m`, `12h`, `7d` as milliseconds.
fn parse_since(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => 0,
    };
    match number.parse::<u64>() {
        Ok(n) if seconds > 0 => Ok(n.saturating_mul(seconds).saturating_mul(1000)),
        _ => Err(anyhow::anyhow!(
            "`--since {text}` is not a duration\nhint: write a number and a unit: `90s`, `30m`, `12h` or `7d`"
        )),
    }
}

/// One call of the audit log: its `started` line merged with its `finished` line.
#[derive(Debug, serde::Serialize)]
struct AuditedCall {
    #[serde(flatten)]
    entry: snakebox_engine::AuditEntry,
    /// When it started, in milliseconds since the Unix epoch (its `started` line's time).
    started_at_ms: Option<u64>,
    /// When it finished (its `finished` line's time).
    finished_at_ms: Option<u64>,
}

/// A filter's value, when given, must be one of `allowed`; refused otherwise, listing them.
fn one_of(flag: &str, value: Option<&str>, what: &str, allowed: &[&str]) -> anyhow::Result<()> {
    match value {
        Some(value) if !allowed.contains(&value) => Err(anyhow::anyhow!(
            "`{flag} {value}` is not {what}\nhint: use one of: {}",
            allowed.join(", ")
        )),
        _ => Ok(()),
    }
}

/// `snakebox audit`: the calls of the audit log that match, oldest first.
pub(crate) fn audit(args: &AuditArgs) -> anyhow::Result<ExitCode> {
    let kinds: Vec<&str> = snakebox_engine::EventKind::ALL
        .iter()
        .map(|kind| kind.as_str())
        .collect();
    one_of(
        "--event",
        args.event.as_deref(),
        "a kind of security event",
        &kinds,
    )?;
    let statuses: Vec<&str> = snakebox_engine::Status::ALL
        .iter()
        .map(|status| status.as_str())
        .chain(["running", "refused"])
        .collect();
    one_of(
        "--status",
        args.status.as_deref(),
        "a status of a call",
        &statuses,
    )?;
    let since = args.since.as_deref().map(parse_since).transpose()?;
    let config = settings::resolve(&args.engine)?;
    let data_dir = &config.engine.data_dir;
    let (entries, bad) = match config.engine.database.as_ref() {
        // The deployment's database: every front's lines.
        Some(url) => snakebox_engine::shared::PgStore::open(url)
            .and_then(|store| snakebox_engine::read_audit_table(&store))
            .map_err(|err| with_hint(&err, &err.hint()))?,
        None => snakebox_engine::read_audit(data_dir).map_err(|err| {
            with_hint(
                &err,
                &format!(
                    "the log is {}/{}/ and private to the server's user: run this as that user",
                    data_dir.display(),
                    snakebox_engine::AUDIT_DIR
                ),
            )
        })?,
    };
    let mut order: Vec<String> = Vec::new();
    let mut calls: std::collections::HashMap<String, AuditedCall> =
        std::collections::HashMap::new();
    for entry in entries {
        let at = entry.at_ms;
        // A `call` line (a tool that runs no code) is a whole call by itself.
        let started = entry.phase == "started" || entry.phase == "call";
        match calls.get_mut(&entry.execution_id) {
            Some(call) if !started => {
                call.finished_at_ms = Some(at);
                let merged = &mut call.entry;
                merged.phase = entry.phase;
                merged.status = entry.status;
                merged.duration_ms = entry.duration_ms;
                merged.setup_ms = entry.setup_ms;
                merged.exit_code = entry.exit_code;
                merged.python_version = entry.python_version;
                merged.resource_usage = entry.resource_usage;
                merged.events = entry.events;
                merged.profile = entry.profile;
            }
            _ => {
                order.push(entry.execution_id.clone());
                calls.insert(
                    entry.execution_id.clone(),
                    AuditedCall {
                        started_at_ms: started.then_some(at),
                        finished_at_ms: (!started).then_some(at),
                        entry,
                    },
                );
            }
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let matching: Vec<&AuditedCall> = order
        .iter()
        .filter_map(|id| calls.get(id))
        .filter(|call| {
            let entry = &call.entry;
            let status = entry.status.as_deref().unwrap_or("running");
            args.tenant.as_ref().is_none_or(|t| &entry.tenant == t)
                && args.status.as_ref().is_none_or(|s| s == status)
                && args
                    .event
                    .as_ref()
                    .is_none_or(|kind| entry.events.iter().any(|e| e.kind.as_str() == kind))
                && since.is_none_or(|window| {
                    let at = call.started_at_ms.or(call.finished_at_ms).unwrap_or(0);
                    at.saturating_add(window) >= now
                })
        })
        .collect();
    let shown = &matching[matching.len().saturating_sub(args.limit)..];
    let mut out = std::io::stdout().lock();
    for call in shown {
        if args.json {
            writeln!(out, "{}", serde_json::to_string(call)?)?;
            continue;
        }
        let entry = &call.entry;
        let at = call.started_at_ms.or(call.finished_at_ms).unwrap_or(0) / 1000;
        let status = entry.status.as_deref().unwrap_or("running");
        let duration = entry
            .duration_ms
            .map_or_else(String::new, |ms| format!(" {ms} ms"));
        let code = entry
            .code_sha256
            .as_deref()
            .map_or_else(String::new, |hash| {
                format!(
                    " code {}… ({} B)",
                    &hash[..hash.len().min(12)],
                    entry.code_bytes.unwrap_or(0)
                )
            });
        let events = if entry.events.is_empty() {
            String::new()
        } else {
            let kinds: Vec<&str> = entry.events.iter().map(|e| e.kind.as_str()).collect();
            format!(" events: {}", kinds.join(", "))
        };
        // A refused call: what was sent, by size and hash only.
        let sent = entry
            .request_bytes
            .map_or_else(String::new, |bytes| format!(" sent {bytes} B"));
        let kind = entry.tool.as_deref().unwrap_or(&entry.kind);
        let profile = entry
            .profile
            .as_deref()
            .map_or_else(String::new, |profile| format!(" profile {profile}"));
        writeln!(
            out,
            "{}  {}  {}  {kind}  {status}{duration}{profile}{code}{sent}{events}",
            snakebox_engine::utc_text(at),
            entry.execution_id,
            entry.tenant,
        )?;
    }
    if !args.json && shown.is_empty() {
        writeln!(
            out,
            "no calls match (the audit log is under {}/{}/)",
            data_dir.display(),
            snakebox_engine::AUDIT_DIR
        )?;
    }
    if bad > 0 {
        eprintln!(
            "note: {bad} line(s) of the audit log could not be read (cut by a full disk?) and were skipped"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGTERM (systemd, Docker) or SIGINT (Ctrl-C); never when neither can be watched.
async fn stop_signal() -> StopReason {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot watch SIGTERM/SIGINT; stop the server by closing its input");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = terminate.recv() => StopReason::Terminate,
        _ = interrupt.recv() => StopReason::Interrupt,
    }
}

/// `snakebox run FILE`: the script's output on our stdout/stderr, its exit code as ours.
/// Limits map to conventional codes: timeout 124, memory/CPU limit 137, cancelled 130,
/// death by a signal 128 + its number, setup failure or invalid request 2.
pub(crate) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let script = if args.file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("could not read the script from standard input (is it UTF-8?)")?;
        text
    } else {
        let bytes = fs_err::read(&args.file)?;
        String::from_utf8(bytes).with_context(|| {
            format!(
                "`{}` is not UTF-8 text\nhint: save the script as UTF-8",
                args.file.display()
            )
        })?
    };
    let config = settings::resolve(&args.engine)?.engine;
    reach_database(&config).await?;
    let engine = Engine::new(config).await;
    fail_on_unreachable_database(&engine)?;
    fail_on_bad_default_python(&engine).await?;
    let cancel = CancellationToken::new();
    let on_interrupt = cancel.clone();
    // SIGINT or SIGTERM kills the run (its output so far is printed; exit code 130).
    tokio::spawn(async move {
        stop_signal().await;
        on_interrupt.cancel();
    });
    let result = engine
        .execute(
            &snakebox_engine::Caller::local(),
            ExecuteRequest {
                script,
                dependencies: args.deps,
                timeout_seconds: args.timeout.map(|seconds| seconds as f64),
                python_version: args.engine.python.python_version.clone(),
                ..ExecuteRequest::default()
            },
            cancel,
            None,
        )
        .await;
    engine.release_host();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(result.stdout.as_bytes())?;
        stdout.flush()?;
        let mut stderr = std::io::stderr().lock();
        stderr.write_all(result.stderr.as_bytes())?;
        if let Some(error) = &result.error {
            writeln!(
                stderr,
                "snakebox: {}: {}",
                result.status.as_str(),
                as_flags(&error.message)
            )?;
            if let Some(hint) = &error.hint {
                writeln!(stderr, "hint: {}", as_flags(hint))?;
            }
        }
        for note in &result.notes {
            writeln!(stderr, "snakebox: note: {}", as_flags(note))?;
        }
    }
    let code: u8 = match result.status {
        Status::Ok => 0,
        Status::Error => result
            .exit_code
            .or(result.signal.map(|signal| 128 + signal))
            .and_then(|code| u8::try_from(code).ok())
            .unwrap_or(1),
        Status::Timeout => 124,
        Status::MemoryLimit | Status::CpuLimit => 137,
        Status::Cancelled => 130,
        Status::SetupFailed | Status::InvalidRequest => 2,
    };
    Ok(ExitCode::from(code))
}

/// The engine's messages name a call's arguments; `snakebox run` takes them as flags.
fn as_flags(text: &str) -> String {
    text.replace("timeout_seconds", "--timeout")
        .replace("python_version", "--python-version")
}

/// `snakebox check`: the environment report; exit 1 when executions cannot run.
/// A server whose default Python is not here would fail every call: refuse to start, saying
/// which setting to fix (`check` reports it as a problem instead).
/// With `python_downloads = "automatic"` a missing default is downloaded first.
async fn fail_on_bad_default_python(engine: &Engine) -> anyhow::Result<()> {
    let provided = engine.provide_default_python().await;
    provided
        .and_then(|()| engine.check_default_python())
        .map_err(|err| {
            engine.release_host();
            match err.hint {
                Some(hint) => anyhow::anyhow!("{}\nhint: {hint}", err.message),
                None => anyhow::anyhow!("{}", err.message),
            }
        })
}

/// `--database`, connected to before the engine takes anything of the host (a server that
/// will not start must leave no mount behind): the reason and a hint when it cannot be used.
/// The engine then gets the same connections (one pool per process and URL).
async fn reach_database(config: &snakebox_engine::EngineConfig) -> anyhow::Result<()> {
    let Some(url) = config.database.clone() else {
        return Ok(());
    };
    let opened =
        tokio::task::spawn_blocking(move || snakebox_engine::shared::PgStore::open(&url)).await?;
    opened.map(drop).map_err(|err| with_hint(&err, &err.hint()))
}

/// A server told to share a database (`--database`) that cannot use it does not start: its
/// keys and its runs would silently be another store's.
fn fail_on_unreachable_database(engine: &Engine) -> anyhow::Result<()> {
    if engine.config().database.is_none() || engine.shared_store().is_some() {
        if let Some(store) = engine.shared_store() {
            tracing::info!(store = %store.describe(), "keys, runs and audit are in this store");
        }
        return Ok(());
    }
    match engine.store_problem() {
        Some(err) => match &err.hint {
            Some(hint) => anyhow::bail!("{}\nhint: {hint}", err.message),
            None => anyhow::bail!("{}", err.message),
        },
        None => anyhow::bail!("the database (--database) cannot be used"),
    }
}

pub(crate) async fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let config = settings::resolve(&args.engine)?.engine;
    let engine = Engine::new(config).await;
    let report = engine.report();
    // Where keys, runs and audit are: the operator's to see (never a password), not in the
    // report tenants read through `check_environment`.
    let store = match (engine.shared_store(), &engine.config().database) {
        (Some(store), _) => store.describe(),
        (None, Some(url)) => format!("postgresql {} (NOT reachable)", url.redacted()),
        (None, None) => "NOT available".into(),
    };
    engine.release_host();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report, &store);
    }
    Ok(if report.ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `snakebox image build | status`: the docker backend's run image (see
/// `snakebox_sandbox::RunImage`), in the engine at `DOCKER_HOST` or the default socket.
pub(crate) async fn image(args: &ImageArgs) -> anyhow::Result<ExitCode> {
    let image = snakebox_sandbox::RunImage::for_host();
    let socket = snakebox_sandbox::docker_socket();
    let hinted = |err: snakebox_sandbox::DockerError| {
        let mut text = err.to_string();
        if let Some(source) = std::error::Error::source(&err) {
            text.push_str(&format!(": {source}"));
        }
        if let Some(hint) = err.hint() {
            text.push_str(&format!("\nhint: {hint}"));
        }
        anyhow::anyhow!(text)
    };
    match args.action {
        ImageAction::Build => {
            let built = image.build(&socket).await.map_err(hinted)?;
            if built {
                println!(
                    "built {} ({} bytes imported into the engine at {socket})",
                    image.tag(),
                    image.archive_bytes()
                );
            } else {
                println!("{} is already in the engine at {socket}", image.tag());
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageAction::Status => {
            if image.exists(&socket).await.map_err(hinted)? {
                println!("{} is in the engine at {socket}", image.tag());
                Ok(ExitCode::SUCCESS)
            } else {
                println!(
                    "{} is missing from the engine at {socket}\nhint: build it with `snakebox image build`",
                    image.tag()
                );
                Ok(ExitCode::from(1))
            }
        }
    }
}

fn print_report(report: &EnvironmentReport, store: &str) {
    println!("snakebox {}", report.snakebox_version);
    println!("platform:  {}", report.platform);
    println!(
        "sandbox:   {} (isolation {})",
        report.sandbox_backend,
        if report.isolation_active {
            "active"
        } else {
            "OFF"
        }
    );
    for detail in &report.sandbox_details {
        println!("           {detail}");
    }
    if let Some(hint) = &report.sandbox_hint {
        println!("hint: {hint}");
    }
    println!("network:   {}", if report.network { "on" } else { "off" });
    println!("store:     {store}");
    println!("uv:        {}", report.uv);
    if let Some(hint) = &report.uv_hint {
        println!("hint: {hint}");
    }
    println!("python:    default {}", report.default_python);
    for python in &report.pythons {
        println!(
            "           {} {} ({})",
            python.version, python.path, python.source
        );
    }
    println!(
        "           downloads: {}",
        match report.python_downloads {
            snakebox_engine::PythonDownloads::Automatic =>
                "automatic (a missing version is fetched with uv when a call asks for it)",
            snakebox_engine::PythonDownloads::Never =>
                "never (add a version with `snakebox python install 3.14`)",
        }
    );
    println!("timeouts:  {}", report.timeouts);
    println!("limits:");
    for limit in &report.limits {
        println!(
            "  {:<13} {:<12} {} — {}",
            limit.name,
            limit.value,
            if limit.enforced {
                "enforced"
            } else {
                "NOT enforced"
            },
            limit.mechanism
        );
    }
    println!(
        "cache:     {} ({} environments, {} bytes)",
        report.cache.location, report.cache.environments, report.cache.size_bytes
    );
    println!("           {}", report.cache.retention);
    let pool = &report.warm_pool;
    if pool.size == 0 {
        println!("warm pool: off");
    } else if pool.active {
        println!(
            "warm pool: {} ready of {} ({} served warm, {} cold starts)",
            pool.ready, pool.size, pool.served, pool.cold_starts
        );
    } else {
        println!(
            "warm pool: {} sandboxes (started by `snakebox serve`)",
            pool.size
        );
    }
    if let Some(error) = &pool.last_error {
        println!("           last error: {error}");
    }
    if pool.fork_servers > 0 {
        println!(
            "fork servers: {} ({} runs forked)",
            pool.fork_servers, pool.forked
        );
    }
    if let Some(error) = &pool.fork_server_error {
        println!("fork server: last start failed: {error}");
    }
    let sessions = &report.sessions;
    if sessions.available {
        println!(
            "sessions:  {} of {} ({} interpreters running of {}; {} of {} bytes of disk) in {}",
            sessions.count,
            sessions.max_sessions,
            sessions.running_interpreters,
            sessions.max_running_interpreters,
            sessions.used_disk_bytes,
            sessions.max_disk_bytes,
            sessions.location
        );
        println!(
            "           idle interpreters stop after {} s; idle sessions are deleted after {} s",
            sessions.idle_stop_seconds, sessions.idle_delete_seconds
        );
        println!("           disk: {}", sessions.disk_quota);
    } else {
        println!(
            "sessions:  unavailable{}",
            sessions
                .problem
                .as_deref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default()
        );
    }
    println!("artifacts: {}", report.artifacts.location);
    println!("           {}", report.artifacts.retention);
    println!(
        "profiles:  {} by default (a call names another with `profile`)",
        report.default_profile
    );
    for profile in &report.profiles {
        println!("  {}: {}", profile.name, profile.description);
        for decision in &profile.enforces {
            println!("           {decision}");
        }
    }
    if report.ready {
        println!("ready:     yes");
    } else {
        println!("ready:     NO");
        for problem in &report.problems {
            println!("  - {problem}");
        }
    }
}

/// `snakebox python install VERSION`: `uv python install` with the server's uv and
/// environment (`UV_PYTHON_INSTALL_MIRROR` passed through), into uv's Python directory, then
/// the interpreters found as the server finds them, to show it is there.
pub(crate) async fn python(args: PythonCommandArgs) -> anyhow::Result<ExitCode> {
    let PythonAction::Install { version, engine } = args.action;
    let config = settings::resolve(&engine)?.engine;
    let with_hint = |err: snakebox_env::EnvError| {
        let hint = err.hint();
        let mut text = format!("{err}");
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        if let Some(hint) = hint {
            text.push_str(&format!("\nhint: {hint}"));
        }
        anyhow::anyhow!(text)
    };
    let uv = snakebox_env::Uv::locate(config.uv_path.as_deref()).map_err(with_hint)?;
    eprintln!("installing Python {version} with uv {}", uv.version);
    let said = snakebox_env::install_python(&uv, &version)
        .await
        .map_err(with_hint)?;
    if !said.is_empty() {
        eprintln!("{said}");
    }
    let interpreters = snakebox_env::Interpreters::discover(&uv).await;
    match interpreters.find(&version) {
        Ok(found) => {
            println!(
                "Python {} is ready: {} ({}); snakebox uses it for calls that ask for `{version}`",
                found.version,
                found.executable.display(),
                found.source
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => Err(anyhow::anyhow!(
            "uv installed Python {version}, but snakebox does not find it: {err}\nhint: check `uv python dir` (snakebox looks where uv installs for this user: HOME={})",
            std::env::var("HOME").unwrap_or_default()
        )),
    }
}
